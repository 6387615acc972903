"""The message envelope: what `broker.send` stores and the relays carry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from outbox.core.errors import InvalidKey, OutboxError, PayloadTooLarge, SerializationError
from outbox.core.headers import (
    CAUSATION_ID,
    CONTENT_TYPE,
    CORRELATION_ID,
    CREATED_AT,
    MESSAGE_ID,
    validate_headers,
)
from outbox.core.ids import uuid7
from outbox.core.lanes import lane_for
from outbox.core.serializers import Serializer, encode_payload
from outbox.core.topics import validate_topic

#: librdkafka's default `message.max.bytes`: the largest record a producer sends unless told.
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
#: Margin for what Kafka adds around a record: librdkafka counts its worst-case record framing
#: (36 bytes of lengths, attributes, timestamp and offset deltas) against `message.max.bytes`,
#: and a record batch has a 61-byte header; rounded up.
RECORD_OVERHEAD_BYTES = 128
#: What Kafka adds per header: the lengths of its name and value (varints, at most 5 bytes each).
HEADER_OVERHEAD_BYTES = 10
#: The longest `outbox-created-at` value the relay writes (`2026-01-31T12:00:00.000000+00:00`).
CREATED_AT_BYTES = 32
#: `Broker`'s default limit of `record_size`: a message `send` accepts is deliverable with
#: librdkafka's default settings.
DEFAULT_MAX_MESSAGE_BYTES = LIBRDKAFKA_MESSAGE_MAX_BYTES - RECORD_OVERHEAD_BYTES


def record_size(
    key: bytes | None, payload: bytes, content_type: str, headers: Mapping[str, str | bytes]
) -> int:
    """Bytes of the Kafka record the relay will produce for a message: key, payload, and every
    header's name and value with `HEADER_OVERHEAD_BYTES` each, outbox's own included (message
    id, created-at, content-type; correlation, causation and trace context are in `headers`).
    Kafka's framing of the record and its batch is the `RECORD_OVERHEAD_BYTES` margin."""
    own = (
        (MESSAGE_ID, 36),  # a UUID's text
        (CREATED_AT, CREATED_AT_BYTES),
        (CONTENT_TYPE, len(content_type.encode())),
    )
    size = len(key or b"") + len(payload)
    for name, value_bytes in own:
        size += HEADER_OVERHEAD_BYTES + len(name.encode()) + value_bytes
    for name, value in headers.items():
        raw = value.encode() if isinstance(value, str) else value
        size += HEADER_OVERHEAD_BYTES + len(name.encode()) + len(raw)
    return size


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A validated, encoded message ready to be written to `producer_queue`.

    `id_generated`: `compose` made `message_id` (a new UUIDv7, 74 random bits within its
    millisecond), so no row can have it yet and its write needs no conflict check.
    """

    message_id: UUID
    topic: str
    key: bytes | None
    payload: bytes
    content_type: str
    headers: dict[str, str | bytes]
    lane: int
    id_generated: bool = False


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


def _uuid(value: object, what: str) -> UUID | None:
    """`value` as a UUID (None stays None), or an `OutboxError` naming `what`."""
    if value is None or isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError as exc:
        raise OutboxError(f"{what} {value!r} is not a UUID") from exc


def compose(
    topic: object,
    payload: object,
    *,
    key: object,
    headers: object,
    message_id: object,
    serializer: Serializer,
    max_message_bytes: int,
    correlation_id: object = None,
    causation_id: object = None,
    context_headers: Mapping[str, str] | None = None,
) -> OutgoingMessage:
    """Validate and encode one message, raising an `OutboxError` that names the first problem.

    `context_headers` (trace context) are added unless the user's headers have the same name.
    A correlation id equal to the message's own id is not stored: absent means "own id".
    `max_message_bytes` bounds `record_size`, the Kafka record the relay will produce.
    """
    valid_topic = validate_topic(topic)
    if key is None or isinstance(key, bytes):
        raw_key = key
    elif isinstance(key, str):
        try:
            raw_key = key.encode()
        except UnicodeEncodeError as exc:
            raise InvalidKey(
                f"str key {key!r} is not valid Unicode (a lone surrogate at position "
                f"{exc.start}) and cannot be encoded as UTF-8: use bytes for binary keys"
            ) from None
    else:
        raise InvalidKey(f"key must be str, bytes or None, got {type(key).__name__}")
    valid_headers = validate_headers(headers)
    given_id = _uuid(message_id, "message_id")
    mid = uuid7() if given_id is None else given_id
    if context_headers:
        for name, value in context_headers.items():
            valid_headers.setdefault(name, value)
    correlation = _uuid(correlation_id, "correlation_id")
    if correlation is not None and correlation != mid:
        valid_headers[CORRELATION_ID] = str(correlation)
    causation = _uuid(causation_id, "causation_id")
    if causation is not None:
        valid_headers[CAUSATION_ID] = str(causation)
    try:
        data, content_type = encode_payload(payload, serializer)
    except SerializationError as exc:
        raise SerializationError(f"payload for topic {valid_topic!r}: {exc}") from exc
    size = record_size(raw_key, data, content_type, valid_headers)
    if size > max_message_bytes:
        key_bytes = len(raw_key or b"")
        raise PayloadTooLarge(
            f"message for topic {valid_topic!r} would be a {size}-byte Kafka record (payload "
            f"{len(data)} bytes encoded, key {key_bytes} bytes, headers with outbox's own "
            f"{size - len(data) - key_bytes} bytes); the limit is {max_message_bytes} bytes "
            "(Broker(max_message_bytes=...))"
        )
    return OutgoingMessage(
        message_id=mid,
        topic=valid_topic,
        key=raw_key,
        payload=data,
        content_type=content_type,
        headers=valid_headers,
        lane=lane_for(raw_key, mid),
        id_generated=given_id is None,
    )


P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class InboxMessage(Generic[P]):
    """What a handler receives: the decoded message and where it is in its retries.

    `payload` is an instance of the handler's payload type (`InboxMessage[OrderCreated]`) when
    it declares one, through its `Topic` or its annotation; else the decoded JSON value (bytes
    for `application/octet-stream`, str for text).
    """

    id: UUID
    topic: str
    key: bytes | None
    payload: P
    raw_payload: bytes
    content_type: str
    headers: dict[str, str | bytes]
    attempt: int
    created_at: datetime
    received_at: datetime
    partition: int | None = None
    offset: int | None = None

    @property
    def correlation_id(self) -> UUID:
        """The conversation this message belongs to: the id of the first message of the chain.

        A message sent outside a handler starts a conversation (its own id, unless the sender
        gave one); a message sent from a handler inherits the handled message's.
        """
        return _header_uuid(self.headers, CORRELATION_ID) or self.id

    @property
    def causation_id(self) -> UUID | None:
        """The id of the message whose handler sent this one; None if not sent by a handler."""
        return _header_uuid(self.headers, CAUSATION_ID)


def _header_uuid(headers: Mapping[str, str | bytes], name: str) -> UUID | None:
    """A reserved id header as a UUID; None when absent or not a UUID (a foreign producer's)."""
    value = headers.get(name)
    if not isinstance(value, str):
        return None
    try:
        return UUID(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class InboxRow:
    """One received record as it is stored in `consumer_queue` (what a `Subscriber` returns)."""

    message_id: UUID
    topic: str
    key: bytes | None
    payload: bytes
    headers: dict[str, str | bytes]
    content_type: str
    lane: int
    created_at: datetime
    partition: int
    offset: int
    #: Why the record cannot be stored as an ordinary row (a header name PostgreSQL cannot
    #: hold, say), or None. A quarantined row is stored dead, with its key and payload as
    #: received, `raw_headers`, no user headers and the raw-bytes content type.
    quarantine: str | None = None
    #: Only with `quarantine`: every header as received, the JSON text of
    #: `[[base64 name, base64 value or null], ...]`.
    raw_headers: str | None = None
