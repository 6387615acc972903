"""The relays' statements keep their plans when the queue tables' statistics are wrong.

A queue table's statistics are stale most of the time: autovacuum last saw it empty (the relay
keeps it so), then a burst arrives. With the planner trusting them, the relay's fetch sorted the
whole backlog for every batch and compared each row with each id of the batch in flight, and the
prepared delete kept a plan made for a one-row table that compared each row of the backlog with
each id. A relay that had been idle drained a burst of 50,000 messages at 1/8 of its usual
speed. These tests build that state and look at the plans the relay gets with its own session
settings (`OutboxStore.planner_settings`; docs/decisions/0007).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import Broker, Message
from outbox.core.lanes import LANES
from outbox.postgres.outbox_store import Ids, OutboxStore
from outbox.postgres.queries import queries

BACKLOG = 20_000
BATCH = 1_000

sql = queries("outbox")


def _fill(conn: psycopg.Connection[Any], count: int, prefix: str) -> None:
    with conn.transaction():
        Broker().send_many(
            conn, [Message("plans.t", {"i": i}, key=f"{prefix}{i}") for i in range(count)]
        )


@pytest.fixture
def relay_session(outbox_database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection with the settings the Producer gives its own session, on a table that
    autovacuum last saw empty."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        _fill(conn, 1, "warm-up")
        conn.execute("DELETE FROM outbox.producer_queue")
        conn.execute("VACUUM ANALYZE outbox.producer_queue")
        for setting in OutboxStore.planner_settings:
            conn.execute(f"SET {setting}")
        OutboxStore.adapt(conn)
        yield conn


def _stale(conn: psycopg.Connection[Any]) -> None:
    """Fill the table behind statistics that still say it is empty."""
    _fill(conn, BACKLOG, "k")
    row = conn.execute(
        "SELECT reltuples FROM pg_class WHERE oid = 'outbox.producer_queue'::regclass"
    ).fetchone()
    assert row is not None and row[0] <= 1, "the statistics should still say empty"


def _first_ids(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute("SELECT id FROM outbox.producer_queue ORDER BY id LIMIT %s", (BATCH,))
    return [r[0] for r in rows]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _explain(
    conn: psycopg.Connection[Any], statement: str, params: Any = None
) -> list[dict[str, Any]]:
    row = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params, prepare=False
    ).fetchone()
    assert row is not None
    return list(_nodes(row[0][0]["Plan"]))


def test_fetch_ahead_reads_about_one_batch_not_the_backlog(
    relay_session: psycopg.Connection[Any],
) -> None:
    _stale(relay_session)
    exclude = Ids(_first_ids(relay_session))  # bound as the relay binds it
    params = {"lanes": list(range(LANES)), "limit": BATCH, "exclude": exclude}
    nodes = _explain(relay_session, sql["producer_fetch"], params)

    assert not [n for n in nodes if n["Node Type"] == "Sort"], nodes
    # The ids in flight are not joined row by row (each row against each id).
    assert not [n for n in nodes if n["Node Type"] == "Function Scan" and n["Actual Loops"] > 1]
    scans = [n for n in nodes if n.get("Alias") == "q"]
    assert len(scans) == 1
    # The rows of the batch in flight, then the next batch: not the backlog.
    read = scans[0]["Actual Rows"] + scans[0].get("Rows Removed by Filter", 0)
    assert read <= 2 * BATCH + 10, scans[0]
    assert nodes[0]["Actual Rows"] == BATCH
    # The ids in flight are a bigint[] constant of the plan, which PostgreSQL hashes: not a
    # parameter, nor text converted for each row.
    assert "<> ALL ('{" in scans[0]["Filter"] and "::bigint[]))" in scans[0]["Filter"], scans[0]
    assert "::text" not in scans[0]["Filter"], scans[0]


def test_the_prepared_delete_is_planned_for_its_ids(
    relay_session: psycopg.Connection[Any],
) -> None:
    """psycopg prepares the relay's delete after five executions, and PostgreSQL then keeps a
    generic plan made while the relay kept up: a one-row table, where a sequential scan is
    cheapest, with the ids as a parameter, which is not hashed. After a burst that plan
    compared every row of the backlog with every id of each batch. The relay's session plans
    each execution for its ids instead."""
    delete = sql["producer_delete"].replace("%(ids)t", "$1")
    relay_session.execute(f"PREPARE relay_delete(bigint[]) AS {delete}")
    for _ in range(6):  # while the table is empty: where a generic plan would be chosen
        relay_session.execute("EXECUTE relay_delete('{0}')")
    _stale(relay_session)
    array = "{" + ",".join(map(str, _first_ids(relay_session))) + "}"
    with relay_session.transaction():
        nodes = _explain(relay_session, f"EXECUTE relay_delete('{array}')")
        raise psycopg.Rollback()
    scans = [n for n in nodes if n.get("Relation Name") == "producer_queue"]
    assert scans, nodes
    conditions = " ".join(str(n.get("Index Cond", "")) + str(n.get("Filter", "")) for n in scans)
    # Planned with the ids as a constant, which PostgreSQL looks up in the index or hashes.
    assert "$1" not in conditions, conditions
    assert scans[-1]["Actual Rows"] == BATCH


def test_the_handler_claim_looks_its_ids_up(outbox_database_url: str) -> None:
    """The Handler claims a transaction's rows by id. With the pending conditions in the same
    WHERE and no statistics yet, the planner read the whole pending index and tested each entry
    against the ids: 50 ms per claim of 100 rows at 50,000 pending. It looks them up now, and
    so does its deletion of a row whose message id was handled meanwhile (migration 0007)."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.consumer_queue (message_id, topic, key, payload, content_type, "
            "lane) SELECT gen_random_uuid(), 'plans.t', ('k' || g)::bytea, '{}'::bytea, "
            "'application/json', g %% 64 FROM generate_series(1, %s) g",
            (BACKLOG,),
        )
        ids = [r[0] for r in conn.execute("SELECT id FROM outbox.consumer_queue LIMIT 100")]
        conn.execute(  # its message was handled meanwhile: deleted, not claimed
            "INSERT INTO outbox.consumer_processed (message_id, id, topic, lane, created_at)"
            " SELECT message_id, id, topic, lane, created_at FROM outbox.consumer_queue"
            " WHERE id = %s",
            (ids[0],),
        )
        with conn.transaction():
            nodes = _explain(conn, sql["handler_claim_many"], {"ids": ids})
            raise psycopg.Rollback()
    scans = [
        n
        for n in nodes
        if n.get("Relation Name") == "consumer_queue" and n["Node Type"] != "ModifyTable"
    ]
    assert len(scans) == 2, nodes  # the lock, the deletion
    for scan in scans:
        assert scan["Node Type"] != "Seq Scan", scan
        read = scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
        assert read <= len(ids), scan
    assert nodes[0]["Actual Rows"] == len(ids) - 1  # the handled one is not claimed


