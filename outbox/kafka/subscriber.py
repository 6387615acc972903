"""Kafka -> inbox rows: a consumer-group client with manual commits, and message conversion."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message, TopicPartition

from outbox.core.errors import ConfigurationError
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID
from outbox.core.lanes import lane_for
from outbox.core.serializers import BYTES
from outbox.kafka.publisher import merge_settings

#: Namespace of the deterministic ids given to messages without an outbox message id.
FOREIGN_NAMESPACE = uuid.UUID("6f1c0d2a-6a53-4c57-9a51-0d7b5b0b7e11")
REQUIRED = {"enable.auto.commit": "false"}
DEFAULTS: dict[str, Any] = {
    # How long a fetch may wait for data. Kafka answers as soon as data arrives; brokers that
    # answer only at this deadline (the local Tansu) would add up to it to every message's
    # latency. 25 ms costs an idle consumer about 40 small fetches a second.
    "fetch.wait.max.ms": 25,
    "auto.offset.reset": "earliest",
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": False,
}


def consumer_config(
    bootstrap: str, group: str, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """librdkafka settings of an inbox consumer; offsets are committed by outbox only."""
    if not group:
        raise ConfigurationError("a consumer group is required (--group)")
    return merge_settings(
        {"bootstrap.servers": bootstrap, "group.id": group, **DEFAULTS},
        extra,
        REQUIRED,
        "commit offsets before the inbox has the messages",
    )


@dataclass(frozen=True, slots=True)
class InboxRow:
    """One Kafka record as it is stored in `consumer_queue`."""

    message_id: uuid.UUID
    topic: str
    key: bytes | None
    payload: bytes
    headers: dict[str, str | bytes]
    content_type: str
    lane: int
    created_at: datetime
    partition: int
    offset: int


def foreign_id(topic: str, partition: int, offset: int) -> uuid.UUID:
    """The deterministic id of a record that carries no outbox message id."""
    return uuid.uuid5(FOREIGN_NAMESPACE, f"{topic}/{partition}/{offset}")


def _text_or_bytes(value: bytes | str | None) -> str | bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        return bytes(value)


def to_inbox_row(message: Message) -> InboxRow:
    """Convert a record; records from foreign producers get a deterministic id."""
    topic = message.topic() or ""
    partition = message.partition() or 0
    offset = message.offset() or 0
    headers: dict[str, str | bytes] = {}
    own: dict[str, str | bytes] = {}
    raw_headers: list[tuple[str, bytes | str | None]] = list(message.headers() or [])  # type: ignore[arg-type]
    for name, value in raw_headers:
        target = own if name in (MESSAGE_ID, CREATED_AT, CONTENT_TYPE) else headers
        target[name] = _text_or_bytes(value)
    message_id: uuid.UUID | None = None
    raw_id = own.get(MESSAGE_ID)
    if isinstance(raw_id, str):
        try:
            message_id = uuid.UUID(raw_id)
        except ValueError:
            message_id = None
    if message_id is None:
        message_id = foreign_id(topic, partition, offset)
    created_at = _created_at(own.get(CREATED_AT), message)
    content_type = own.get(CONTENT_TYPE)
    key = message.key()
    raw_key = key.encode() if isinstance(key, str) else key
    value = message.value()
    return InboxRow(
        message_id=message_id,
        topic=topic,
        key=raw_key,
        payload=value.encode() if isinstance(value, str) else (value or b""),
        headers=headers,
        content_type=content_type if isinstance(content_type, str) else BYTES,
        lane=lane_for(raw_key, message_id),
        created_at=created_at,
        partition=partition,
        offset=offset,
    )


def _created_at(header: str | bytes | None, message: Message) -> datetime:
    if isinstance(header, str):
        try:
            parsed = datetime.fromisoformat(header)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        except ValueError:
            pass
    kind, millis = message.timestamp()
    if kind != TIMESTAMP_NOT_AVAILABLE and millis > 0:
        return datetime.fromtimestamp(millis / 1000, UTC)
    return datetime.now(UTC)


def next_offsets(messages: Sequence[Message]) -> list[TopicPartition]:
    """Offsets to commit after `messages` are stored: last offset + 1 per partition."""
    last: dict[tuple[str, int], int] = {}
    for m in messages:
        tp = (m.topic() or "", m.partition() or 0)
        last[tp] = max(last.get(tp, -1), m.offset() or 0)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]
