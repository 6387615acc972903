"""Inbox work over HTTP for handlers in other languages: rows the Consumer stored are leased one
per key at a time in order, acknowledged as handled (kept for the dedup window as the Handler
keeps them), or failed under the retry policy until dead."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime

import psycopg

from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.lanes import lane_for
from outbox.postgres.inbox import insert_params
from outbox.postgres.inbox_leases import InboxLeases
from outbox.postgres.queries import channel, queries

from .relay_helpers import count, spawn_consumer, spawn_producer, wait_for
from .serve_support import serving


def test_inbox_rows_are_leased_in_key_order_acked_retried_and_dead_lettered(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    url = outbox_database_url
    with (
        serving(url, outbox_log_url) as server,
        spawn_producer(url, outbox_log_url),
        spawn_consumer(url, outbox_log_url, "work", "http-handlers"),
    ):
        sent = [{"payload": {"n": n}, "key": f"k{n % 2}"} for n in range(6)]
        assert server.call("POST", "/v1/topics/work/messages", sent)[0] == 201
        wait_for(lambda: count(url, "consumer_queue") == 6, 60, "six rows in the inbox")

        lease = {"topics": ["work"], "max": 10, "lease_ms": 60_000}
        status, found = server.call("POST", "/v1/inbox/lease", lease)
        assert status == 200
        first = found["messages"]
        # One row per key: the first of k0 and the first of k1.
        assert [m["payload"]["n"] for m in first] == [0, 1]
        assert [m["key"] for m in first] == ["k0", "k1"] and all(m["attempt"] == 1 for m in first)
        assert server.call("POST", "/v1/inbox/lease", {**lease, "wait_ms": 100})[0] == 204

        # k0's row handled: k0's next comes; k1's row failed: k1 waits for its retry.
        assert server.call("POST", "/v1/inbox/ack", {"ids": [first[0]["id"]]}) == (
            200,
            {"acked": 1, "unknown": []},
        )
        status, said = server.call(
            "POST", "/v1/inbox/nack", {"id": first[1]["id"], "error": "boom", "retry_after_ms": 700}
        )
        assert (status, said) == (200, {"id": first[1]["id"], "dead": False, "retry_after_ms": 700})
        status, found = server.call("POST", "/v1/inbox/lease", lease)
        assert [m["payload"]["n"] for m in found["messages"]] == [2]
        time.sleep(0.8)
        status, again = server.call("POST", "/v1/inbox/lease", lease)
        assert [(m["payload"]["n"], m["attempt"]) for m in again["messages"]] == [(1, 2)]

        # Failed until its attempts (5, the Handler's default) are spent: dead, kept.
        row = again["messages"][0]["id"]
        for attempt in range(2, 6):
            status, said = server.call(
                "POST",
                "/v1/inbox/nack",
                {"id": row, "error": f"try {attempt}", "retry_after_ms": 0},
            )
            assert said["dead"] is (attempt == 5), said
            if attempt < 5:
                status, found = server.call("POST", "/v1/inbox/lease", lease)
                assert [m["id"] for m in found["messages"]][:1] == [row]
        status, said = server.call("POST", "/v1/inbox/nack", {"id": row, "error": "x"})
        assert status == 404
        with psycopg.connect(url) as conn:
            assert conn.execute(
                "SELECT last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
            ).fetchall() == [("try 5",)]
            handled = conn.execute(
                "SELECT attempts, handled_count FROM outbox.consumer_processed"
            ).fetchall()
        # Handled at its first lease: one attempt, as a Python handler's first try records
        # (the lease counted it; the ack counted it again).
        assert handled == [(1, 1)]
        # A handled id acked again is unknown; bad input is refused, nothing changed.
        assert server.call("POST", "/v1/inbox/ack", {"ids": [first[0]["id"]]})[1] == {
            "acked": 0,
            "unknown": [first[0]["id"]],
        }
        assert server.call("POST", "/v1/inbox/lease", {"topics": []})[0] == 422
        assert server.call("POST", "/v1/inbox/lease", {"topics": ["bad topic"]})[0] == 422
        # A wait past a float's range is cut to the longest wait as any other (it was a 500).
        huge = {"topics": ["bad topic"], "wait_ms": 10**400}
        assert server.call("POST", "/v1/inbox/lease", huge)[0] == 422
        assert server.call("POST", "/v1/inbox/nack", {"id": 1})[0] == 422


def _store(url: str, key: bytes) -> None:
    """Store one row in the inbox as the Consumer does (its statement, with its NOTIFY)."""
    mid = uuid.uuid4()
    row = InboxRow(
        mid,
        "woken",
        key,
        b"{}",
        {},
        "application/json",
        lane_for(key, mid),
        datetime.now(UTC),
        0,
        0,
    )
    with psycopg.connect(url) as conn:
        conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of([row]), channel("outbox", "consumer_queue")),
        )


def test_two_clients_acking_one_row_at_once_are_told_which_marked_it(
    outbox_database_url: str,
) -> None:
    """A row whose lease ran out was leased again, and both clients ack it at once: the one
    whose ack waited for the other's is told the row is unknown (both were told acked)."""
    url = outbox_database_url
    _store(url, b"k")
    inbox = InboxLeases("outbox")
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        with first.transaction():
            (row,) = inbox.lease(first, ["woken"], 1, 60)
        told: list[list[int]] = []
        with first.transaction():
            assert inbox.ack(first, [row.id]) == []

            def other() -> None:
                with second.transaction():
                    told.append(inbox.ack(second, [row.id]))

            thread = threading.Thread(target=other)
            thread.start()
            time.sleep(0.3)  # the other ack waits for this transaction
        thread.join(10)
    assert told == [[row.id]]


def _serve_rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT relay_id, sleeping FROM outbox.relay_state WHERE queue = 'serve'"
        ).fetchall()


def test_an_inbox_long_poll_is_woken_by_a_stored_row_with_no_handler_running(
    outbox_database_url: str,
) -> None:
    """No Python Handler sleeps here, so only the server's own listener (a 'serve' process in
    relay_state) makes the Consumer's store NOTIFY; without it each lease would wait for the
    next look, 0.4 s after the store. A killed server's row is dropped."""
    url = outbox_database_url
    with serving(url, None) as server:
        assert _serve_rows(url) == []  # no listener before a long poll asks
        lease = {"topics": ["woken"], "max": 10, "wait_ms": 5000, "lease_ms": 60_000}
        waited = []
        for n in range(5):
            stored: list[float] = []

            def later(n: int = n, stored: list[float] = stored) -> None:
                time.sleep(0.1)
                _store(url, f"k{n}".encode())
                stored.append(time.monotonic())

            thread = threading.Thread(target=later)
            thread.start()
            status, found = server.call("POST", "/v1/inbox/lease", lease)
            thread.join()
            assert status == 200 and [m["key"] for m in found["messages"]] == [f"k{n}"], found
            waited.append(time.monotonic() - stored[0])
            assert (
                server.call("POST", "/v1/inbox/ack", {"ids": [found["messages"][0]["id"]]})[0]
                == 200
            )
        print("inbox long poll, store to answer (s):", waited)
        assert sorted(waited)[2] < 0.2, waited  # each look 0.5 s apart: 0.4 s
        rows = _serve_rows(url)
        assert len(rows) == 1 and rows[0][1] is True, rows  # listed, always sleeping
        server.daemon.process.kill()
        server.daemon.process.wait(10)
    with psycopg.connect(url) as conn:  # any relay's look drops the killed server's row
        conn.execute(queries("outbox")["relay_forget_dead"])
    assert _serve_rows(url) == []
