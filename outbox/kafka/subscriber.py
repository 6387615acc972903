"""Kafka -> inbox rows: a consumer-group client with manual commits, and message conversion."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

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
from outbox.core.text import first_line, is_storable, storable
from outbox.kafka.publisher import merge_settings

__all__ = [
    "InboxRow",
    "KafkaBatch",
    "KafkaSubscriber",
    "Quarantined",
    "consumer_config",
    "decode_record",
    "foreign_id",
    "next_offsets",
    "quarantined_row",
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

RawHeaders = Iterable[tuple[str, bytes | str | None]]


class _Unreadable(tuple):  # type: ignore[type-arg]
    """No headers: the client could not give the record's headers (`message.headers()`
    raised); `reason` says why. The record is quarantined with what can be read of it."""

    reason: str


def _unreadable(exc: BaseException) -> _Unreadable:
    headers = _Unreadable()
    headers.reason = f"the record's headers cannot be read: {type(exc).__name__}: {first_line(exc)}"
    return headers


class Quarantined(NamedTuple):
    """A record stored dead because it cannot be stored as an ordinary inbox row.

    Contract: every field is a uuid, bytes, an int, a time, text made `storable` or base64 in
    JSON, so the row `inbox_quarantine` makes of it cannot be refused by PostgreSQL. Its key
    and payload are the record's bytes as received; `raw_headers` is the JSON text of every
    header, in order, as `[[base64 name, base64 value or null], ...]`.
    """

    message_id: str
    topic: str
    key: bytes | None
    payload: bytes
    raw_headers: str
    lane: int
    created_at: datetime
    partition: int
    offset: int
    reason: str


class KafkaBatch:
    """Records as the columns `inbox_insert` binds, without an object per record.

    What `decode_record` makes of each record, column by column (the message id as its text,
    the user headers in their stored JSON form): converting a record and binding it cost half
    as much this way, and the Consumer's time went mostly there. A record that cannot be an
    ordinary row goes to `quarantined` instead of the columns (`decode_record` marks it).
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
        "quarantined",
        "raw_headers",
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
        #: The headers of each ordinary record as received (to quarantine it if PostgreSQL
        #: refuses it after all).
        self.raw_headers: list[RawHeaders] = []
        #: Records stored dead, not in the columns above.
        self.quarantined: list[Quarantined] = []

    def __len__(self) -> int:
        """Records received: the ordinary ones and the quarantined ones."""
        return len(self.offsets) + len(self.quarantined)

    @property
    def ordinary(self) -> int:
        """Records in the columns (not quarantined)."""
        return len(self.offsets)

    def add(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes,
        headers: RawHeaders,
        message: Message | None,
        timestamp_ms: int | None,
    ) -> None:
        """Append a record (the arguments of `_decode`)."""
        unreadable = None
        if type(headers) is not list and type(headers) is not tuple:
            if isinstance(headers, _Unreadable):
                unreadable = headers.reason
            headers = list(headers)
        raw_id, raw_created, content_type, user_headers, problem = _split_headers(headers)
        problem = unreadable or problem
        message_id = _text(raw_id)
        if message_id is None or _CANONICAL_ID.fullmatch(message_id) is None:
            message_id = str(
                _parse_id(message_id)
                or foreign_id(
                    topic, partition, offset, _millis(message, timestamp_ms), key, value, headers
                )
            )
        created_at = _created_at(raw_created, message, timestamp_ms)
        lane = zlib.crc32(key) % LANES if key is not None else lane_for(None, uuid.UUID(message_id))
        if problem is not None:
            self.quarantined.append(
                Quarantined(
                    message_id,
                    storable(topic),
                    key,
                    value,
                    _raw_json(headers),
                    lane,
                    created_at,
                    partition,
                    offset,
                    problem,
                )
            )
            return
        self.message_ids.append(message_id)
        self.topics.append(topic)
        self.keys.append(key)
        self.payloads.append(value)
        self.headers.append(json.dumps(to_json(user_headers)) if user_headers else "{}")
        self.content_types.append(BYTES if content_type is None else content_type)
        self.lanes.append(lane)
        self.created_ats.append(created_at)
        self.partitions.append(partition)
        self.offsets.append(offset)
        self.raw_headers.append(headers)

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

    def part(self, start: int, stop: int) -> KafkaBatch:
        """The ordinary records [start, stop) as a batch of their own (nothing quarantined)."""
        part = KafkaBatch()
        for name in KafkaBatch.__slots__:
            if name != "quarantined":
                setattr(part, name, getattr(self, name)[start:stop])
        return part

    def quarantine(self, index: int, reason: str) -> Quarantined:
        """The ordinary record at `index`, to be stored dead for `reason`."""
        return Quarantined(
            self.message_ids[index],
            storable(self.topics[index]),
            self.keys[index],
            self.payloads[index],
            _raw_json(self.raw_headers[index]),
            self.lanes[index],
            self.created_ats[index],
            self.partitions[index],
            self.offsets[index],
            storable(reason),
        )

    def topical(self) -> list[_Topic]:
        """One item with the topic per record (quarantined ones too), for the batch metrics."""
        shared: dict[str, _Topic] = {}
        topics = [*self.topics, *(q.topic for q in self.quarantined)]
        return [shared.get(t) or shared.setdefault(t, _Topic(t)) for t in topics]

    def next_offsets(self) -> list[TopicPartition]:
        """Offsets to commit after the batch is stored: last offset + 1 per partition."""
        return _next_offsets(
            [
                *zip(self.topics, self.partitions, self.offsets, strict=True),
                *((q.topic, q.partition, q.offset) for q in self.quarantined),
            ]
        )


