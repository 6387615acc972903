"""The message envelope: what `broker.send` stores and the relays carry."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from outbox.core.errors import InvalidKey, OutboxError, PayloadTooLarge
from outbox.core.headers import validate_headers
from outbox.core.ids import uuid7
from outbox.core.lanes import lane_for
from outbox.core.serializers import Serializer, encode_payload
from outbox.core.topics import validate_topic


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A validated, encoded message ready to be written to `producer_queue`."""

    message_id: UUID
    topic: str
    key: bytes | None
    payload: bytes
    content_type: str
    headers: dict[str, str | bytes]
    lane: int


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A row of `producer_queue` as the relay reads it."""

    id: int
    message_id: UUID
    topic: str
    key: bytes | None
    payload: bytes
    content_type: str
    headers: dict[str, str | bytes]
    created_at: datetime
    attempts: int
    extra: dict[str, Any] = field(default_factory=dict)


def compose(
    topic: object,
    payload: object,
    *,
    key: object,
    headers: object,
    message_id: object,
    serializer: Serializer,
    max_payload_bytes: int,
) -> OutgoingMessage:
    """Validate and encode one message, raising an `OutboxError` that names the first problem."""
    valid_topic = validate_topic(topic)
    if key is None or isinstance(key, bytes):
        raw_key = key
    elif isinstance(key, str):
        raw_key = key.encode()
    else:
        raise InvalidKey(f"key must be str, bytes or None, got {type(key).__name__}")
    valid_headers = validate_headers(headers)
    if message_id is None:
        mid = uuid7()
    elif isinstance(message_id, UUID):
        mid = message_id
    else:
        try:
            mid = UUID(str(message_id))
        except ValueError as exc:
            raise OutboxError(f"message_id {message_id!r} is not a UUID") from exc
    data, content_type = encode_payload(payload, serializer)
    if len(data) > max_payload_bytes:
        raise PayloadTooLarge(
            f"payload for topic {valid_topic!r} is {len(data)} bytes encoded; "
            f"the limit is {max_payload_bytes} bytes (Broker(max_payload_bytes=...))"
        )
    return OutgoingMessage(
        message_id=mid,
        topic=valid_topic,
        key=raw_key,
        payload=data,
        content_type=content_type,
        headers=valid_headers,
        lane=lane_for(raw_key, mid),
    )


@dataclass(frozen=True, slots=True)
class InboxMessage:
    """What a handler receives: the decoded message and where it is in its retries."""

    id: UUID
    topic: str
    key: bytes | None
    payload: Any
    raw_payload: bytes
    content_type: str
    headers: dict[str, str | bytes]
    attempt: int
    created_at: datetime
    received_at: datetime
    partition: int | None = None
    offset: int | None = None
