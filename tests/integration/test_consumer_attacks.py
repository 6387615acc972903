"""Records with odd fields cannot stop or fool the Consumer: each is stored, or quarantined
with what can be read of it, and the records after it flow."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from confluent_kafka import Producer as KafkaProducer

from outbox.core.batches import InboxBatch
from outbox.kafka.subscriber import kafka_millis

from .relay_helpers import consumer_thread, wait_for

#: Year 10000: past what Python's datetime holds.
FAR_FUTURE_MS = 253_402_300_800_000


def _produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "message.max.bytes": 5_000_000})
    for record in records:
        producer.produce(topic, partition=0, **record)
    assert producer.flush(30) == 0


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT source_offset, dead_at IS NOT NULL, last_error, payload, key, created_at, "
            "jsonb_array_length(COALESCE(raw_headers, '[]')), headers "
            "FROM outbox.consumer_queue ORDER BY source_offset"
        ).fetchall()


def test_odd_records_are_stored_or_quarantined_and_the_rest_flows(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    many = [(f"h{i}", b"v") for i in range(10_000)]
    _produce(
        outbox_kafka_bootstrap,
        outbox_topic,
        [
            # 0: a header name given as bytes that are not UTF-8: confluent-kafka sends their
            # repr as the name (a Java producer can send the bytes; see the test below)
            {"key": b"k", "value": b"a", "headers": [(b"\xff\xfe", b"v"), ("ok", b"1")]},
            # 1: a timestamp past what datetime holds, no created-at header
            {"key": b"k", "value": b"b", "timestamp": FAR_FUTURE_MS},
            # 2: a tombstone
            {"key": b"k", "value": None},
            # 3: a 100 KB key, a 1 MB header value
            {"key": b"K" * 100_000, "value": b"c", "headers": [("big", b"x" * 1_000_000)]},
            # 4: 10,000 headers
            {"key": b"k", "value": b"d", "headers": many},
            # 5: an empty header name, an empty key
            {"key": b"", "value": b"e", "headers": [("", b"v")]},
            # 6: an ordinary record after them all
            {"key": b"k", "value": b"f", "headers": [("outbox-message-id", str(uuid.uuid4()))]},
        ],
    )
    with consumer_thread(url, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.received == 7, 60, "all 7 records stored")
    rows = _rows(url)
    assert [r[0] for r in rows] == list(range(7))
    by_offset = {r[0]: r for r in rows}
    assert by_offset[0][7] == {"b'\\xff\\xfe'": "v", "ok": "1"}
    # The timestamp Python cannot hold made the Consumer exit; now the row's time is now.
    assert by_offset[1][1] is False and by_offset[1][5] is not None
    assert bytes(by_offset[2][3]) == b""  # a tombstone is stored with an empty payload
    assert len(bytes(by_offset[3][4])) == 100_000
    assert len(by_offset[4][7]) == 10_000
    assert by_offset[5][7] == {"": "v"} and bytes(by_offset[5][4]) == b""
    assert [r[1] for r in rows] == [False] * 7


class _Message:
    """A record whose headers() raises, as confluent-kafka's does for some names."""

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> Any:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def test_a_record_whose_headers_cannot_be_read_is_quarantined() -> None:
    from outbox.kafka.subscriber import _fields

    batch = InboxBatch(kafka_millis)
    batch.add(*_fields(_Message()), _Message())  # type: ignore[arg-type]
    [record] = batch.quarantined
    assert "headers cannot be read" in record.reason
    assert (record.key, record.payload, record.offset) == (b"k", b"v", 7)