@pytest.mark.parametrize("statement", ["handler_fetch", "handler_claim_next"])
def test_the_handler_fetch_reads_about_one_batch_not_the_backlog(
    outbox_database_url: str, statement: str
) -> None:
    """The Handler fetches the oldest pending rows of all its lanes (its runner's look; its
    workers fetch and claim them in one statement). With the pending index on (lane, id) that
    meant reading and sorting every pending row for each batch (36 ms per fetch of 200 at
    60,000 pending); and the keys in retry, looked up per owned lane, made a planner that
    believed the table empty read every pending row instead of the small retry index. In id
    order (migration 0005), both read about one batch, whatever the statistics say."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox.consumer_queue")  # seen empty
        conn.execute(
            "INSERT INTO outbox.consumer_queue (message_id, topic, key, payload, content_type, "
            "lane) SELECT gen_random_uuid(), 'plans.t', ('k' || g %% 1000)::bytea, '{}'::bytea, "
            "'application/json', g %% 64 FROM generate_series(1, %s) g",
            (BACKLOG,),
        )
        # A key in retry, whose later rows the fetch holds back.
        conn.execute(
            "UPDATE outbox.consumer_queue SET attempts = 1, next_attempt_at = now() + '1 hour' "
            "WHERE id = (SELECT min(id) FROM outbox.consumer_queue)"
        )
        params = {"lanes": list(range(LANES)), "limit": 200, "unordered": []}
        nodes = _explain(conn, sql[statement], params)
        held = conn.execute(
            "SELECT count(*) FROM outbox.consumer_queue WHERE key = "
            "(SELECT key FROM outbox.consumer_queue ORDER BY id LIMIT 1)"
        ).fetchone()
    assert held is not None
    assert not [n for n in nodes if n["Node Type"] == "Sort" and n["Actual Rows"] > 200], nodes
    read = sum(
        n["Actual Rows"] * n.get("Actual Loops", 1) + n.get("Rows Removed by Filter", 0)
        for n in nodes
        if n.get("Relation Name") == "consumer_queue"
    )
    # One batch, the held rows of the retrying key skipped on the way, and the retry index.
    assert read <= 200 + 10 + held[0], nodes
    assert nodes[0]["Actual Rows"] == 200


def test_the_consumer_insert_probes_the_handled_ids_not_all_of_them(
    outbox_database_url: str,
) -> None:
    """The Consumer's insert refuses ids kept in consumer_processed (migration 0007). With a
    day of handled ids behind statistics that say the table is empty, it must still look each
    stored record's id up in the primary key, not read every handled id per batch."""
    from tests.integration.test_inbox import put

    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox.consumer_processed")  # seen empty
        conn.execute(
            "INSERT INTO outbox.consumer_processed (message_id, id, topic, lane, created_at)"
            " SELECT gen_random_uuid(), g, 'plans.t', g %% 64, now()"
            " FROM generate_series(1, %s) g",
            (BACKLOG,),
        )
    put(outbox_database_url, "plans.t", [{"n": 0}], ["k"])  # a first batch: plans are made
    with psycopg.connect(outbox_database_url) as conn:
        batch = [str(mid) for mid in put(outbox_database_url, "plans.t", [{}] * 3, [None] * 3)]
        statement = sql["inbox_insert"].replace("%(message_ids)b", "%(message_ids)s")
        params = {
            "message_ids": [*batch, "00000000-0000-0000-0000-000000000001"],
            "topics": ["plans.t"] * 4,
            "keys": [None] * 4,
            "payloads": [b"{}"] * 4,
            "headers": ["{}"] * 4,
            "content_types": ["application/json"] * 4,
            "lanes": [0] * 4,
            "created_ats": ["2026-11-27T00:00:00Z"] * 4,
            "partitions": [0] * 4,
            "offsets": [0] * 4,
            "channel": "unused",
        }
        for name in list(params):
            statement = statement.replace(f"%({name})b", f"%({name})s")
        with conn.transaction():
            nodes = _explain(conn, statement, params)
            raise psycopg.Rollback()
    scans = [n for n in nodes if n.get("Relation Name") == "consumer_processed"]
    assert scans, nodes
    for scan in scans:
        assert scan["Node Type"] != "Seq Scan", scan
        read = scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
        assert read <= 4, scan


