"""Kafka -> inbox rows: a consumer-group client with manual commits, and message conversion."""

from __future__ import annotations

import json
import logging
import re
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Consumer as KafkaConsumer

from outbox.core.envelope import InboxRow
from outbox.core.errors import ConfigurationError
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID, to_json
from outbox.core.lanes import LANES, lane_for
from outbox.core.serializers import BYTES
from outbox.kafka.publisher import merge_settings

__all__ = [
    "InboxRow",
    "KafkaBatch",
    "KafkaSubscriber",
    "consumer_config",
    "decode_record",
    "foreign_id",
    "next_offsets",
    "to_inbox_row",
]

log = logging.getLogger("outbox.consumer")

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


class KafkaSubscriber:
    """A `Subscriber` on a confluent-kafka consumer group; offsets move only by `commit`."""

    def __init__(self, config: Mapping[str, Any], topics: Sequence[str]) -> None:
        self._consumer = KafkaConsumer(dict(config))
        self._consumer.subscribe(list(topics))

    def poll(self, max_records: int, timeout: float) -> list[InboxRow]:
        """Wait for one record, then take what else is already there, up to `max_records`."""
        return [to_inbox_row(m) for m in self._poll(max_records, timeout)]

    def poll_batch(self, max_records: int, timeout: float) -> KafkaBatch:
        """`poll`, as the columns the inbox stores (the Consumer's path: no row objects)."""
        batch = KafkaBatch()
        add = batch.add
        for m in self._poll(max_records, timeout):
            add(*_fields(m), m, None)
        return batch

    def _poll(self, max_records: int, timeout: float) -> list[Message]:
        """Wait for one record, then take what else is already there, up to `max_records`.

        `consume(n, timeout)` alone would hold the first record until n arrived or the timeout
        passed, adding the whole timeout to every message's latency at low rates.
        """
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        batch = [first]
        if max_records > 1:
            batch.extend(self._consumer.consume(max_records - 1, 0))
        return self._records(batch)

    @staticmethod
    def _records(batch: list[Message]) -> list[Message]:
        """The records of a batch; a fatal error is raised, others are logged and skipped."""
        records = []
        for message in batch:
            error = message.error()
            if error is None:
                records.append(message)
            elif error.fatal():
                raise KafkaException(error)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("kafka: %s", error.str())
        return records

    def commit(self, rows: Sequence[InboxRow] | KafkaBatch) -> None:
        """Commit, synchronously, the offsets after `rows`; a failure is logged, not raised."""
        offsets = rows.next_offsets() if isinstance(rows, KafkaBatch) else next_offsets(rows)
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # The rows are stored; a lost commit only means a redelivery, which dedup absorbs.
            log.warning("offset commit failed (the batch will be redelivered): %s", exc)

    def close(self) -> None:
        """Leave the group (its partitions go to the other members) and close the client."""
        self._consumer.close()


class _Topic:
    """Something with a topic (what the batch metrics count), shared by a batch's records."""

    __slots__ = ("topic",)

    def __init__(self, topic: str) -> None:
        self.topic = topic


#: A message id as outbox writes it; other spellings are parsed (and normalised) by uuid.UUID.
_CANONICAL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class KafkaBatch:
    """Records as the columns `inbox_insert` binds, without an object per record.

    What `decode_record` makes of each record, column by column (the message id as its text,
    the user headers in their stored JSON form): converting a record and binding it cost half
    as much this way, and the Consumer's time went mostly there.
    """

    __slots__ = (
        "content_types",
        "created_ats",
        "headers",
        "keys",
        "lanes",
        "message_ids",
        "offsets",
        "partitions",
        "payloads",
        "topics",
    )

    def __init__(self) -> None:
        self.message_ids: list[str] = []
        self.topics: list[str] = []
        self.keys: list[bytes | None] = []
        self.payloads: list[bytes] = []
        self.headers: list[str] = []
        self.content_types: list[str] = []
        self.lanes: list[int] = []
        self.created_ats: list[datetime] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes | str | None]],
        message: Message | None,
        timestamp_ms: int | None,
    ) -> None:
        """Append a record (the arguments of `_decode`)."""
        raw_id, raw_created, raw_type, user_headers = _split_headers(headers)
        message_id = _text(raw_id)
        if message_id is None or _CANONICAL_ID.fullmatch(message_id) is None:
            message_id = str(_parse_id(message_id) or foreign_id(topic, partition, offset))
        created_at = _created_at(raw_created, message, timestamp_ms)
        content_type = _text(raw_type)
        self.message_ids.append(message_id)
        self.topics.append(topic)
        self.keys.append(key)
        self.payloads.append(value)
        self.headers.append(json.dumps(to_json(user_headers)) if user_headers else "{}")
        self.content_types.append(BYTES if content_type is None else content_type)
        self.lanes.append(
            zlib.crc32(key) % LANES if key is not None else lane_for(None, uuid.UUID(message_id))
        )
        self.created_ats.append(created_at)
        self.partitions.append(partition)
        self.offsets.append(offset)

    def params(self, wake_channel: str) -> dict[str, Any]:
        """Bind parameters of `inbox_insert` (as `insert_params` makes them from rows)."""
        return {
            "message_ids": self.message_ids,
            "topics": self.topics,
            "keys": self.keys,
            "payloads": self.payloads,
            "headers": self.headers,
            "content_types": self.content_types,
            "lanes": self.lanes,
            "created_ats": self.created_ats,
            "partitions": self.partitions,
            "offsets": self.offsets,
            "channel": wake_channel,
        }

    def topical(self) -> list[_Topic]:
        """One item with the topic per record, for the batch metrics."""
        shared: dict[str, _Topic] = {}
        return [shared.get(t) or shared.setdefault(t, _Topic(t)) for t in self.topics]

    def next_offsets(self) -> list[TopicPartition]:
        """Offsets to commit after the batch is stored: last offset + 1 per partition."""
        return _next_offsets(zip(self.topics, self.partitions, self.offsets, strict=True))


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


