"""Per-key order on the relay side: which rows `producer_fetch` lets out while a key retries,
one topic per key within a batch, and dead rows that hold nothing."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg

from outbox.core.batches import OutgoingRecord as QueuedRow
from outbox.core.lanes import LANES, lane_for
from outbox.daemons import producer
from outbox.postgres.queries import queries

from .relay_helpers import consume, count, producer_thread, wait_for

sql = queries("outbox")


def _row(
    conn: psycopg.Connection[Any],
    key: bytes | None,
    *,
    topic: str = "t.order",
    attempts: int = 0,
    due_in: float = 0.0,
    payload: bytes = b"{}",
    headers: str = "{}",
) -> int:
    """Insert one producer row by hand; its id."""
    mid = uuid.uuid4()
    row = conn.execute(
        "INSERT INTO outbox.producer_queue (message_id, topic, key, payload, headers, "
        "content_type, lane, attempts, next_attempt_at) VALUES (%s, %s, %s, %s, "
        "CAST(%s AS jsonb), 'application/json', %s, %s, now() + make_interval(secs => %s)) "
        "RETURNING id",
        (mid, topic, key, payload, headers, lane_for(key, mid), attempts, due_in),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _fetch(conn: psycopg.Connection[Any]) -> list[int]:
    params = {"lanes": list(range(LANES)), "limit": 1000, "exclude": []}
    return [r[0] for r in conn.execute(sql["producer_fetch"], params)]


def test_while_a_key_retries_only_its_earliest_retrying_row_goes_out(
    outbox_database_url: str,
) -> None:
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        # Key a: its retry is due, and its later rows (one retrying too, jittered earlier) wait.
        a_retry = _row(conn, b"a", attempts=1, due_in=-1)
        a_later = _row(conn, b"a")
        a_last = _row(conn, b"a", attempts=1, due_in=-5)
        # Key b: its retry is not due: nothing of b goes.
        _row(conn, b"b", attempts=2, due_in=60)
        _row(conn, b"b")
        # Rows without a key have no order: never held.
        free = _row(conn, None)
        free_retry = _row(conn, None, attempts=1, due_in=-1)
        assert _fetch(conn) == [a_retry, free, free_retry]

        # Once a's retry is delivered, no earlier row of a retries: a's rows go in id order.
        conn.execute(sql["producer_delete"], {"ids": [a_retry]})
        assert _fetch(conn) == [a_later, a_last, free, free_retry]

        # A row before the retrying one (a requeued dead row keeps its old id) goes first.
        c_requeued = _row(conn, b"c")
        c_retry = _row(conn, b"c", attempts=1, due_in=-1)
        _row(conn, b"c")
        assert _fetch(conn)[-2:] == [c_requeued, c_retry]


def test_the_idle_relay_waits_for_the_retry_that_holds_the_key(outbox_database_url: str) -> None:
    """producer_next_retry: a later row of a retrying key, due by its own time, is held; the
    time that counts is that of the key's earliest retrying row."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        _row(conn, b"a", attempts=1, due_in=30)
        _row(conn, b"a", attempts=1, due_in=-5)
        row = conn.execute(sql["producer_next_retry"], {"lanes": list(range(LANES))}).fetchone()
        assert row is not None and 25 < float(row[0]) <= 30
        _row(conn, None, attempts=1, due_in=10)  # no key: its own time
        row = conn.execute(sql["producer_next_retry"], {"lanes": list(range(LANES))}).fetchone()
        assert row is not None and 5 < float(row[0]) <= 10


def _queued(id_: int, key: bytes | None, topic: str) -> QueuedRow:
    return QueuedRow(id_, topic, key, b"", "", "", "", None, 0)


def test_a_batch_sends_each_key_to_one_topic() -> None:
    rows = [
        _queued(1, b"k", "A"),
        _queued(2, b"j", "A"),
        _queued(3, b"k", "A"),
        _queued(4, b"k", "B"),  # k changes topic: this row and k's later rows wait
        _queued(5, None, "B"),
        _queued(6, b"k", "A"),
        _queued(7, b"j", "B"),  # j too
        _queued(8, b"j", "A"),
        _queued(9, b"m", "C"),
    ]
    assert [r.id for r in producer.one_topic_per_key(rows)] == [1, 2, 3, 5, 9]
    single = [_queued(i, b"k%d" % (i % 7), "A") for i in range(100)]
    assert producer.one_topic_per_key(single) is single  # the usual batch is not copied


def test_a_keys_row_to_another_topic_never_overtakes_its_failed_row(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    """Key k's first row goes to a topic that does not exist (a retriable failure, after
    message.timeout.ms); its next row, to a topic that exists, must not go out before it.
    Key j, on the good topic only, is not held."""
    url = outbox_database_url
    missing = f"{outbox_topic}-missing"
    with psycopg.connect(url, autocommit=True) as conn:
        first = _row(conn, b"k", topic=missing, payload=b'{"n": 1}')
        second = _row(conn, b"k", topic=outbox_topic, payload=b'{"n": 2}')
        _row(conn, b"j", topic=outbox_topic, payload=b'{"n": 3}')
    options: dict[str, Any] = {
        "kafka_config": {"message.timeout.ms": "1000", "allow.auto.create.topics": "false"},
        "poll_interval": 0.2,
    }
    with producer_thread(url, outbox_kafka_bootstrap, **options) as relay:
        wait_for(lambda: relay.failed > 0, 30, "the first row to fail")
        wait_for(lambda: count(url, where=f"id = {second}") == 1 and relay.relayed >= 1, 10, "j")
        time.sleep(1.0)
        assert count(url, where=f"id IN ({first}, {second})") == 2
    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=1, timeout=10)
    assert [json.loads(m.value()) for m in messages] == [{"n": 3}]


def test_a_dead_row_does_not_hold_its_key_and_a_requeued_one_goes_after(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        dead = _row(conn, b"k", topic=outbox_topic, headers='{"h": 5}', payload=b'{"n": 1}')
        _row(conn, b"k", topic=outbox_topic, payload=b'{"n": 2}')
    with producer_thread(url, outbox_kafka_bootstrap, poll_interval=0.2):
        wait_for(lambda: count(url) == 0, 20, "the queue to drain")
        assert count(url, "producer_dead", f"id = {dead}") == 1
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE outbox.producer_dead SET headers = '{}' WHERE id = %s", (dead,))
            from outbox.postgres import operations as ops

            assert ops.requeue(conn, "outbox", "producer", ops.Selection(ids=(dead,))) == 1
        wait_for(lambda: count(url) == 0, 20, "the requeued row")
    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=2, timeout=10)
    assert [json.loads(m.value()) for m in messages] == [{"n": 2}, {"n": 1}]
