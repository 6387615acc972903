"""`Broker`: the one object a service uses to send messages inside its own transactions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, overload
from uuid import UUID

from outbox import tracing
from outbox.core.databases import validate_name, validate_schema
from outbox.core.envelope import DEFAULT_MAX_MESSAGE_BYTES, OutgoingMessage, compose
from outbox.core.errors import ConfigurationError, InvalidHeaders, OutboxError
from outbox.core.headers import TENANT_HEADER, validate_tenant_header
from outbox.core.numbers import check
from outbox.core.schedule import Due, due
from outbox.core.serializers import JsonSerializer, Serializer
from outbox.core.topics import Topic

P = TypeVar("P")

#: The old name of `DEFAULT_MAX_MESSAGE_BYTES` (the limit now bounds the whole Kafka record).
DEFAULT_MAX_PAYLOAD_BYTES = DEFAULT_MAX_MESSAGE_BYTES


@dataclass(frozen=True, slots=True)
class Message:
    """One message for `send_many`: the same fields `send` takes."""

    topic: str | Topic[Any]
    payload: Any
    key: str | bytes | None = None
    headers: Mapping[str, str | bytes] | None = None
    message_id: UUID | str | None = None
    correlation_id: UUID | str | None = None
    tenant: str | None = None
    #: When it is due (an aware datetime), or `delay` after the send: see `Broker.send`.
    deliver_at: datetime | None = None
    delay: timedelta | None = None


class Broker:
    """Writes messages to `producer_queue` with the caller's connection, in its transaction.

    `send` never commits and never opens a connection: the message exists if and only if the
    caller's transaction commits. A Producer relay (`outbox producer`) then sends it to Kafka.

    `max_message_bytes` bounds the Kafka record the relay will produce for a message: key,
    encoded payload, and every header name and value (outbox's own too: message id, created-at,
    content-type, correlation and causation ids, trace context) with 10 bytes of framing each
    (`outbox.core.envelope.record_size`). A larger message raises `PayloadTooLarge` before
    anything is written. The default, 999,872 bytes, is librdkafka's default
    `message.max.bytes` (1,000,000) less a 128-byte margin for Kafka's record and batch
    framing, so that every message `send` accepts can be delivered with default settings;
    raise it only together with `message.max.bytes` (`--kafka-config`) and the topic's
    `max.message.bytes`. `max_payload_bytes` is the old name of the same limit, kept as an
    alias: it now bounds the whole record, not only the payload.

    `tenant` names the tenant (the database NAME of `outbox consumer --database-url
    NAME=URL`) whose inbox receives every message of this broker: it is sent in the header
    `tenant_header` (default `outbox-tenant`, the consumer's `--route-header`); `send(...,
    tenant=...)` overrides it for one message. A tenant that is not a valid database name
    raises before anything is written.
    """

    def __init__(
        self,
        *,
        schema: str = "outbox",
        serializer: Serializer | None = None,
        max_message_bytes: int | None = None,
        max_payload_bytes: int | None = None,
        tenant: str | None = None,
        tenant_header: str = TENANT_HEADER,
    ) -> None:
        self.schema = validate_schema(schema)
        self.tenant_header: str = validate_tenant_header(tenant_header)
        self.tenant: str | None = None if tenant is None else _tenant(tenant, ConfigurationError)
        self.serializer: Serializer = serializer or JsonSerializer()
        if max_message_bytes is not None and max_payload_bytes is not None:
            raise ConfigurationError(
                "give max_message_bytes or its old name max_payload_bytes, not both"
            )
        if max_payload_bytes is not None:
            check("max_payload_bytes", max_payload_bytes, "count")
            limit = max_payload_bytes
        else:
            limit = DEFAULT_MAX_MESSAGE_BYTES if max_message_bytes is None else max_message_bytes
            check("max_message_bytes", limit, "count")
        self.max_message_bytes: int = limit
        # The driver's writer is imported with the first Broker: `import outbox` (and a daemon)
        # loads no database driver.
        from outbox.postgres.writer import Writer

        self._writer = Writer(self.schema)

    @property
    def max_payload_bytes(self) -> int:
        """The old name of `max_message_bytes`."""
        return self.max_message_bytes

    def _compose(
        self,
        topic: object,
        payload: object,
        key: object,
        headers: object,
        message_id: object,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
    ) -> OutgoingMessage:
        """Validate and encode; add the trace context, the tenant header (`tenant`, else the
        broker's) and, inside a handler, the causation.

        With a `Topic`: the payload must be of its type, and the key is the one it derives
        unless `key` is given."""
        if isinstance(topic, Topic):
            topic.check(payload)
            if topic.content_type != self.serializer.content_type and not isinstance(
                payload, bytes | bytearray | memoryview | str
            ):
                raise ConfigurationError(
                    f"topic {topic.name!r} is declared {topic.content_type!r}, but this "
                    f"Broker's serializer writes {self.serializer.content_type!r}"
                )
            if key is None:
                key = topic.key_of(payload)
            topic = topic.name
        correlation, causation = tracing.inherited_ids(correlation_id)
        context = tracing.context_headers(headers)
        if tenant is not None or self.tenant is not None:
            context = self._with_tenant(tenant, headers, context)
        return compose(
            topic,
            payload,
            key=key,
            headers=headers,
            message_id=message_id,
            serializer=self.serializer,
            max_message_bytes=self.max_message_bytes,
            correlation_id=correlation,
            causation_id=causation,
            context_headers=context,
        )

    def _with_tenant(
        self, tenant: str | None, headers: object, context: dict[str, str] | None
    ) -> dict[str, str]:
        """`context` with the tenant header: `tenant` (checked) else the broker's. The user's
        headers may not name it too (which one would route?)."""
        name = self.tenant_header
        chosen = self.tenant if tenant is None else _tenant(tenant, InvalidHeaders)
        assert chosen is not None
        if isinstance(headers, Mapping) and name in headers:
            raise InvalidHeaders(
                f"header {name!r} carries the tenant: give the tenant as tenant=..., not in headers"
            )
        return {**(context or {}), name: chosen}

    def _compose_many(
        self, messages: Iterable[Message]
    ) -> tuple[list[OutgoingMessage], list[Due | None] | None]:
        """The messages composed, and their due times (None when none has one)."""
        result = []
        dues: list[Due | None] = []
        for index, m in enumerate(messages):
            if not isinstance(m, Message):
                raise OutboxError(
                    f"send_many item {index} is a {type(m).__name__}, expected outbox.Message"
                )
            try:
                result.append(
                    self._compose(
                        m.topic,
                        m.payload,
                        m.key,
                        m.headers,
                        m.message_id,
                        m.correlation_id,
                        m.tenant,
                    )
                )
                dues.append(due(m.deliver_at, m.delay))
            except OutboxError as exc:
                raise type(exc)(f"send_many item {index}: {exc}") from exc
        ids = [m.message_id for m in result]
        if len(set(ids)) != len(ids):
            raise OutboxError("send_many was given the same message_id twice")
        return result, dues if any(d is not None for d in dues) else None

    @overload
    def send(
        self,
        tx: object,
        topic: Topic[P],
        payload: P,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: UUID | str | None = None,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> UUID: ...

    @overload
    def send(
        self,
        tx: object,
        topic: str,
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: UUID | str | None = None,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> UUID: ...

    def send(
        self,
        tx: object,
        topic: str | Topic[Any],
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: UUID | str | None = None,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> UUID:
        """Write one message in `tx`'s transaction and return its id.

        `payload` is a JSON value, a dataclass or pydantic model (encoded as
        `outbox.core.codecs` says), bytes (sent as they are) or str (UTF-8 text). With a
        `Topic`, the payload must be of its declared type and the key is derived from it
        unless `key` is given; a wrong payload raises before anything is written.

        `message_id` (a new UUIDv7 when None) names the message end to end: the receiving
        inbox keeps one message per id, so a second message sent under an id already used is
        dropped there as a redelivery. While a message with that id still waits in
        `producer_queue`, this raises `DuplicateMessageId` and writes nothing; the caller's
        transaction is not aborted.

        Called from a handler callback, the message inherits the handled message's correlation
        id and gets its id as causation id; `correlation_id` overrides the inherited one.

        `tenant` (else the broker's) names the tenant whose inbox receives the message (see
        `Broker`); an invalid one raises `InvalidHeaders` before anything is written.

        `deliver_at` (an aware datetime, stored as its instant) or `delay` (a timedelta from the
        database's clock when the statement runs, never the client's) makes the message due
        later: it waits, out of the relay's way, until then, and `cancel` can take it back
        meanwhile. One or the other; a naive datetime, a negative delay or both raise
        `InvalidDueTime` before anything is written. A zero delay, or a `deliver_at` that is
        already past, means now (docs/delayed-delivery.md).
        """
        when = due(deliver_at, delay)
        message = self._compose(topic, payload, key, headers, message_id, correlation_id, tenant)
        self._writer.write(tx, [message], None if when is None else [when])
        return message.message_id

    def send_many(self, tx: object, messages: Iterable[Message]) -> list[UUID]:
        """Write a batch of messages in one statement; all are checked before any is written.
        Each `Message` may have its own `deliver_at` or `delay`."""
        batch, dues = self._compose_many(messages)
        self._writer.write(tx, batch, dues)
        return [m.message_id for m in batch]

    def cancel(self, tx: object, message_id: UUID | str) -> bool:
        """Take back a message that has not left, in `tx`'s transaction (never committed here):
        True when it was still scheduled, or waits in producer_queue never attempted while no
        relay owns its lane (it is deleted: once `tx` commits it never leaves; until then no
        relay takes the lane); False when it has left, never existed, or is in the queue of a
        running relay (which may be sending it right now). The handles are those of `send`."""
        return self._writer.cancel(tx, _message_id(message_id))

    async def cancel_async(self, tx: object, message_id: UUID | str) -> bool:
        """`cancel` for asynchronous transaction handles."""
        return await self._writer.cancel_async(tx, _message_id(message_id))

    @overload
    async def send_async(
        self,
        tx: object,
        topic: Topic[P],
        payload: P,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: UUID | str | None = None,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> UUID: ...

    @overload
    async def send_async(
        self,
        tx: object,
        topic: str,
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: UUID | str | None = None,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> UUID: ...

    async def send_async(
        self,
        tx: object,
        topic: str | Topic[Any],
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: UUID | str | None = None,
        correlation_id: UUID | str | None = None,
        tenant: str | None = None,
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> UUID:
        """`send` for psycopg `AsyncConnection` and SQLAlchemy `AsyncConnection`/`AsyncSession`."""
        when = due(deliver_at, delay)
        message = self._compose(topic, payload, key, headers, message_id, correlation_id, tenant)
        await self._writer.write_async(tx, [message], None if when is None else [when])
        return message.message_id

    async def send_many_async(self, tx: object, messages: Iterable[Message]) -> list[UUID]:
        """`send_many` for asynchronous transaction handles."""
        batch, dues = self._compose_many(messages)
        await self._writer.write_async(tx, batch, dues)
        return [m.message_id for m in batch]


def _message_id(message_id: object) -> UUID:
    """`message_id` as a UUID, else `OutboxError` saying what it is."""
    if isinstance(message_id, UUID):
        return message_id
    if isinstance(message_id, str):
        try:
            return UUID(message_id)
        except ValueError:
            pass
    raise OutboxError(f"message_id {message_id!r} is not a UUID (the id send returned)")


def _tenant(tenant: object, error: type[OutboxError]) -> str:
    """`tenant` if it is a valid database NAME, else `error` saying why."""
    try:
        return validate_name(tenant)
    except ConfigurationError:
        raise error(
            f"tenant {tenant!r} is not valid: a tenant is a database NAME (1-63 letters, "
            "digits, '_', '.' or '-', starting with a letter or digit); nothing was written"
        ) from None