def _fields(
    message: Message,
) -> tuple[str, int, int, bytes | None, bytes, Iterable[tuple[str, bytes | str | None]]]:
    """A confluent-kafka record as the first arguments of `_decode` and `KafkaBatch.add`."""
    key = message.key()
    value = message.value()
    return (
        message.topic() or "",
        message.partition() or 0,
        message.offset() or 0,
        key.encode() if isinstance(key, str) else key,
        value if isinstance(value, bytes) else value.encode() if isinstance(value, str) else b"",
        message.headers() or (),  # type: ignore[return-value]
    )


def to_inbox_row(message: Message) -> InboxRow:
    """Convert a Kafka record; records from foreign producers get a deterministic id."""
    return _decode(*_fields(message), message, None)


def decode_record(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    headers: Iterable[tuple[str, bytes | str | None]],
    timestamp_ms: int | None,
) -> InboxRow:
    """The inbox row of a record in outbox's wire format, from whichever transport.

    outbox's own headers give the message id, creation time and content type; a record
    without them (a foreign producer's) gets a deterministic id, the record's timestamp and
    the raw-bytes content type.
    """
    return _decode(topic, partition, offset, key, value, headers, None, timestamp_ms)


def _decode(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    headers: Iterable[tuple[str, bytes | str | None]],
    message: Message | None,
    timestamp_ms: int | None,
) -> InboxRow:
    """`decode_record`, positional (it runs once per record); the timestamp of `message`, when
    given, is read only if the creation time header is missing or unreadable."""
    raw_id, raw_created, raw_type, user_headers = _split_headers(headers)
    message_id = _parse_id(_text(raw_id)) or foreign_id(topic, partition, offset)
    created_at = _created_at(raw_created, message, timestamp_ms)
    content_type = _text(raw_type)
    # Positional, in field order: a quarter cheaper than keywords for this frozen dataclass.
    return InboxRow(
        message_id,
        topic,
        key,
        value,
        user_headers or {},
        BYTES if content_type is None else content_type,
        lane_for(key, message_id),
        created_at,
        partition,
        offset,
    )


def _split_headers(
    headers: Iterable[tuple[str, bytes | str | None]],
) -> tuple[Any, Any, Any, dict[str, str | bytes] | None]:
    """(message id, created time, content type, user headers or None) of a record's headers."""
    raw_id = raw_created = raw_type = None
    user_headers: dict[str, str | bytes] | None = None
    for name, header_value in headers:
        if name == MESSAGE_ID:
            raw_id = header_value
        elif name == CREATED_AT:
            raw_created = header_value
        elif name == CONTENT_TYPE:
            raw_type = header_value
        else:
            if user_headers is None:
                user_headers = {}
            user_headers[name] = _text_or_bytes(header_value)
    return raw_id, raw_created, raw_type, user_headers


def _parse_id(text: str | None) -> uuid.UUID | None:
    """The message id header as a UUID; None when absent or not a UUID."""
    if text is None:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _text(value: bytes | str | None) -> str | None:
    """A header value as text; None when absent or not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value


def _parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time (UTC when it has no offset); None when absent or unreadable."""
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def next_offsets(rows: Iterable[InboxRow]) -> list[TopicPartition]:
    """Offsets to commit after `rows` are stored: last offset + 1 per partition."""
    return _next_offsets((row.topic, row.partition, row.offset) for row in rows)


def _next_offsets(records: Iterable[tuple[str, int, int]]) -> list[TopicPartition]:
    """Last offset + 1 per partition of (topic, partition, offset) records."""
    last: dict[tuple[str, int], int] = {}
    for topic, partition, offset in records:
        last[topic, partition] = max(last.get((topic, partition), -1), offset)
    return [TopicPartition(t, p, o + 1) for (t, p), o in sorted(last.items())]


def _created_at(raw: Any, message: Message | None, timestamp_ms: int | None) -> datetime:
    """The outbox created-time header; else the record's own timestamp; else now."""
    created_at = _parse_time(_text(raw))
    if created_at is not None:
        return created_at
    if message is not None:
        kind, millis = message.timestamp()
        timestamp_ms = millis if kind != TIMESTAMP_NOT_AVAILABLE and millis > 0 else None
    if timestamp_ms is not None:
        return datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    return datetime.now(UTC)
