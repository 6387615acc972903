"""The relay under bad rows and odd queue states: unsendable rows go dead alone, dead rows cost
the fetch nothing, and an idle relay whose rows are all held does not spin."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

from outbox.core.lanes import LANES, lane_for
from outbox.postgres.outbox_store import OutboxStore
from outbox.postgres.queries import queries

from .relay_helpers import consume, count, producer_thread, wait_for

sql = queries("outbox")


def _row(
    conn: psycopg.Connection[Any],
    key: bytes | None,
    topic: str,
    *,
    payload: bytes = b"{}",
    headers: str = "{}",
    attempts: int = 0,
    due_in: float = 0.0,
    table: str = "producer_queue",
) -> int:
    mid = uuid.uuid4()
    row = conn.execute(
        f"INSERT INTO outbox.{table} (message_id, topic, key, payload, headers, content_type, "
        "lane, attempts, next_attempt_at) VALUES (%s, %s, %s, %s, CAST(%s AS jsonb), "
        "'application/json', %s, %s, now() + make_interval(secs => %s)) RETURNING id",
        (mid, topic, key, payload, headers, lane_for(key, mid), attempts, due_in),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_rows_that_cannot_be_records_go_dead_and_the_rest_is_delivered(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        good = [_row(conn, b"g", outbox_topic, payload=b'{"n": %d}' % i) for i in range(3)]
        bad = {
            "array": _row(conn, b"k1", outbox_topic, headers="[1, 2]"),
            "number": _row(conn, b"k2", outbox_topic, headers='{"h": 5}'),
            "no b64": _row(conn, b"k3", outbox_topic, headers='{"h": {"x": 1}}'),
            "bad b64": _row(conn, b"k4", outbox_topic, headers='{"h": {"b64": "a"}}'),
            "topic": _row(conn, b"k5", "a bad topic\\name!"),
            "oversize": _row(conn, b"k6", outbox_topic, payload=b"x" * 2_000_000),
            "queue": _row(conn, b"k7", outbox_topic, payload=b"y" * 300_000),
        }
        good.append(_row(conn, b"g", outbox_topic, payload=b'{"n": 3}', headers='{"h": "v"}'))
    # A local queue smaller than one of the rows: produce() raises BufferError for it forever.
    options = {"kafka_config": {"queue.buffering.max.kbytes": "200"}, "poll_interval": 0.2}
    with producer_thread(url, outbox_kafka_bootstrap, **options) as relay:
        # The relay counts a batch after its delete committed: wait for both.
        wait_for(lambda: count(url) == 0 and relay.relayed >= len(good), 30, "the queue to drain")
        assert relay.relayed == len(good)
    with psycopg.connect(url) as conn:
        dead = dict(conn.execute("SELECT id, last_error FROM outbox.producer_dead").fetchall())
    assert set(dead) == set(bad.values()), dead
    for what, id_ in bad.items():
        assert dead[id_], what
    assert "not outbox's form" in dead[bad["number"]]
    assert "MSG_SIZE_TOO_LARGE" in dead[bad["oversize"]]
    assert "local queue" in dead[bad["queue"]]
    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=len(good), timeout=10)
    assert [json.loads(m.value()) for m in messages] == [{"n": i} for i in range(4)]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _buffers(plan: dict[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def test_a_fetch_does_not_read_the_dead_rows(outbox_database_url: str) -> None:
    """100,000 dead rows at the head of the queue: the fetch reads the live rows only."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.producer_queue (message_id, topic, key, payload, content_type, "
            "lane) SELECT gen_random_uuid(), 't.dead', ('k' || g)::bytea, 'x', 'text/plain', "
            "mod(g, 64) FROM generate_series(1, 100000) g"
        )
        ids = [r[0] for r in conn.execute("SELECT id FROM outbox.producer_queue ORDER BY id")]
        conn.execute(
            sql["producer_fail"],
            {"ids": ids, "errors": ["permanent"] * len(ids), "delays": [None] * len(ids)},
        )
        for i in range(10):
            _row(conn, b"live%d" % i, "t.live")
        conn.execute("VACUUM ANALYZE outbox.producer_queue")
        for setting in OutboxStore.planner_settings:
            conn.execute(f"SET {setting}")
        params = {"lanes": list(range(LANES)), "limit": 1000, "exclude": []}
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql["producer_fetch"], params
        ).fetchone()
        assert row is not None
        plan = row[0][0]["Plan"]
        assert plan["Actual Rows"] == 10
        # The scan of the queue in id order reads a page or two, not the dead rows' hundreds.
        # (The probe of the retrying rows costs a descent of their index per lane, dead rows
        # or not.)
        scans = [n for n in _nodes(plan) if n.get("Alias") == "q"]
        assert len(scans) == 1
        assert _buffers(scans[0]) < 20, scans[0]
        assert count(outbox_database_url, "producer_dead") == 100_000


def _commits(conn: psycopg.Connection[Any]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_idle_relay_whose_due_rows_are_held_does_not_spin(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    """A key's first retry waits a minute; a later row of the key, failed too with a jittered
    retry time, is due but held: nothing can go. The relay must sleep, not poll in a loop."""
    url = outbox_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        _row(conn, b"k", "t.idle", attempts=1, due_in=60)
        _row(conn, b"k", "t.idle", attempts=1, due_in=-5)
        _row(conn, b"k", "t.idle", attempts=1, due_in=-4)
        with producer_thread(url, outbox_kafka_bootstrap, poll_interval=0.5):
            wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the relay to sleep")
            time.sleep(1.5)  # past the quick idle polls, and stats flushed at most once a second
            before = _commits(conn)
            time.sleep(3.0)
            rate = (_commits(conn) - before) / 3.0
    assert rate < 30, f"{rate:.0f} transactions a second while idle"


def test_the_handlers_next_retry_is_when_a_held_key_is_free(outbox_database_url: str) -> None:
    """handler_fetch holds a key while any of its retrying rows is not due: the idle handler
    waits for the latest of them, not for one that is due but held."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        _row(conn, b"k", "t.h", attempts=1, due_in=30, table="consumer_queue")
        _row(conn, b"k", "t.h", attempts=1, due_in=-5, table="consumer_queue")
        row = conn.execute(sql["handler_next_retry"], {"lanes": list(range(LANES))}).fetchone()
        assert row is not None and 25 < float(row[0]) <= 30
        _row(conn, None, "t.h", attempts=1, due_in=10, table="consumer_queue")
        row = conn.execute(sql["handler_next_retry"], {"lanes": list(range(LANES))}).fetchone()
        assert row is not None and 5 < float(row[0]) <= 10
