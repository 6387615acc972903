"""Wake-ups: a send notifies only while a relay sleeps; without any NOTIFY rows still go out."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from outbox import Backoff, Broker, Handlers, InboxMessage, Message
from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.lanes import LANES, lane_for
from outbox.postgres.inbox import insert_params
from outbox.postgres.queries import channel, queries
from outbox.postgres.relay_stores import PostgresOutboxSession

from .relay_helpers import count, handler_thread, producer_thread, wait_for

broker = Broker()


def put_inbox(url: str, topic: str, payloads: list[bytes]) -> None:
    """Rows in consumer_queue as the Consumer stores them (with its NOTIFY)."""
    rows = []
    for offset, payload in enumerate(payloads):
        mid = uuid.uuid4()
        row = (mid, topic, b"k", payload, {}, "application/json", lane_for(b"k", mid))
        rows.append(InboxRow(*row, datetime.now(UTC), 0, offset))
    with psycopg.connect(url) as conn:
        conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of(rows), channel("outbox", "consumer_queue")),
        )


def _notified_by_send(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel("outbox", "producer_queue")}"')
        with psycopg.connect(url) as conn, conn.transaction():
            broker.send(conn, "t.wake", b"x")
        return any(True for _ in listener.notifies(timeout=0.5, stop_after=1))


def _set_relay(url: str, *, sleeping: bool | None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM outbox.relay_state")
        if sleeping is not None:
            # A live backend pid, so that the row counts as a running relay.
            conn.execute(
                "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping) "
                "VALUES ('r1', 'producer', pg_backend_pid(), %s)",
                (sleeping,),
            )


def test_send_notifies_only_while_a_relay_sleeps(outbox_database_url: str) -> None:
    url = outbox_database_url
    _set_relay(url, sleeping=None)
    assert not _notified_by_send(url), "no relay: nobody to wake"
    with psycopg.connect(url, autocommit=True) as keeper:
        keeper.execute(
            "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping) "
            "VALUES ('r1', 'producer', pg_backend_pid(), false)"
        )
        assert not _notified_by_send(url), "a busy relay needs no NOTIFY"
        keeper.execute("UPDATE outbox.relay_state SET sleeping = true")
        assert _notified_by_send(url), "a sleeping relay is woken"


def test_a_send_without_a_returned_row_still_wakes_a_sleeping_relay_each_time(
    outbox_database_url: str,
) -> None:
    # issue 35: a generated id's send returns no row; its wake-up is a subquery of its FROM
    # list, which must run for every send (with headers or without, once psycopg has prepared
    # the statement too) and only while a relay sleeps.
    url = outbox_database_url
    _set_relay(url, sleeping=True)
    sends = 12
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel("outbox", "producer_queue")}"')
        with psycopg.connect(url) as conn:
            for i in range(sends):
                with conn.transaction():
                    broker.send(conn, "t.wake", {"i": i}, headers={"h": "v"} if i % 2 else None)
        woken = list(listener.notifies(timeout=1.0, stop_after=sends))
        assert len(woken) == sends
        _set_relay(url, sleeping=False)
        with psycopg.connect(url) as conn:
            for i in range(sends):
                with conn.transaction():
                    broker.send(conn, "t.wake", {"i": i}, headers={"h": "v"} if i % 2 else None)
        assert not list(listener.notifies(timeout=0.5, stop_after=1))
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT headers FROM outbox.producer_queue WHERE topic = 't.wake' ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == [{"h": "v"} if i % 2 else {} for i in range(sends)] * 2


def test_a_row_without_any_notify_is_still_relayed_by_the_poll_fallback(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    url = outbox_database_url
    with producer_thread(url, outbox_kafka_bootstrap, poll_interval=0.3) as relay:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the relay to sleep")
        # Insert behind the Broker's back: no NOTIFY at all, as if it had been lost.
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO outbox.producer_queue (message_id, topic, payload, content_type, "
                "lane) VALUES (gen_random_uuid(), 't.poll', 'x', 'application/octet-stream', 0)"
            )
        # The relay counts a batch after its delete committed: wait for both.
        wait_for(lambda: count(url) == 0 and relay.relayed >= 1, 10, "the poll fallback to relay")
        assert relay.relayed == 1


def test_a_woken_relay_handles_the_rows_before_it_says_it_is_awake(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    """The sleeping flag only spares writers a NOTIFY: clearing it is not worth a round trip
    ahead of the rows the relay was woken for (it cost every woken message ~0.3 ms)."""
    url = outbox_database_url
    flags_at_process: list[int] = []
    with producer_thread(url, outbox_kafka_bootstrap, poll_interval=5) as relay:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the relay to sleep")
        process = relay.process

        def observed(conn: psycopg.Connection, rows: object) -> None:
            flags_at_process.append(count(url, "relay_state", "sleeping"))
            process(conn, rows)

        relay.process = observed
        with psycopg.connect(url) as conn, conn.transaction():
            broker.send(conn, "t.woken", b"x")
        wait_for(lambda: count(url) == 0 and relay.relayed >= 1, 10, "the woken relay to send")
    assert flags_at_process[:1] == [1], flags_at_process


def test_a_woken_relay_keeps_its_flag_at_a_low_rate_and_clears_it_under_sustained_load(
    outbox_database_url: str, outbox_kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clearing the flag at every wake-up and setting it again at the next empty look cost two
    writes and a look per wake-up; the NOTIFY they spare writers costs only under sustained
    load. So a relay woken for a few rows keeps its flag, and one that found rows at every look
    for AWAKE_AFTER clears it (then naps again once the queue is empty)."""
    url = outbox_database_url
    flags: list[bool] = []
    with producer_thread(url, outbox_kafka_bootstrap, poll_interval=5, batch_size=10) as relay:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the relay to sleep")
        set_sleeping = PostgresOutboxSession.set_sleeping

        def observed(session: PostgresOutboxSession, sleeping: bool) -> None:
            flags.append(sleeping)
            set_sleeping(session, sleeping)

        monkeypatch.setattr(PostgresOutboxSession, "set_sleeping", observed)
        next_due = relay.next_due
        retry_looks: list[float | None] = []

        def looked(conn: psycopg.Connection, lanes: list[int]) -> float | None:
            retry_looks.append(next_due(conn, lanes))
            return retry_looks[-1]

        relay.next_due = looked
        for sent in range(1, 4):
            with psycopg.connect(url) as conn, conn.transaction():
                broker.send(conn, "t.low", b"x")
            wait_for(lambda: relay.relayed >= sent, 10, "the woken relay to send")  # noqa: B023
        assert flags == [], "a relay woken for one row at a time changed its flag"
        assert count(url, "relay_state", "sleeping") == 1
        # No failure recorded and no lane taken: no retry can be waiting, nothing to ask.
        assert retry_looks == [], retry_looks

        with psycopg.connect(url) as conn, conn.transaction():
            broker.send_many(conn, [Message("t.load", b"x") for _ in range(5000)])
        wait_for(lambda: count(url) == 0 and relay.relayed >= 5003, 60, "the backlog to go")
        wait_for(lambda: flags[-1:] == [True], 10, "the relay to nap again")
    assert flags == [False, True], flags


