"""Putting records on Kafka for the Spark tests, the way outbox's relay does (or a foreign one)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer

from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID


@dataclass
class Sent:
    """One record as produced, with where Kafka put it."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    message_id: uuid.UUID | None
    partition: int = -1
    offset: int = -1
    timestamp_ms: int | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (self.partition, self.offset)


@dataclass
class Batch:
    """Records produced to one topic, in produce order."""

    topic: str
    sent: list[Sent] = field(default_factory=list)

    def ends(self) -> dict[int, int]:
        """Per partition: last offset + 1."""
        ends: dict[int, int] = {}
        for s in self.sent:
            ends[s.partition] = max(ends.get(s.partition, 0), s.offset + 1)
        return ends

    def ids(self) -> set[uuid.UUID]:
        return {s.message_id for s in self.sent if s.message_id is not None}


def outbox_headers(
    message_id: uuid.UUID, created_at: datetime | None = None
) -> list[tuple[str, bytes]]:
    """The headers outbox's relay puts on a record."""
    created = created_at or datetime.now(UTC)
    return [
        (MESSAGE_ID, str(message_id).encode()),
        (CREATED_AT, created.isoformat().encode()),
        (CONTENT_TYPE, b"application/json"),
    ]


def produce(
    bootstrap: str,
    topic: str,
    records: list[Sent],
    *,
    timestamps: list[int] | None = None,
    linger_ms: int = 20,
) -> Batch:
    """Produce in batches (linger), the way a relay does; fills in partitions and offsets."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    errors: list[Any] = []

    def delivered(record: Sent) -> Any:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(error)
                return
            record.partition = message.partition()
            record.offset = message.offset()
            record.timestamp_ms = message.timestamp()[1]

        return report

    for i, record in enumerate(records):
        extra: dict[str, Any] = {}
        if timestamps is not None:
            extra["timestamp"] = timestamps[i]
        while True:
            try:
                producer.produce(
                    topic,
                    value=record.value,
                    key=record.key,
                    headers=record.headers or None,
                    on_delivery=delivered(record),
                    **extra,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors
    return Batch(topic, records)


def outbox_records(count: int, keys: int = 50, start: int = 0) -> list[Sent]:
    """`count` JSON messages in outbox's format over `keys` keys."""
    records = []
    for n in range(start, start + count):
        mid = uuid.uuid4()
        records.append(
            Sent(
                key=f"key-{n % keys}".encode(),
                value=b'{"n": %d}' % n,
                headers=outbox_headers(mid),
                message_id=mid,
            )
        )
    return records
