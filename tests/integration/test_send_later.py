"""`send(..., deliver_at=, delay=)` and `cancel` on every send path (decision 21): the due time
is the database's clock plus the delay, or the time given; a message due later waits in
`producer_scheduled`, one due now in `producer_queue`; bad input raises before anything is
written; `cancel` takes back a scheduled message in the caller's transaction."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox import Broker, DuplicateMessageId, InvalidDueTime, Message, Topic
from outbox.postgres.lanes import lock_class
from outbox.postgres.migrate import sqlalchemy_url
from outbox.testing import sent

broker = Broker()


@dataclass
class Reminder:
    n: int


def _scheduled(url: str) -> dict[uuid.UUID, tuple[datetime, datetime]]:
    """message id -> (deliver_at, the row's created_at) of every scheduled row."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id, deliver_at, created_at FROM outbox.producer_scheduled"
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _queued(url: str) -> set[uuid.UUID]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT message_id FROM outbox.producer_queue")}


def test_delay_is_counted_from_the_database_clock(outbox_database_url: str) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        # The transaction's now() is its start: the due time is that plus the delay, whatever
        # the client's clock says.
        db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        later = broker.send(conn, "later.t", {"n": 1}, delay=timedelta(minutes=5))
        now = broker.send(conn, "later.t", {"n": 2})
    scheduled = _scheduled(url)
    assert set(scheduled) == {later}
    assert scheduled[later][0] == db_now + timedelta(minutes=5)
    assert _queued(url) == {now}


def test_deliver_at_is_stored_as_given_and_a_past_one_is_due_now(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    at = datetime(2999, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    with psycopg.connect(url) as conn, conn.transaction():
        later = broker.send(conn, "later.t", b"x", deliver_at=at)
        past = broker.send(conn, "later.t", b"y", deliver_at=datetime(2000, 1, 1, tzinfo=UTC))
        zero = broker.send(conn, "later.t", b"z", delay=timedelta(0))
    assert _scheduled(url)[later][0] == at
    assert _queued(url) == {past, zero}


def test_deliver_at_with_an_offset_postgresql_refuses_is_the_same_instant(
    outbox_database_url: str,
) -> None:
    """Python allows offsets up to 23:59, PostgreSQL up to 15:59: the time is sent as its
    instant in UTC, not refused by the server (which aborted the caller's transaction)."""
    at = datetime(2999, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=23, minutes=59)))
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        later = broker.send(conn, "later.t", b"x", deliver_at=at)
    assert _scheduled(outbox_database_url)[later][0] == at


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"deliver_at": datetime(2999, 1, 1)}, "naive"),
        ({"deliver_at": "2999-01-01T00:00:00Z"}, "expected a datetime"),
        ({"delay": timedelta(seconds=-1)}, "negative"),
        ({"delay": 5}, "expected a datetime.timedelta"),
        ({"delay": timedelta(days=4_000_000)}, "longer than"),
        (
            {"delay": timedelta(seconds=1), "deliver_at": datetime(2999, 1, 1, tzinfo=UTC)},
            "not both",
        ),
        (
            {"deliver_at": datetime.max.replace(tzinfo=timezone(timedelta(hours=-1)))},
            "out of range in UTC",
        ),
    ],
)
def test_bad_due_times_are_refused_before_anything_is_written(
    outbox_database_url: str, options: dict[str, Any], says: str
) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        with pytest.raises(InvalidDueTime, match=says):
            broker.send(conn, "later.t", b"x", **options)
        with pytest.raises(InvalidDueTime, match=f"send_many item 1: .*{says}"):
            broker.send_many(conn, [Message("later.t", b"a"), Message("later.t", b"b", **options)])
        # The transaction is still usable: nothing was sent to the server.
        broker.send(conn, "later.t", b"ok")
    assert len(_queued(outbox_database_url)) == 1
    assert _scheduled(outbox_database_url) == {}