def quarantine_params(records: Sequence[Quarantined]) -> dict[str, Any]:
    """Bind parameters of `inbox_quarantine`."""
    return {
        "message_ids": [q.message_id for q in records],
        "topics": [q.topic for q in records],
        "keys": [q.key for q in records],
        "payloads": [q.payload for q in records],
        "raw_headers": [q.raw_headers for q in records],
        "lanes": [q.lane for q in records],
        "created_ats": [q.created_at for q in records],
        "partitions": [q.partition for q in records],
        "offsets": [q.offset for q in records],
        "errors": [q.reason for q in records],
    }


def quarantined_row(row: InboxRow, reason: str | None = None) -> Quarantined:
    """An inbox row as a record to store dead: for `reason`, else for its own `quarantine`.

    A row marked by `decode_record` carries the record's headers as received; another (one
    PostgreSQL refused) has them rebuilt from its user headers and content type.
    """
    raw = row.raw_headers
    if raw is None:
        rebuilt: list[tuple[str, bytes | str | None]] = list(row.headers.items())
        rebuilt.append((CONTENT_TYPE, row.content_type))
        raw = _raw_json(rebuilt)
    return Quarantined(
        str(row.message_id),
        storable(row.topic),
        row.key,
        row.payload,
        raw,
        row.lane,
        row.created_at,
        row.partition,
        row.offset,
        storable(reason if reason is not None else row.quarantine or "quarantined"),
    )


def foreign_id(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: RawHeaders,
) -> uuid.UUID:
    """The deterministic id of a record that carries no outbox message id.

    uuid5 (FOREIGN_NAMESPACE) of "topic/partition/offset/timestamp/digest": the timestamp in
    milliseconds (-1 when the record has none) and the hex SHA-256 of the record's key, value
    and headers, each framed as `<byte length>:<bytes>` (`-` for a missing key or value),
    headers in order, name then value (docs/decisions/0008-foreign-record-identity.md).
    A redelivery of the same record gets the same id; another record at the same offset
    (the topic re-created, offsets restarted) gets another. `outbox.spark.audit.foreign_id`
    computes the same.
    """
    parts = [_framed(key), _framed(value)]
    for name, header_value in headers:
        parts.append(_framed(_raw_bytes(name)))
        parts.append(_framed(None if header_value is None else _raw_bytes(header_value)))
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    millis = -1 if timestamp_ms is None else timestamp_ms
    return uuid.uuid5(FOREIGN_NAMESPACE, f"{topic}/{partition}/{offset}/{millis}/{digest}")


def _framed(data: bytes | None) -> bytes:
    return b"-" if data is None else b"%d:%b" % (len(data), data)


def _raw_bytes(value: str | bytes) -> bytes:
    """A header name or value as bytes: str as UTF-8 (lone surrogates kept, as surrogatepass)."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)


def _raw_json(headers: RawHeaders) -> str:
    """Every header as the JSON of `[[base64 name, base64 value or null], ...]`."""
    return json.dumps(
        [
            [
                base64.b64encode(_raw_bytes(name)).decode(),
                None if value is None else base64.b64encode(_raw_bytes(value)).decode(),
            ]
            for name, value in headers
        ]
    )


def _text_or_bytes(value: bytes | str | None) -> str | bytes:
    """A header value as it is stored: text when it is storable UTF-8 text, else bytes."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value if is_storable(value) else value.encode("utf-8", "surrogatepass")
    if b"\x00" in value:  # PostgreSQL's jsonb cannot hold NUL as text
        return bytes(value)
    try:
        return value.decode()
    except UnicodeDecodeError:
        return bytes(value)


