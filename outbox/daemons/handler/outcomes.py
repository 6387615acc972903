"""What became of each message, counted and logged: handled, failed, dead, past its lease.

Shared by the runner and the workers (thread-safe). The counts are for logs and tests; the
tally feeds the metrics and the log line of each batch.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from outbox.core.envelope import InboxMessage
from outbox.core.handlers import Handlers, HandlerSpec
from outbox.core.inbox_rows import Claimed, FailedAttempt, Pending, decode, decode_many
from outbox.daemons.handler.failures import described, failed_attempt, unregistered
from outbox.observability.metrics import HandlerTally, HandlerTallyBook

log = logging.getLogger("outbox.handler")


class Outcomes:
    """The outcomes of one Handler process."""

    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers
        self._lock = threading.Lock()
        self._tally = HandlerTallyBook()
        self.handled = 0
        self.failed = 0
        self.dead = 0
        self.lease_expired = 0
        #: Rows whose callback overran its lease: their next attempt runs in a transaction of
        #: its own, after the other rows of its group, so that a callback that hangs again
        #: does not roll back (and hold up by a lease) the other keys batched with it.
        self.alone: set[int] = set()

    def message(self, claimed: Claimed) -> InboxMessage[Any]:
        """The message a callback receives; `Undecodable` if its payload cannot be decoded or
        does not validate against its handler's payload type."""
        spec = self.handlers.get(claimed.topic)
        payload_type = spec.payload_type if spec is not None else None
        return decode(claimed, self.handlers.serializer, payload_type)

    def messages(
        self, claimed: list[Claimed], spec: HandlerSpec
    ) -> tuple[list[InboxMessage[Any]], Exception | None]:
        """The messages of a batch for `spec`'s callback, built in one pass: all of them and
        None, or those before the first that cannot be built (as `message` raises) and its
        error."""
        return decode_many(claimed, self.handlers.serializer, spec.payload_type)

    def count_handled(self, callbacks: list[tuple[str, float]]) -> None:
        """Count committed callbacks, given as (topic, seconds)."""
        with self._lock:
            self.handled += len(callbacks)
        self._tally.handled(callbacks)

    def no_handler(self, row: Pending) -> FailedAttempt:
        """A row of an unregistered topic: dead at once, counted and logged."""
        with self._lock:
            self.dead += 1
        self._tally.failed(row.topic, dead=True)
        log.error(
            "message row %d: no handler registered for topic %r",
            row.id,
            row.topic,
            extra={"topic": row.topic},
        )
        return unregistered(row, self.handlers.topics)

    def failure(
        self,
        row: Pending,
        spec: HandlerSpec | None,
        claimed: Claimed | None,
        exc: BaseException,
        attempts: int | None = None,
    ) -> FailedAttempt:
        """What a failed attempt records (failures.py), counted and logged. `attempts`, the
        row's attempts before this one, is the claimed row's unless given."""
        if attempts is None:
            attempts = claimed.attempts if claimed is not None else 0
        failed = failed_attempt(row, spec, exc, attempts)
        with self._lock:
            self.failed += 1
            if failed.dead:
                self.dead += 1
        self._tally.failed(row.topic, dead=failed.dead)
        message_id = str(claimed.message_id) if claimed is not None else None
        log.warning(
            "message %s (row %d) topic %r attempt %d/%d failed%s: %s",
            message_id,
            row.id,
            row.topic,
            attempts + 1,
            spec.max_attempts if spec is not None else 1,
            " (now dead)" if failed.dead else f" (retry in {failed.delay:.1f}s)",
            described(exc),
            extra={"message_id": message_id, "topic": row.topic},
        )
        return failed

    def expired(self, row: Pending) -> None:
        """Count a callback that overran its lease (its failure is counted by `failure`)."""
        with self._lock:
            self.lease_expired += 1
            self.alone.add(row.id)
        self._tally.lease_expired(row.topic)

    def take_tally(self) -> HandlerTally:
        """The tally since the last call (for the batch's metrics and log line)."""
        return self._tally.take()