def test_send_many_mixes_due_times_and_a_taken_id_writes_nothing(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        ids = broker.send_many(
            conn,
            [
                Message("later.t", b"now"),
                Message("later.t", b"later", delay=timedelta(hours=1)),
                Message("later.t", b"at", deliver_at=datetime(2999, 1, 1, tzinfo=UTC)),
            ],
        )
    assert _queued(url) == {ids[0]}
    assert set(_scheduled(url)) == {ids[1], ids[2]}
    # An id a waiting message has is refused, in either table, and the batch writes nothing
    # (the DuplicateMessageId of a send without a due time).
    with psycopg.connect(url) as conn, conn.transaction():
        with pytest.raises(DuplicateMessageId, match="in producer_queue or producer_scheduled"):
            broker.send_many(
                conn,
                [
                    Message("later.t", b"fresh", delay=timedelta(hours=1)),
                    Message("later.t", b"dup", message_id=ids[1], delay=timedelta(hours=2)),
                ],
            )
        with pytest.raises(DuplicateMessageId, match="in producer_queue or producer_scheduled"):
            broker.send(conn, "later.t", b"dup", message_id=ids[0], delay=timedelta(hours=1))
        # A send due now whose id a message due later has (it was written a second time).
        with pytest.raises(DuplicateMessageId, match="in producer_queue or producer_scheduled"):
            broker.send(conn, "later.t", b"dup", message_id=ids[1])
        with pytest.raises(DuplicateMessageId, match="in producer_queue or producer_scheduled"):
            broker.send_many(
                conn,
                [Message("later.t", b"fresh"), Message("later.t", b"dup", message_id=ids[2])],
            )
    assert len(_scheduled(url)) == 2 and len(_queued(url)) == 1


def test_async_and_sqlalchemy_paths_schedule_and_cancel(outbox_database_url: str) -> None:
    url = outbox_database_url
    engine = create_engine(sqlalchemy_url(url))
    try:
        with Session(engine) as session:
            a = broker.send(session, "later.t", b"a", delay=timedelta(hours=1))
            session.commit()
        with engine.connect() as conn:
            b = broker.send_many(conn, [Message("later.t", b"b", delay=timedelta(hours=1))])[0]
            conn.commit()
        assert set(_scheduled(url)) == {a, b}
        with Session(engine) as session:
            assert broker.cancel(session, a) is True
            session.commit()
        with engine.connect() as conn:
            assert broker.cancel(conn, str(b)) is True
            conn.commit()
    finally:
        engine.dispose()
    assert _scheduled(url) == {}

    async def run() -> tuple[uuid.UUID, uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            async with conn.transaction():
                c = await broker.send_async(conn, "later.t", b"c", delay=timedelta(hours=1))
                d = (
                    await broker.send_many_async(
                        conn, [Message("later.t", b"d", delay=timedelta(hours=1))]
                    )
                )[0]
            async with conn.transaction():
                assert await broker.cancel_async(conn, c) is True
        async_engine = create_async_engine(sqlalchemy_url(url).replace("psycopg", "psycopg_async"))
        try:
            async with AsyncSession(async_engine) as session:
                assert await broker.cancel_async(session, d) is True
                assert await broker.cancel_async(session, d) is False
                await session.commit()
        finally:
            await async_engine.dispose()
        return c, d

    asyncio.run(run())
    assert _scheduled(url) == {}


def test_cancel_is_in_the_callers_transaction(outbox_database_url: str) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn:
        with conn.transaction():
            later = broker.send(conn, "later.t", b"x", delay=timedelta(hours=1))
            now = broker.send(conn, "later.t", b"y")
        with conn.transaction(force_rollback=True):
            assert broker.cancel(conn, later) is True
        assert set(_scheduled(url)) == {later}  # rolled back: still scheduled
        with conn.transaction():
            assert broker.cancel(conn, later) is True
            assert broker.cancel(conn, later) is False
            assert broker.cancel(conn, uuid.uuid4()) is False
        with pytest.raises(Exception, match="not a UUID"):
            broker.cancel(conn, "nope")
    assert _scheduled(url) == {}
    assert _queued(url) == {now}


def test_a_queued_message_is_taken_back_only_while_no_relay_can_be_sending_it(
    outbox_database_url: str,
) -> None:
    """Sent without a due time, a message waits in producer_queue: cancel takes it back while
    no relay holds its lane (the relays' advisory lock) and it was never attempted; a relay
    that owns the lane may be sending it, so then cancel says False and leaves it; and while
    the cancelling transaction is open, no relay can take the lane."""
    url = outbox_database_url
    lock = lock_class("outbox", "producer_queue")
    with psycopg.connect(url, autocommit=True) as relay, psycopg.connect(url) as conn:
        with conn.transaction():
            held = broker.send(conn, "later.t", b"held", key="k1")
            free = broker.send(conn, "later.t", b"free", key="k2")
            tried = broker.send(conn, "later.t", b"tried", key="k3")
        lanes = dict(conn.execute("SELECT message_id, lane FROM outbox.producer_queue"))
        assume_lanes = {lanes[held], lanes[free], lanes[tried]}
        if len(assume_lanes) < 3:
            pytest.skip("the keys share a lane")  # crc32 of k1, k2, k3: they do not
        relay.execute("SELECT pg_advisory_lock(%s, %s)", (lock, lanes[held]))  # a relay's lane
        conn.execute("UPDATE outbox.producer_queue SET attempts = 1 WHERE message_id = %s", [tried])
        conn.commit()
        with conn.transaction():
            assert broker.cancel(conn, held) is False  # its relay may be sending it
            assert broker.cancel(conn, tried) is False  # a failed attempt may have landed
            assert broker.cancel(conn, free) is True
            # The cancelling transaction holds the free lane: a relay cannot take it now.
            taken = relay.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (lock, lanes[free])
            ).fetchone()
            assert taken == (False,)
        taken = relay.execute("SELECT pg_try_advisory_lock(%s, %s)", (lock, lanes[free])).fetchone()
        assert taken == (True,)  # released with the transaction
    assert _queued(url) == {held, tried}


def test_typed_topic_and_sent_show_the_due_time(outbox_database_url: str) -> None:
    url = outbox_database_url
    reminders = Topic("later.reminders", Reminder)
    with psycopg.connect(url) as conn, conn.transaction(), sent(conn) as messages:
        db_now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        broker.send(conn, reminders, Reminder(1), delay=timedelta(seconds=90))
        broker.send(conn, reminders, Reminder(2))
    by_payload = {m.payload["n"]: m for m in messages}
    assert len(messages) == 2
    assert by_payload[1].deliver_at == db_now + timedelta(seconds=90)
    assert by_payload[2].deliver_at is None
