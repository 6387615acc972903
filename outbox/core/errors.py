"""The exceptions `outbox` raises. Every one is an `OutboxError`."""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error raised by outbox."""


class InvalidTopic(OutboxError, ValueError):
    """A topic name Kafka would refuse."""


class InvalidKey(OutboxError, ValueError):
    """A message key that is not str, bytes or None."""


class InvalidHeaders(OutboxError, ValueError):
    """Headers that are not a mapping of str to str or bytes, or that use a reserved name."""


class SerializationError(OutboxError, ValueError):
    """A payload the serializer cannot encode (or a stored payload it cannot decode)."""


class PayloadTooLarge(OutboxError, ValueError):
    """An encoded payload above the configured size limit."""


class DuplicateMessageId(OutboxError, ValueError):
    """A message id that a message still waiting in `producer_queue` has: nothing was written,
    and the caller's transaction can go on."""


class InvalidDueTime(OutboxError, ValueError):
    """A `deliver_at` or `delay` that cannot say when a message is due: naive, negative, both
    given, or out of range. Nothing was written."""


class UnsupportedTransaction(OutboxError, TypeError):
    """`tx` is not a connection or session that outbox can write with."""


class NotInTransaction(OutboxError):
    """`tx` is in autocommit mode outside a transaction block, or its transaction has failed."""


class ConfigurationError(OutboxError, ValueError):
    """A configuration value that is missing or invalid; the message names it."""


class SchemaNotMigrated(OutboxError):
    """The database has no outbox schema, or an older one: run `outbox migrate`."""


class SchemaTooNew(OutboxError):
    """The database was migrated by a newer version of outbox than this one."""


class DatabaseUnavailable(OutboxError):
    """PostgreSQL cannot be reached with the given URL."""


class KafkaUnavailable(OutboxError):
    """No Kafka broker answered at the given bootstrap address."""


class Misused(Exception):
    """A callback left the transaction it was given unusable: it closed the connection, ended
    the transaction itself (COMMIT or ROLLBACK) or went on after one of its statements failed.
    Its message fails like any callback error; the other messages of the transaction are
    handled again in a new one."""


class PermanentFailure(OutboxError):
    """Raised by a handler's callback: no attempt at this message can succeed (an HTTP
    endpoint answered 404, say), so it is dead at once, this error recorded, not retried."""


class RetryLater(OutboxError):
    """Raised by a handler's callback: a failure a later attempt can fix, not sooner than
    `after` seconds (an HTTP `Retry-After`); the handler's backoff decides when `after` is None
    or shorter, and its maximum bounds `after`."""

    def __init__(self, message: str, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after
