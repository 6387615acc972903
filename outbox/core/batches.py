"""The batches the daemons pass through the transport ports: pure data, no I/O.

`OutgoingRecord` is what the relay hands to a `Publisher` (a stored message, ready for the wire);
`InboxBatch` is what a `Subscriber` hands to the inbox: the records as columns, without an object
per record, with what the inbox needs to store them and the transport needs to commit them.
Both are built for the per-record cost: the relay and the inbox move tens of thousands of
records a second through them, and a Python object or conversion per record shows.
"""

from __future__ import annotations

import json
import re
import uuid
import zlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from outbox.core.envelope import InboxRow, StoredMessage
from outbox.core.headers import CONTENT_TYPE, from_json, to_json
from outbox.core.lanes import LANES, lane_for
from outbox.core.serializers import BYTES
from outbox.core.text import storable
from outbox.core.wire import (
    RawHeaders,
    TimestampOf,
    WireHeaders,
    creation_time,
    foreign_id,
    given_millis,
    header_text,
    own_headers,
    parse_id,
    raw_json,
    split_headers,
    stored_headers,
)

__all__ = [
    "InboxBatch",
    "OutgoingRecord",
    "Positions",
    "Quarantined",
    "outgoing",
    "quarantined_row",
    "stored_message",
]


class OutgoingRecord(NamedTuple):
    """A stored message as the relay hands it to a `Publisher`, ready for the wire.

    The database formats what goes into the headers, so that the relay does no per-record
    conversion: `message_id` is the UUID's text, `created_at` its ISO 8601 form in UTC, and
    `headers` the user headers in their stored JSON form (`to_json`), or None when there are
    none (the usual case). `id` is the outbox store's row id, `attempts` its failed deliveries.
    """

    id: int
    topic: str
    key: bytes | None
    payload: bytes
    message_id: str
    created_at: str
    content_type: str
    headers: str | None
    attempts: int

    def wire_headers(self) -> WireHeaders:
        """The record's headers: outbox's own, then the user's; `InvalidHeaders` when the
        stored headers are not outbox's form (a row written by hand, say)."""
        headers = own_headers(self.message_id, self.created_at, self.content_type)
        if self.headers is not None:
            headers.extend(stored_headers(self.headers).items())
        return headers


def outgoing(message: StoredMessage) -> OutgoingRecord:
    """A `StoredMessage` as an outgoing record (for tools and tests; the relay fetches these)."""
    return OutgoingRecord(
        message.id,
        message.topic,
        message.key,
        message.payload,
        str(message.message_id),
        message.created_at.isoformat(),
        message.content_type,
        json.dumps(to_json(message.headers)) if message.headers else None,
        message.attempts,
    )


def stored_message(record: OutgoingRecord) -> StoredMessage:
    """An outgoing record as a `StoredMessage` (for tracing); `InvalidHeaders` if its stored
    headers are not outbox's form."""
    return StoredMessage(
        id=record.id,
        message_id=uuid.UUID(record.message_id),
        topic=record.topic,
        key=record.key,
        payload=record.payload,
        content_type=record.content_type,
        headers=stored_headers(record.headers) if record.headers is not None else {},
        created_at=datetime.fromisoformat(record.created_at),
        attempts=record.attempts,
    )


class _Topic:
    """Something with a topic (what the batch metrics count), shared by a batch's records."""

    __slots__ = ("topic",)

    def __init__(self, topic: str) -> None:
        self.topic = topic


