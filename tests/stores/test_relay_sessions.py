"""The relay side every queue shares (`RelaySession`): lanes owned one session at a time, the
relays' registry, the sleeping flag and the wake-ups a write sends. Run for the outbox's
sessions (the Producer's) and the inbox's (the Handler's), whose writes are `send` and a
Consumer's insert."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from outbox.ports import QueueDatabase, RelaySession

from .conftest import LONG_SCHEMA_TOO, Postgres, StoresUnderTest, inbox_row, requires, store

QUEUES = ["outbox", "inbox"]


def database(
    stores: StoresUnderTest, queue: str, relay_id: str | None = None
) -> QueueDatabase[RelaySession]:
    return stores.outbox(relay_id) if queue == "outbox" else stores.inbox(relay_id)  # type: ignore[return-value]


def writer(stores: StoresUnderTest, queue: str) -> Callable[[], None]:
    """What writes a row into the queue: a send, or a Consumer's insert."""

    def write() -> None:
        if queue == "outbox":
            stores.send("orders", b"{}", key="k")
        else:
            store(stores, [inbox_row()])

    return write


@contextmanager
def sessions(stores: StoresUnderTest, queue: str, count: int) -> Iterator[list[RelaySession]]:
    opened = [database(stores, queue).connect() for _ in range(count)]
    try:
        yield opened
    finally:
        for session in opened:
            session.close()


def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@LONG_SCHEMA_TOO
@pytest.mark.parametrize("queue", QUEUES)
def test_a_lane_is_owned_by_one_session_at_a_time(stores: StoresUnderTest, queue: str) -> None:
    with sessions(stores, queue, 2) as (one, two):
        one.check_lock_class()
        assert one.held() == set()
        assert one.lock(7) and one.lock(8)
        assert not two.lock(7)
        assert one.held() == two.held() == {7, 8}
        two.unlock(7)  # not its lane: nothing happens
        assert two.held() == {7, 8}
        one.unlock(7)
        assert two.lock(7)
        assert one.held() == {7, 8}
        assert not one.lock(7)


@LONG_SCHEMA_TOO
@pytest.mark.parametrize("queue", QUEUES)
def test_lanes_taken_at_once_are_those_free_and_only_those(
    stores: StoresUnderTest, queue: str
) -> None:
    """`lock_each`: every lane given is tried, those taken are returned (in the order given)
    and held, those another session holds are neither; none given, none taken."""
    with sessions(stores, queue, 2) as (one, two):
        assert one.lock(5) and one.lock(9)
        assert two.lock_each([]) == []
        assert two.lock_each([9, 1, 5, 63, 0]) == [1, 63, 0]
        assert one.held() == {0, 1, 5, 9, 63}
        assert not one.lock(1) and not one.lock(63)
        assert one.lock_each([1, 2]) == [2]
        two.unlock(1)
        assert one.lock_each([1]) == [1]
        assert two.held() == {0, 1, 2, 5, 9, 63}


@pytest.mark.parametrize("queue", QUEUES)
def test_a_lane_locked_twice_is_held_until_unlocked_twice(
    stores: StoresUnderTest, queue: str
) -> None:
    """As PostgreSQL's advisory locks count."""
    with sessions(stores, queue, 2) as (one, two):
        assert one.lock(3) and one.lock(3)
        one.unlock(3)
        assert not two.lock(3)
        one.unlock(3)
        assert two.lock(3)


@pytest.mark.parametrize("queue", QUEUES)
def test_a_closed_or_lost_sessions_lanes_are_free(stores: StoresUnderTest, queue: str) -> None:
    with sessions(stores, queue, 3) as (one, two, three):
        assert one.lock(1) and two.lock(2)
        one.close()
        assert one.closed
        # free once the server has ended the session (at once in memory)
        until(lambda: three.lock(1), "the closed session's lane to be free")
        stores.lose(two)
        until(lambda: three.lock(2), "the lost session's lane to be free")
        assert three.held() == {1, 2}
        with pytest.raises(Exception):  # noqa: B017 - the driver's error for a lost connection
            two.held()
        assert two.closed


