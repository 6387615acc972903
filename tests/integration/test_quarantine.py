"""No record stops the Consumer: what cannot be stored as an ordinary row is quarantined."""

from __future__ import annotations

import base64
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer as KafkaProducer

from outbox import Broker
from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.lanes import lane_for

from .relay_helpers import app_of, consumer_thread, count, producer_thread, running, wait_for


def _produce_raw(bootstrap: str, topic: str, records: list[tuple[Any, bytes, list[Any]]]) -> None:
    producer = KafkaProducer({"bootstrap.servers": bootstrap})
    for key, value, headers in records:
        producer.produce(topic, value=value, key=key, headers=headers, partition=0)
    assert producer.flush(10) == 0


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT source_offset, key, payload, headers, content_type, attempts, dead_at, "
            "last_error, raw_headers FROM outbox.consumer_queue ORDER BY source_offset"
        ).fetchall()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_nul_in_a_header_value_is_stored_as_bytes(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    # defect 2: broker.send(headers={"raw": b"\x00\x01"}) made `outbox consumer` exit for good
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        Broker().send(conn, outbox_topic, {"n": 1}, key="k", headers={"raw": b"\x00\x01"})
        Broker().send(conn, outbox_topic, {"n": 2}, key="k")
    with producer_thread(url, outbox_kafka_bootstrap):
        wait_for(lambda: count(url) == 0, 30, "the relay")
    with consumer_thread(url, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.stored == 2, 30, "both messages stored")
    rows = _rows(url)
    assert rows[0][3] == {"raw": {"b64": _b64(b"\x00\x01")}}
    assert [r[6] for r in rows] == [None, None]


def test_unstorable_records_are_quarantined_and_the_rest_flows(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # defect 2: a NUL in a foreign record's content-type made `outbox consumer` exit for good
    url = outbox_database_url
    _produce_raw(
        outbox_kafka_bootstrap,
        outbox_topic,
        [
            (b"k", b"one", [("content-type", b"text\x00plain"), ("x", None), ("y", b"\xff")]),
            (b"k", b"two", [("v", b"nul\x00inside")]),
            (None, b"three", []),
        ],
    )
    caplog.set_level(logging.WARNING, "outbox.consumer")
    with consumer_thread(url, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.stored == 2 and consumer.quarantined == 1, 30, "3 records")
    rows = _rows(url)
    offset, key, payload, headers, content_type, attempts, dead_at, error, raw = rows[0]
    assert (key, payload, headers, content_type, attempts) == (
        b"k",
        b"one",
        {},
        "application/octet-stream",
        0,
    )
    assert dead_at is not None
    assert "content-type" in error
    assert raw == [
        [_b64(b"content-type"), _b64(b"text\x00plain")],
        [_b64(b"x"), None],
        [_b64(b"y"), _b64(b"\xff")],
    ]
    assert rows[1][3] == {"v": {"b64": _b64(b"nul\x00inside")}}
    assert [r[6] is None for r in rows[1:]] == [True, True]
    warnings = [r for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(warnings) == 1
    assert f"partition 0 offset {offset}" in warnings[0].getMessage()


class _Once:
    """A `Subscriber` that delivers one batch of rows, then nothing; remembers its commits."""

    def __init__(self, rows: list[InboxRow]) -> None:
        self.rows = rows
        self.committed: list[list[InboxRow]] = []

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        rows, self.rows = self.rows, []
        if not rows:
            time.sleep(timeout)
        return InboxBatch.of(rows)

    def commit(self, batch: InboxBatch) -> None:
        self.committed.append(sorted(batch.rows(), key=lambda r: r.offset))

    def close(self) -> None:
        pass


def _row(offset: int, topic: str = "t", headers: dict[str, Any] | None = None) -> InboxRow:
    mid = uuid.uuid4()
    return InboxRow(
        mid, topic, b"k", b"v%d" % offset, headers or {}, "application/json",
        lane_for(b"k", mid), datetime.now(UTC), 0, offset,
    )  # fmt: skip


def test_a_refused_record_is_found_by_bisection_and_quarantined(outbox_database_url: str) -> None:
    # Defence in depth: a record PostgreSQL refuses all the same (here a topic with NUL, which
    # no check looks for) is quarantined alone; the other rows of its batch are stored.
    url = outbox_database_url
    rows = [_row(i) for i in range(7)]
    rows[4] = _row(4, topic="bad\x00topic")
    subscriber = _Once(rows)
    consumer = app_of(url, group="g", topics=["t"], subscribers=lambda: subscriber).consumer()
    with running(consumer):
        wait_for(lambda: bool(subscriber.committed), 30, "the commit")
    assert (consumer.stored, consumer.quarantined) == (6, 1)
    assert [[r.message_id for r in c] for c in subscriber.committed] == [
        [r.message_id for r in rows]
    ]
    stored = _rows(url)
    assert [r[0] for r in stored] == list(range(7))
    dead = [r for r in stored if r[6] is not None]
    assert [r[0] for r in dead] == [4]
    assert "PostgreSQL refused the record" in dead[0][7]


def test_the_column_path_bisects_too(outbox_database_url: str) -> None:
    url = outbox_database_url
    batch = InboxBatch()
    for offset in range(5):
        topic = "bad\x00topic" if offset == 2 else "t"
        batch.add(topic, 0, offset, b"k", b"v", [("h", b"1")], 1_700_000_000_000)
    consumer = app_of(url, group="g", topics=["t"], subscribers=lambda: _Once([])).consumer()
    conn, _ = consumer._store(None, batch)
    assert conn is not None
    conn.close()
    assert (consumer.stored, consumer.quarantined) == (4, 1)
    dead = [r for r in _rows(url) if r[6] is not None]
    assert [(r[0], r[8]) for r in dead] == [(2, [[_b64(b"h"), _b64(b"1")]])]
