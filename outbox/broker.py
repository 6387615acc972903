"""`Broker`: the one object a service uses to send messages inside its own transactions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from outbox import tracing
from outbox.core.envelope import OutgoingMessage, compose
from outbox.core.errors import OutboxError
from outbox.core.numbers import check
from outbox.core.serializers import JsonSerializer, Serializer
from outbox.postgres import writer
from outbox.postgres.queries import channel, queries, validate_schema

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Message:
    """One message for `send_many`: the same fields `send` takes."""

    topic: str
    payload: Any
    key: str | bytes | None = None
    headers: Mapping[str, str | bytes] | None = None
    message_id: UUID | str | None = None
    correlation_id: UUID | str | None = None


class Broker:
    """Writes messages to `producer_queue` with the caller's connection, in its transaction.

    `send` never commits and never opens a connection: the message exists if and only if the
    caller's transaction commits. A Producer relay (`outbox producer`) then sends it to Kafka.
    """

    def __init__(
        self,
        *,
        schema: str = "outbox",
        serializer: Serializer | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.schema = validate_schema(schema)
        self.serializer: Serializer = serializer or JsonSerializer()
        check("max_payload_bytes", max_payload_bytes, "count")
        self.max_payload_bytes = max_payload_bytes
        self._sql = queries(self.schema)["send"]
        self._sql_one = queries(self.schema)["send_one"]
        self._channel = channel(self.schema, "producer_queue")

    def _compose(
        self,
        topic: object,
        payload: object,
        key: object,
        headers: object,
        message_id: object,
        correlation_id: UUID | str | None = None,
    ) -> OutgoingMessage:
        """Validate and encode; add the trace context and, inside a handler, the causation."""
        correlation, causation = tracing.inherited_ids(correlation_id)
        return compose(
            topic,
            payload,
            key=key,
            headers=headers,
            message_id=message_id,
            serializer=self.serializer,
            max_payload_bytes=self.max_payload_bytes,
            correlation_id=correlation,
            causation_id=causation,
            context_headers=tracing.context_headers(headers),
        )

    def _compose_many(self, messages: Iterable[Message]) -> list[OutgoingMessage]:
        result = []
        for index, m in enumerate(messages):
            if not isinstance(m, Message):
                raise OutboxError(
                    f"send_many item {index} is a {type(m).__name__}, expected outbox.Message"
                )
            try:
                result.append(
                    self._compose(
                        m.topic, m.payload, m.key, m.headers, m.message_id, m.correlation_id
                    )
                )
            except OutboxError as exc:
                raise type(exc)(f"send_many item {index}: {exc}") from exc
        ids = [m.message_id for m in result]
        if len(set(ids)) != len(ids):
            raise OutboxError("send_many was given the same message_id twice")
        return result

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
    ) -> UUID:
        """Write one message in `tx`'s transaction and return its id.

        Called from a handler callback, the message inherits the handled message's correlation
        id and gets its id as causation id; `correlation_id` overrides the inherited one.
        """
        message = self._compose(topic, payload, key, headers, message_id, correlation_id)
        writer.execute(tx, self._sql_one, writer.send_one_params(message, self._channel))
        return message.message_id

    def send_many(self, tx: object, messages: Iterable[Message]) -> list[UUID]:
        """Write a batch of messages in one statement; all are checked before any is written."""
        batch = self._compose_many(messages)
        if batch:
            writer.execute(tx, self._sql, writer.send_params(batch, self._channel))
        return [m.message_id for m in batch]

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
    ) -> UUID:
        """`send` for psycopg `AsyncConnection` and SQLAlchemy `AsyncConnection`/`AsyncSession`."""
        message = self._compose(topic, payload, key, headers, message_id, correlation_id)
        await writer.execute_async(
            tx, self._sql_one, writer.send_one_params(message, self._channel)
        )
        return message.message_id

    async def send_many_async(self, tx: object, messages: Iterable[Message]) -> list[UUID]:
        """`send_many` for asynchronous transaction handles."""
        batch = self._compose_many(messages)
        if batch:
            await writer.execute_async(tx, self._sql, writer.send_params(batch, self._channel))
        return [m.message_id for m in batch]