@LONG_SCHEMA_TOO
@pytest.mark.parametrize("queue", QUEUES)
def test_the_live_relays_are_those_registered_and_connected(
    stores: StoresUnderTest, queue: str
) -> None:
    first = database(stores, queue, "relay-1").connect()
    second = database(stores, queue, "relay-2").connect()
    again = database(stores, queue, "relay-1").connect()  # the same relay, reconnected
    try:
        assert first.live_relays() == 1  # at least 1: the asker
        first.join()
        second.join()
        assert first.live_relays() == 2
        again.join()
        assert second.live_relays() == 2
        second.leave()
        assert first.live_relays() == 1
        second.join()
        second.close()  # gone with its session (once the server ended it)
        until(lambda: first.live_relays() == 1, "the closed relay to be forgotten")
    finally:
        for session in (first, second, again):
            session.close()


@LONG_SCHEMA_TOO
@pytest.mark.parametrize("queue", QUEUES)
def test_a_write_wakes_the_queues_sessions_only_while_a_relay_sleeps(
    stores: StoresUnderTest, queue: str
) -> None:
    write = writer(stores, queue)
    sleeper = database(stores, queue, "sleeper").connect()
    awake = database(stores, queue, "awake").connect()
    deaf = database(stores, queue, "deaf").connect()  # never joined: not listening
    try:
        sleeper.join()
        awake.join()
        write()
        assert not sleeper.notified(0.3)  # nobody sleeps: writers spare the NOTIFY
        sleeper.set_sleeping(True)
        write()
        write()
        time.sleep(0.3)  # both received: the port takes those received with the first
        assert sleeper.notified(5.0)
        assert awake.notified(5.0)  # every listening session hears it
        assert not sleeper.notified(0.2)  # the wake-ups that came together were taken at once
        assert not deaf.notified(0.2)
        sleeper.set_sleeping(False)
        awake.notified(0.1)
        write()
        assert not sleeper.notified(0.3)
        assert not awake.notified(0.1)
    finally:
        for session in (sleeper, awake, deaf):
            session.close()


def test_a_quarantined_record_wakes_no_handler(stores: StoresUnderTest) -> None:
    """Dead rows are not work: `inbox_quarantine` sends no wake-up."""
    from outbox.core.batches import quarantined_row

    with database(stores, "inbox").connect() as sleeper:
        sleeper.join()
        sleeper.set_sleeping(True)
        session = stores.inbox_writer().connect()
        try:
            session.quarantine([quarantined_row(inbox_row(), "unreadable")])
        finally:
            session.close()
        assert not sleeper.notified(0.3)


@pytest.mark.parametrize("queue", QUEUES)
def test_a_lane_another_process_holds_is_not_ours(stores: StoresUnderTest, queue: str) -> None:
    requires(stores, "cross_process")
    assert isinstance(stores, Postgres)
    kind = "producer" if queue == "outbox" else "handler"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from outbox.ports import RelayTarget
                from outbox.postgres.inbox import PostgresInbox
                from outbox.postgres.relay_stores import PostgresOutbox
                make = PostgresOutbox if {kind!r} == "producer" else PostgresInbox
                target = RelayTarget({stores.url!r}, {stores.schema!r}, {kind!r}, "child", 5.0,
                                     "store-test-child")
                session = make(target).connect()
                session.join()
                assert session.lock(9)
                print("locked", flush=True)
                sys.stdin.readline()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        with database(stores, queue).connect() as session:
            assert 9 in session.held()
            assert not session.lock(9)
            session.join()
            assert session.live_relays() == 2
            child.kill()
            child.wait(10)
            until(lambda: session.lock(9), "the killed process's lane to be free")
            assert session.live_relays() == 1  # the dead relay is forgotten
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)  # and close its pipes


def test_the_database_check_refuses_a_schema_not_migrated(
    stores: StoresUnderTest, request: pytest.FixtureRequest
) -> None:
    requires(stores, "schema_check")
    from outbox.core.errors import OutboxError

    empty = request.getfixturevalue("outbox_database_factory")(migrated=False)
    bare = Postgres(empty)
    try:
        for checked in (bare.outbox(), bare.inbox()):
            with pytest.raises(OutboxError, match="outbox migrate"):
                checked.check(0.0, lambda: False, lambda: None)
        with pytest.raises(OutboxError, match="outbox migrate"):
            bare.inbox_writer().check()
        with pytest.raises(OutboxError, match="outbox migrate"):
            bare.inbox_writer().connect(checked=True)
    finally:
        bare.close()