#: A message id as outbox writes it; other spellings are parsed (and normalised) by uuid.UUID.
_CANONICAL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Quarantined(NamedTuple):
    """A record stored dead because it cannot be stored as an ordinary inbox row.

    Contract: every field is a uuid, bytes, an int, a time, text made `storable` or base64 in
    JSON, so the inbox store cannot be refused it by PostgreSQL. Its key and payload are the
    record's bytes as received; `raw_headers` is the JSON text of every header, in order, as
    `[[base64 name, base64 value or null], ...]`.
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


class InboxBatch:
    """Records received from a transport, as columns (no object per record), in the order
    received: what a `Subscriber` polls and commits, and what the inbox store stores.

    What `decode_record` makes of each record, column by column (the message id as its text,
    the user headers in their stored JSON form, the lane computed once, here): converting a
    record and binding it cost half as much this way, and the Consumer's time went mostly
    there. A record that cannot be an ordinary row goes to `quarantined` instead of the
    columns. The commit position is `next_offsets()`, from the (topic, partition, offset) of
    every record, quarantined ones included.

    `timestamp_of` reads a record's own timestamp from what `add` was given as `timestamp`,
    only for a record without outbox's creation time or message id (see `TimestampOf`).
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
        "timestamp_of",
        "topics",
    )

    def __init__(self, timestamp_of: TimestampOf = given_millis) -> None:
        self.timestamp_of = timestamp_of
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
        timestamp: Any = None,
    ) -> None:
        """Append a record in outbox's wire format (see `decode_record`)."""
        if not isinstance(headers, list | tuple):  # UnreadableHeaders is a tuple: kept
            headers = list(headers)
        raw_id, raw_created, content_type, user_headers, problem = split_headers(headers)
        message_id = header_text(raw_id)
        if message_id is None or _CANONICAL_ID.fullmatch(message_id) is None:
            message_id = str(
                parse_id(message_id)
                or foreign_id(
                    topic,
                    partition,
                    offset,
                    self.timestamp_of(timestamp),
                    key,
                    value,
                    headers,
                )
            )
        created_at = creation_time(raw_created, timestamp, self.timestamp_of)
        lane = zlib.crc32(key) % LANES if key is not None else lane_for(None, uuid.UUID(message_id))
        if problem is not None:
            self.quarantined.append(
                Quarantined(
                    message_id,
                    storable(topic),
                    key,
                    value,
                    raw_json(headers),
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

    def add_row(self, row: InboxRow) -> None:
        """Append a decoded row (a row marked for quarantine goes to `quarantined`)."""
        if row.quarantine is not None:
            self.quarantined.append(quarantined_row(row))
            return
        self.message_ids.append(str(row.message_id))
        self.topics.append(row.topic)
        self.keys.append(row.key)
        self.payloads.append(row.payload)
        self.headers.append(json.dumps(to_json(row.headers)) if row.headers else "{}")
        self.content_types.append(row.content_type)
        self.lanes.append(row.lane)
        self.created_ats.append(row.created_at)
        self.partitions.append(row.partition)
        self.offsets.append(row.offset)
        self.raw_headers.append([*row.headers.items(), (CONTENT_TYPE, row.content_type)])

    @classmethod
    def of(cls, rows: Iterable[InboxRow]) -> InboxBatch:
        """A batch of decoded rows (for tools and test doubles; transports use `add`)."""
        batch = cls()
        for row in rows:
            batch.add_row(row)
        return batch

    def rows(self) -> list[InboxRow]:
        """The records as `InboxRow`s: the ordinary ones, then the quarantined ones (for tests
        and tools; the daemons use the columns)."""
        rows = [
            InboxRow(
                uuid.UUID(self.message_ids[i]),
                self.topics[i],
                self.keys[i],
                self.payloads[i],
                from_json(json.loads(self.headers[i])),
                self.content_types[i],
                self.lanes[i],
                self.created_ats[i],
                self.partitions[i],
                self.offsets[i],
            )
            for i in range(len(self.offsets))
        ]
        rows.extend(
            InboxRow(
                uuid.UUID(q.message_id),
                q.topic,
                q.key,
                q.payload,
                {},
                BYTES,
                q.lane,
                q.created_at,
                q.partition,
                q.offset,
                q.reason,
                q.raw_headers,
            )
            for q in self.quarantined
        )
        return rows

    def part(self, start: int, stop: int) -> InboxBatch:
        """The ordinary records [start, stop) as a batch of their own (nothing quarantined)."""
        part = InboxBatch(self.timestamp_of)
        for name in InboxBatch.__slots__:
            if name not in ("quarantined", "timestamp_of"):
                setattr(part, name, getattr(self, name)[start:stop])
        return part

    def pick(self, indices: Sequence[int]) -> InboxBatch:
        """The ordinary records at `indices`, in that order, as a batch of their own (nothing
        quarantined)."""
        picked = InboxBatch(self.timestamp_of)
        for name in InboxBatch.__slots__:
            if name not in ("quarantined", "timestamp_of"):
                column = getattr(self, name)
                setattr(picked, name, [column[i] for i in indices])
        return picked

    def quarantine(self, index: int, reason: str) -> Quarantined:
        """The ordinary record at `index`, to be stored dead for `reason`."""
        return Quarantined(
            self.message_ids[index],
            storable(self.topics[index]),
            self.keys[index],
            self.payloads[index],
            raw_json(self.raw_headers[index]),
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

    def next_offsets(self) -> dict[tuple[str, int], int]:
        """Where the group resumes once the batch is stored: last offset + 1 per (topic,
        partition), sorted, quarantined records included."""
        last: dict[tuple[str, int], int] = {}
        for topic, partition, offset in (
            *zip(self.topics, self.partitions, self.offsets, strict=True),
            *((q.topic, q.partition, q.offset) for q in self.quarantined),
        ):
            last[topic, partition] = max(last.get((topic, partition), -1), offset)
        return {tp: offset + 1 for tp, offset in sorted(last.items())}


class Positions(InboxBatch):
    """No records: only where a group resumes in each partition, for `Subscriber.commit` (which
    reads `next_offsets`). A consumer that stores a batch's records in several databases
    commits a partition only up to its oldest record not yet stored."""

    __slots__ = ("positions",)

    def __init__(self, positions: dict[tuple[str, int], int]) -> None:
        super().__init__()
        self.positions = dict(sorted(positions.items()))

    def next_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self.positions)


def quarantined_row(row: InboxRow, reason: str | None = None) -> Quarantined:
    """An inbox row as a record to store dead: for `reason`, else for its own `quarantine`.

    A row marked by `decode_record` carries the record's headers as received; another (one
    PostgreSQL refused) has them rebuilt from its user headers and content type.
    """
    raw = row.raw_headers
    if raw is None:
        rebuilt: list[tuple[str, bytes | str | None]] = list(row.headers.items())
        rebuilt.append((CONTENT_TYPE, row.content_type))
        raw = raw_json(rebuilt)
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


def outgoing_batch(messages: Sequence[StoredMessage]) -> list[OutgoingRecord]:
    """`outgoing` of each message."""
    return [outgoing(m) for m in messages]