def test_an_idle_handler_wakes_for_the_retry_it_scheduled_not_at_its_poll_interval(
    outbox_database_url: str,
) -> None:
    """An idle relay asks when its next retry is due only when one can be waiting (decision
    12): after it recorded a failure. A message that failed once, with a 0.3 s backoff, is
    handled again after about 0.3 s, not after the 5 s poll interval."""
    url = outbox_database_url
    handlers = Handlers()
    attempts: list[float] = []

    @handlers.handler("t.retry", backoff=Backoff(initial=0.3, maximum=0.3, jitter=0))
    def flaky(message: InboxMessage, conn: psycopg.Connection) -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    with handler_thread(url, handlers, poll_interval=5) as runner:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the handler to sleep")
        time.sleep(1.0)  # idle, its quick polls over: only a wake-up or the retry time is left
        put_inbox(url, "t.retry", [b"{}"])
        wait_for(lambda: runner.handled == 1, 10, "the retry")
    assert len(attempts) == 2
    assert attempts[1] - attempts[0] < 2.0, f"retried after {attempts[1] - attempts[0]:.1f}s"


def test_a_handler_woken_for_a_few_rows_does_not_look_again_after_them(
    outbox_database_url: str,
) -> None:
    """With its flag kept, every row committed after a short fetch notifies: the look that
    used to follow each batch could only come back empty (a statement per wake-up)."""
    url = outbox_database_url
    handlers = Handlers()
    handled: list[bytes] = []

    @handlers.handler("t.few")
    def on_few(message: InboxMessage, conn: psycopg.Connection) -> None:
        handled.append(message.raw_payload)

    with handler_thread(url, handlers, poll_interval=5) as runner:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the handler to sleep")
        time.sleep(1.0)  # idle, its quick polls over: only a wake-up is left
        work = runner.work
        looks: list[bool] = []

        def counted(conn: psycopg.Connection, lanes: list[int]) -> bool:
            found = work(conn, lanes)
            looks.append(found)
            return found

        runner.work = counted
        for n in range(3):
            put_inbox(url, "t.few", [b'{"n": %d}' % n])
            wait_for(lambda: len(handled) == n + 1, 10, "the woken handler")  # noqa: B023
            time.sleep(0.2)
    assert looks == [True, True, True], looks