def _fields(
    message: Message,
) -> tuple[str, int, int, bytes | None, bytes, RawHeaders]:
    """A confluent-kafka record as the first arguments of `_decode` and `KafkaBatch.add`."""
    key = message.key()
    value = message.value()
    headers: Any
    try:
        headers = message.headers() or ()
    except Exception as exc:  # a header the client cannot convert: quarantine the record
        headers = _unreadable(exc)
    return (
        message.topic() or "",
        message.partition() or 0,
        message.offset() or 0,
        key.encode() if isinstance(key, str) else key,
        value if isinstance(value, bytes) else value.encode() if isinstance(value, str) else b"",
        headers,
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
    headers: RawHeaders,
    timestamp_ms: int | None,
) -> InboxRow:
    """The inbox row of a record in outbox's wire format, from whichever transport.

    outbox's own headers give the message id, creation time and content type; a record
    without them (a foreign producer's) gets a deterministic id (`foreign_id`), the record's
    timestamp and the raw-bytes content type. A record that cannot be stored as an ordinary
    row (a header name PostgreSQL cannot hold, a content type that is not storable text) is
    marked: `quarantine` says why, `raw_headers` has its headers as received, and its user
    headers are empty and its content type raw bytes.
    """
    return _decode(topic, partition, offset, key, value, headers, None, timestamp_ms)


def _decode(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    headers: RawHeaders,
    message: Message | None,
    timestamp_ms: int | None,
) -> InboxRow:
    """`decode_record`, positional (it runs once per record); the timestamp of `message`, when
    given, is read only if the creation time header or the outbox message id is missing."""
    unreadable = None
    if type(headers) is not list and type(headers) is not tuple:
        if isinstance(headers, _Unreadable):
            unreadable = headers.reason
        headers = list(headers)
    raw_id, raw_created, content_type, user_headers, problem = _split_headers(headers)
    problem = unreadable or problem
    message_id = _parse_id(_text(raw_id)) or foreign_id(
        topic, partition, offset, _millis(message, timestamp_ms), key, value, headers
    )
    created_at = _created_at(raw_created, message, timestamp_ms)
    if problem is not None:
        # Positional, in field order: a quarter cheaper than keywords for this frozen dataclass.
        return InboxRow(
            message_id, topic, key, value, {}, BYTES, lane_for(key, message_id), created_at,
            partition, offset, problem, _raw_json(headers),
        )  # fmt: skip
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
    headers: RawHeaders,
) -> tuple[Any, Any, str | None, dict[str, str | bytes] | None, str | None]:
    """(message id, created time, content type as text, user headers or None, why the record
    must be quarantined or None) of a record's headers.

    Only a name that is not ASCII or holds NUL is looked at more closely: the usual record pays
    for two quick tests per header.
    """
    raw_id = raw_created = raw_type = None
    user_headers: dict[str, str | bytes] | None = None
    problem: str | None = None
    for name, header_value in headers:
        if name == MESSAGE_ID:
            raw_id = header_value
        elif name == CREATED_AT:
            raw_created = header_value
        elif name == CONTENT_TYPE:
            raw_type = header_value
        else:
            if (type(name) is not str or not name.isascii() or "\x00" in name) and not (
                isinstance(name, str) and is_storable(name)
            ):
                problem = f"header name {storable(repr(name))} cannot be stored (NUL or not UTF-8)"
            if user_headers is None:
                user_headers = {}
            user_headers[name] = _text_or_bytes(header_value)
    content_type = _text(raw_type)
    if raw_type is not None and (
        content_type is None
        or "\x00" in content_type
        or (type(raw_type) is not bytes and not is_storable(content_type))
    ):  # bytes decoded as UTF-8 need only the NUL test
        problem = problem or (
            f"content-type header {storable(repr(raw_type))} is not storable text "
            f"(NUL or not UTF-8)"
        )
    return raw_id, raw_created, content_type, user_headers, problem


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


def _millis(message: Message | None, timestamp_ms: int | None) -> int | None:
    """The record's own timestamp (ms): `message`'s when given, else `timestamp_ms`."""
    if message is not None:
        kind, millis = message.timestamp()
        return millis if kind != TIMESTAMP_NOT_AVAILABLE and millis > 0 else None
    return timestamp_ms


def _created_at(raw: Any, message: Message | None, timestamp_ms: int | None) -> datetime:
    """The outbox created-time header; else the record's own timestamp (if a datetime can hold
    it: a producer may set any, up to year 292 million); else now."""
    created_at = _parse_time(_text(raw))
    if created_at is not None:
        return created_at
    timestamp_ms = _millis(message, timestamp_ms)
    if timestamp_ms is not None:
        try:
            return datetime.fromtimestamp(timestamp_ms / 1000, UTC)
        except (ValueError, OverflowError, OSError):  # past year 9999: a producer's own clock
            pass
    return datetime.now(UTC)