SCHEDULED = 20_000


def _schedule(conn: psycopg.Connection[Any], count: int, delay: Any, prefix: str) -> None:
    with conn.transaction():
        Broker().send_many(
            conn,
            [
                Message("plans.later", {"i": i}, key=f"{prefix}{i}", delay=delay)
                for i in range(count)
            ],
        )


def test_messages_due_later_are_not_read_by_the_fetch_nor_by_the_move_of_due_ones(
    relay_session: psycopg.Connection[Any],
) -> None:
    """Many messages due later (decision 21): the relay's fetch reads `producer_queue`, where
    they are not, as without them; the move of the due ones (`producer_promote`) reads the
    index of due times from its start and stops after the due rows and the next later one,
    with the table's statistics still saying it is empty; the rows it moves then leave
    through the fetch like any other."""
    from datetime import timedelta

    _schedule(relay_session, SCHEDULED, timedelta(hours=1), "later")
    _schedule(relay_session, 10, timedelta(microseconds=1), "due")  # due a microsecond later
    _fill(relay_session, BATCH, "now")
    row = relay_session.execute(
        "SELECT reltuples FROM pg_class WHERE oid = 'outbox.producer_scheduled'::regclass"
    ).fetchone()
    assert row is not None and row[0] <= 1, "the statistics should still say empty"
    lanes = list(range(LANES))

    fetch = _explain(
        relay_session, sql["producer_fetch"], {"lanes": lanes, "limit": BATCH, "exclude": Ids([])}
    )
    assert not [n for n in fetch if n.get("Relation Name") == "producer_scheduled"], fetch
    scans = [n for n in fetch if n.get("Alias") == "q"]
    assert scans[0]["Actual Rows"] + scans[0].get("Rows Removed by Filter", 0) <= BATCH + 10

    with relay_session.transaction():
        nodes = _explain(relay_session, sql["producer_promote"], {"lanes": lanes, "limit": BATCH})
        raise psycopg.Rollback()
    shown = [
        (
            n["Node Type"],
            n.get("Relation Name"),
            n.get("Index Name"),
            n.get("Actual Rows"),
            n.get("Rows Removed by Filter"),
        )
        for n in nodes
    ]
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], "\n".join(map(str, shown))
    # The one sort is of the rows moved (into due-time order, for their new ids).
    assert all(n["Actual Rows"] <= 10 for n in nodes if n["Node Type"] == "Sort"), shown
    reads = [
        n
        for n in nodes
        if n.get("Relation Name") == "producer_scheduled" and "Scan" in n["Node Type"]
    ]
    assert reads and all(n["Node Type"] != "Seq Scan" for n in reads), "\n".join(map(str, shown))
    # The due rows and the first later one, not the 20,000 due later.
    assert sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in reads) <= 100, reads
    assert nodes[0]["Actual Rows"] == 1
    # Its one sort (of the rows moved) costs 10^10 with sorts off: past jit_above_cost, JIT
    # compiled the statement at every execution, 0.4 s each (the relay's session has none).
    with relay_session.transaction():
        row = relay_session.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql["producer_promote"],
            {"lanes": lanes, "limit": BATCH},
            prepare=False,
        ).fetchone()
        raise psycopg.Rollback()
    assert row is not None and "JIT" not in row[0][0], row[0][0].get("JIT")
    moved, due = OutboxStore("outbox").promote(relay_session, lanes, BATCH)
    assert moved == 10 and due is not None and 3500 < due <= 3600