def test_a_woken_handler_claims_at_once_without_a_look_first(outbox_database_url: str) -> None:
    """A notification says rows were committed: with its worker connected, the runner no
    longer looks on its own session before the worker claims (that look cost every woken
    message a round trip before its claim, issue 35). A timed poll still looks first."""
    url = outbox_database_url
    handlers = Handlers()
    handled: list[bytes] = []

    @handlers.handler("t.woken")
    def on_woken(message: InboxMessage, conn: psycopg.Connection) -> None:
        handled.append(message.raw_payload)

    # One worker, so that the worker of the rows' lane is every worker (connected by the first).
    with handler_thread(url, handlers, poll_interval=5, concurrency=1) as runner:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the handler to sleep")
        put_inbox(url, "t.woken", [b'{"n": 0}'])  # the worker connects after a look
        wait_for(lambda: len(handled) == 1, 10, "the first message")
        time.sleep(1.0)  # idle, its quick polls over: only a wake-up is left
        work = runner.work
        looks: list[tuple[bool, int]] = []  # (notified, rows the look found) of each look

        def counted(conn: Any, lanes: list[int]) -> bool:
            fetch = conn.fetch

            def looked(*args: Any) -> Any:
                rows = fetch(*args)
                looks.append((runner.notified, len(rows)))
                return rows

            conn.fetch = looked
            try:
                return bool(work(conn, lanes))
            finally:
                del conn.fetch

        runner.work = counted
        for n in range(1, 4):
            put_inbox(url, "t.woken", [b'{"n": %d}' % n])
            wait_for(lambda: len(handled) == n + 1, 10, "the woken handler")  # noqa: B023
            time.sleep(0.2)
    assert len(handled) == 4
    assert not [look for look in looks if look[0]], looks


def test_a_woken_handler_holding_some_lanes_still_looks_first(outbox_database_url: str) -> None:
    """Two handlers share the lanes: a notification may be for the other's rows, and going
    straight to a round would cost each of its workers an empty claiming transaction, so a
    runner holding only some lanes looks first, woken or not."""
    url = outbox_database_url
    handlers = Handlers()
    handled: list[bytes] = []

    @handlers.handler("t.shared")
    def on_shared(message: InboxMessage, conn: psycopg.Connection) -> None:
        handled.append(message.raw_payload)

    def put_keyed(n: int) -> None:
        key, mid = uuid.uuid4().bytes, uuid.uuid4()
        lane = lane_for(key, mid)
        row = InboxRow(
            mid, "t.shared", key, b"{}", {}, "application/json", lane, datetime.now(UTC), 0, n
        )
        batch = InboxBatch.of([row])
        with psycopg.connect(url) as conn:
            conn.execute(
                queries("outbox")["inbox_insert"],
                insert_params(batch, channel("outbox", "consumer_queue")),
            )

    with (
        handler_thread(
            url, handlers, poll_interval=1, concurrency=1, rebalance_interval=0.2
        ) as first,
        handler_thread(
            url, handlers, poll_interval=1, concurrency=1, rebalance_interval=0.2
        ) as second,
    ):
        wait_for(lambda: count(url, "relay_state", "sleeping") == 2, 30, "both to sleep")
        wait_for(lambda: 0 < len(first.lanes) < LANES, 30, "the lanes to be shared")
        for n in range(20):  # random keys: both workers connect
            put_keyed(n)
        wait_for(lambda: len(handled) == 20, 10, "the first rows")
        assert first._workers[0].connected and second._workers[0].connected
        time.sleep(1.0)  # idle: wake-ups, and a timed poll a second
        looks: list[bool] = []  # whether each look followed a notification
        for runner in (first, second):
            work = runner.work

            def counted(
                conn: Any, lanes: list[int], runner: Any = runner, work: Any = work
            ) -> bool:
                fetch = conn.fetch

                def looked(*args: Any) -> Any:
                    looks.append(runner.notified)
                    return fetch(*args)

                conn.fetch = looked
                try:
                    return bool(work(conn, lanes))
                finally:
                    del conn.fetch

            runner.work = counted
        for n in range(20, 23):
            put_keyed(n)
            wait_for(lambda: len(handled) == n + 1, 10, "the woken handler")  # noqa: B023
            time.sleep(0.2)
    assert True in looks, looks


def test_a_key_held_behind_a_retry_goes_on_as_soon_as_the_retry_succeeds(
    outbox_database_url: str,
) -> None:
    """A row held back because an earlier row of its key waits for a retry goes with that
    retry, once due, in order: no notification says it is free, and an idle handler that
    skips the look after a short batch (only when no retry waits) must not strand it until
    its 5 s poll interval."""
    url = outbox_database_url
    handlers = Handlers()
    seen: list[tuple[int, float]] = []

    @handlers.handler("t.held", backoff=Backoff(initial=0.3, maximum=0.3, jitter=0))
    def on_held(message: InboxMessage, conn: psycopg.Connection) -> None:
        n = message.payload["n"]
        seen.append((n, time.monotonic()))
        if n == 0 and len(seen) == 1:
            raise RuntimeError("the first message fails once")

    with handler_thread(url, handlers, poll_interval=5) as runner:
        wait_for(lambda: count(url, "relay_state", "sleeping") == 1, 10, "the handler to sleep")
        time.sleep(1.0)
        put_inbox(url, "t.held", [b'{"n": 0}', b'{"n": 1}'])  # one key
        wait_for(lambda: runner.handled == 2, 10, "both messages")
    assert [n for n, _ in seen] == [0, 0, 1]
    assert seen[2][1] - seen[0][1] < 2.0, f"the held row waited {seen[2][1] - seen[0][1]:.1f}s"
