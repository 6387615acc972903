"""A send whose ids outbox generated skips the conflict check; a caller's id keeps it.

`ON CONFLICT (message_id) DO NOTHING` (a speculative insertion) is what makes a caller's
repeated id a `DuplicateMessageId` instead of a unique violation that aborts the caller's
transaction. A new UUIDv7 made by `compose` cannot be taken, so its INSERT goes without that
check, the costliest part of `send` beyond a plain INSERT at 16 writers (issue 26). These tests
pin which statement each send runs, that both write and wake the same, and that an id marked
generated but taken is still refused by the unique index, never written twice.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from outbox import Broker, DuplicateMessageId, Message
from outbox.postgres.queries import channel

broker = Broker()


def _statement(messages: list[Any]) -> str:
    return broker._writer._statement(messages)[0]


def test_generated_ids_skip_the_conflict_check_and_given_ids_keep_it() -> None:
    generated = broker._compose("t", b"x", None, None, None)
    given = broker._compose("t", b"x", None, None, uuid.uuid4())
    assert generated.id_generated and not given.id_generated
    assert "ON CONFLICT (message_id)" not in _statement([generated])
    assert "ON CONFLICT (message_id)" in _statement([given])
    other = broker._compose("t", b"y", None, None, None)
    assert "ON CONFLICT (message_id)" not in _statement([generated, other])
    # One given id among generated ones: the whole batch is checked.
    assert "ON CONFLICT (message_id)" in _statement([generated, given])


def _queued(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT message_id, topic, key, payload, headers, content_type, lane "
            "FROM outbox.producer_queue ORDER BY id"
        ).fetchall()


def test_generated_and_given_ids_write_the_same_rows(outbox_database_url: str) -> None:
    given = [uuid.uuid4() for _ in range(3)]
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        ids = [broker.send(conn, "t", {"n": 1}, key="k", headers={"h": "v"})]
        ids.append(
            broker.send(conn, "t", {"n": 1}, key="k", headers={"h": "v"}, message_id=given[0])
        )
        ids += broker.send_many(conn, [Message("t", {"n": 2}, key="k2") for _ in range(2)])
        ids += broker.send_many(
            conn, [Message("t", {"n": 2}, key="k2", message_id=m) for m in given[1:]]
        )
    rows = _queued(outbox_database_url)
    assert [r[0] for r in rows] == ids
    # Apart from the id (and the lane it picks for a None key), every column is the same.
    assert rows[0][1:] == rows[1][1:]
    assert rows[2][1:] == rows[3][1:] == rows[4][1:] == rows[5][1:]


def test_a_sleeping_relay_is_woken_by_sends_of_generated_ids(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel("outbox", "producer_queue")}"')
        listener.execute(
            "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping) "
            "VALUES ('test-sleeper', 'producer', pg_backend_pid(), true)"
        )
        for send in (
            lambda conn: broker.send(conn, "t", b"1"),
            lambda conn: broker.send_many(conn, [Message("t", b"2"), Message("t", b"3")]),
        ):
            with psycopg.connect(outbox_database_url) as conn, conn.transaction():
                send(conn)
            woken = list(listener.notifies(timeout=5, stop_after=1))
            assert woken, "no NOTIFY reached the sleeping relay's channel"


def test_a_generated_id_that_is_taken_is_refused_not_written_twice(
    outbox_database_url: str,
) -> None:
    """Should a generated id ever be taken, the unique index refuses it: the statement fails
    (the caller's transaction is aborted) and the queue holds the id once."""
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        taken = broker.send(conn, "t", b"first")
    clash = broker._compose("t", b"second", None, None, None)
    object.__setattr__(clash, "message_id", taken)
    assert clash.id_generated
    with psycopg.connect(outbox_database_url) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
            broker._writer.write(conn, [clash])
        # A caller's id that is taken is refused without aborting the transaction, as before.
        with conn.transaction():
            with pytest.raises(DuplicateMessageId):
                broker.send(conn, "t", b"third", message_id=taken)
            broker.send(conn, "t", b"fourth")
    assert [(r[0] == taken, r[3]) for r in _queued(outbox_database_url)] == [
        (True, b"first"),
        (False, b"fourth"),
    ]
