"""The handler side's contract (`InboxSession`, `HandlerSession`, `HandlerWork`): what the
HandlerRunner and its workers rely on, for every store. The calls are theirs: a control
session fetches, forgets and enforces the lease; a worker claims, marks done and records
failures in its own transactions."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from outbox.core.inbox_rows import ClaimedBatch, FailedAttempt
from outbox.core.lanes import LANES, lane_for
from outbox.core.retriable import refused_for_data
from outbox.ports import HandlerSession, InboxDatabase

from .conftest import LONG_SCHEMA_TOO, StoresUnderTest, inbox_row, store

ALL = list(range(LANES))


@contextmanager
def worker(database: InboxDatabase) -> Iterator[HandlerSession]:
    session = database.open_session("psycopg")
    try:
        yield session
    finally:
        session.close()


def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def send(stores: StoresUnderTest, *specs: tuple[str, bytes | None]) -> list[uuid.UUID]:
    """Store one row per (payload, key), topic "orders", in this order."""
    rows = [inbox_row("orders", p.encode(), key=k) for p, k in specs]
    store(stores, rows)
    return [r.message_id for r in rows]


def claim(
    database: InboxDatabase,
    lanes: list[int] = ALL,
    limit: int = 100,
    unordered: list[str] | None = None,
    *,
    done: bool = False,
) -> ClaimedBatch:
    """One worker transaction: claim (and mark done, if `done`), commit."""
    with worker(database) as session, session.transaction() as (tx, _):
        batch = database.work.claim_next(tx, lanes, limit, unordered or [])
        if done:
            database.work.done_many(tx, [row.id for row in batch.rows])
    return batch


def payloads(batch: ClaimedBatch) -> list[bytes]:
    return [batch.claimed[row.id].payload for row in batch.rows]


@LONG_SCHEMA_TOO
def test_rows_are_claimed_in_id_order_per_lane_and_leave_once_done(
    stores: StoresUnderTest,
) -> None:
    keys = [b"alpha", b"beta", None]
    send(stores, *[(f"{n}", keys[n % 3]) for n in range(30)])
    database = stores.inbox()
    beta = lane_for(b"beta", uuid.uuid4())
    batch = claim(database, [beta], 100)
    assert batch.rows and {row.lane for row in batch.rows} == {beta}
    assert [row.id for row in batch.rows] == sorted(row.id for row in batch.rows)
    assert [batch.claimed[row.id].payload for row in batch.rows if row.key == b"beta"] == [
        f"{n}".encode() for n in range(30) if keys[n % 3] == b"beta"
    ]
    assert batch.taken == len(batch.rows)
    assert len(claim(database, [beta], 4).rows) == 4
    every = claim(database, done=True)
    assert [row.id for row in every.rows] == sorted(row.id for row in every.rows)
    assert payloads(every) == [f"{n}".encode() for n in range(30)]
    assert every.taken == 30
    assert claim(database).rows == []
    with database.connect() as control:
        assert control.fetch(ALL, 100, []) == []
        assert control.attempts(every.rows[0].id) == 0  # gone
        assert control.recent_topics(100) == {}  # handled rows left the queue


def test_the_control_session_fetches_what_a_worker_would_claim(stores: StoresUnderTest) -> None:
    send(stores, ("1", b"k"), ("2", b"other"), ("3", None))
    database = stores.inbox()
    with database.connect() as control:
        fetched = control.fetch(ALL, 10, [])
        assert [(p.key, p.topic) for p in fetched] == [
            (b"k", "orders"),
            (b"other", "orders"),
            (None, "orders"),
        ]
        assert control.fetch(ALL, 2, []) == fetched[:2]
        assert control.fetch([fetched[0].lane], 10, [])[0] == fetched[0]
        assert claim(database).rows == fetched


def test_a_worker_skips_the_rows_another_transaction_holds(stores: StoresUnderTest) -> None:
    send(stores, *[(f"{n}", f"k{n}".encode()) for n in range(6)])
    database = stores.inbox()
    with database.connect() as control:
        ids = [p.id for p in control.fetch(ALL, 10, [])]
    with worker(database) as one, worker(database) as two:
        with one.transaction() as (tx1, _):
            first = database.work.claim_next(tx1, ALL, 2, [])
            assert payloads(first) == [b"0", b"1"]
            with two.transaction() as (tx2, _):
                second = database.work.claim_next(tx2, ALL, 2, [])
                assert payloads(second) == [b"2", b"3"]  # SKIP LOCKED: the next ones
                assert database.work.claim_many(tx2, ids[:2]) == {}
                database.work.done_many(tx2, ids[2:4])
            # the other's rows are gone once it committed; ours are still ours
            with database.connect() as control:
                assert [p.id for p in control.fetch(ALL, 10, [])] == ids[:2] + ids[4:]
            database.work.done_many(tx1, ids[:2])
    assert payloads(claim(database)) == [b"4", b"5"]


def test_a_transaction_sees_its_own_writes_and_others_see_them_at_commit(
    stores: StoresUnderTest,
) -> None:
    send(stores, *[(f"{n}", f"k{n}".encode()) for n in range(4)])
    database = stores.inbox()
    with database.connect() as control, worker(database) as session:
        with session.transaction() as (tx, _):
            batch = database.work.claim_next(tx, ALL, 2, [])
            database.work.done_many(tx, [row.id for row in batch.rows])
            again = database.work.claim_next(tx, ALL, 10, [])
            assert payloads(again) == [b"2", b"3"]  # not its handled rows again
            assert database.work.claim_many(tx, [row.id for row in batch.rows]) == {}
            assert len(control.fetch(ALL, 10, [])) == 4  # not committed: still pending
            database.work.fail(tx, FailedAttempt(again.rows[0].id, "boom", False, 60.0))
            assert control.attempts(again.rows[0].id) == 0
        assert [p.id for p in control.fetch(ALL, 10, [])] == [again.rows[1].id]
        assert control.attempts(again.rows[0].id) == 1
    assert stores.processed().keys() == {batch.claimed[r.id].message_id for r in batch.rows}


def test_a_transaction_that_raises_leaves_nothing_of_it(stores: StoresUnderTest) -> None:
    send(stores, ("1", b"k"), ("2", b"k"))
    database = stores.inbox()
    with worker(database) as session:
        with pytest.raises(RuntimeError, match="callback failed"), session.transaction() as (tx, _):
            batch = database.work.claim_next(tx, ALL, 10, [])
            database.work.done_many(tx, [batch.rows[0].id])
            database.work.fail(tx, FailedAttempt(batch.rows[1].id, "x", True, 0.0))
            raise RuntimeError("callback failed")
        # its locks went with it: the same session claims them again
        with session.transaction() as (tx, _):
            again = database.work.claim_next(tx, ALL, 10, [])
            assert again.rows == batch.rows
            assert [c.attempts for c in again.claimed.values()] == [0, 0]
    assert stores.processed() == {}
    assert stores.inbox_dead() == []


def test_a_failed_row_is_retried_after_its_delay_holding_its_key_but_not_others(
    stores: StoresUnderTest,
) -> None:
    send(stores, ("k1", b"k"), ("o1", b"o"), ("k2", b"k"), ("n1", None), ("k3", b"k"))
    database = stores.inbox()
    with worker(database) as session:
        with session.transaction() as (tx, _):
            batch = database.work.claim_next(tx, ALL, 1, [])
            assert payloads(batch) == [b"k1"]
            database.work.fail(tx, FailedAttempt(batch.rows[0].id, "later", False, 1.0))
    assert payloads(claim(database)) == [b"o1", b"n1"]
    # a topic whose handler is unordered does not wait for the key
    assert payloads(claim(database, unordered=["orders"])) == [b"o1", b"k2", b"n1", b"k3"]
    with database.connect() as control:
        due = control.next_due(ALL)
        assert due is not None and 0 < due <= 1.0
        assert control.attempts(batch.rows[0].id) == 1
        time.sleep(1.1)
        due = control.next_due(ALL)
        assert due is not None and due <= 0  # due: still counted until handled
    retried = claim(database, done=True)
    assert payloads(retried) == [b"k1", b"o1", b"k2", b"n1", b"k3"]
    assert retried.claimed[retried.rows[0].id].attempts == 1
    with database.connect() as control:
        assert control.next_due(ALL) is None


def test_a_retrying_key_is_free_when_its_last_retrying_row_is_due(
    stores: StoresUnderTest,
) -> None:
    """`next_due` says when a fetch can find a held key's rows again: at the latest due of
    its retrying rows (their earliest is due but held); a row without a key on its own."""
    send(stores, ("k1", b"k"), ("k2", b"k"), ("n1", None))
    database = stores.inbox()
    with worker(database) as session, session.transaction() as (tx, _):
        k1, k2, n1 = database.work.claim_next(tx, ALL, 10, []).rows
        database.work.fail(tx, FailedAttempt(k1.id, "later", False, 0.1))
        database.work.fail(tx, FailedAttempt(k2.id, "later", False, 30.0))
        database.work.fail(tx, FailedAttempt(n1.id, "later", False, 2.0))
    with database.connect() as control:
        due = control.next_due(ALL)
        assert due is not None and 1 < due <= 2
        assert control.next_due([k1.lane]) is not None
        time.sleep(0.2)
        assert [p.key for p in control.fetch(ALL, 10, [])] == []  # k1 due, but its key held
        assert control.next_due([lane for lane in ALL if lane not in (k1.lane, n1.lane)]) is None


def test_a_row_failed_for_good_is_dead_and_holds_nothing(stores: StoresUnderTest) -> None:
    [doomed, *_] = send(stores, ("k1", b"k"), ("k2", b"k"))
    database = stores.inbox()
    error = "ValueError: " + "x" * 5_000_000  # 5 MB of text
    with worker(database) as session:
        with session.transaction() as (tx, _):
            first = database.work.claim_next(tx, ALL, 1, []).rows[0]
            database.work.fail(tx, FailedAttempt(first.id, "first", False, 0.0))
        with session.transaction() as (tx, _):
            assert database.work.claim_many(tx, [first.id])  # due again
            database.work.fail(tx, FailedAttempt(first.id, error, True, 0.0))
    assert payloads(claim(database)) == [b"k2"]  # dead: the key goes on
    [dead] = stores.inbox_dead()
    assert (dead.message_id, dead.attempts, dead.error) == (doomed, 2, error)
    with database.connect() as control:
        assert control.next_due(ALL) is None
        assert control.attempts(first.id) == 2
        assert control.recent_topics(10) == {"orders": 2}
    assert store(stores, [inbox_row(message_id=doomed)]) == {}  # its id is taken


def test_claim_many_locks_the_pending_rows_of_the_ids_whatever_their_time(
    stores: StoresUnderTest,
) -> None:
    """The by-id path (after a failure in a batch): pending rows, due or not; not dead, not
    handled, not held by another transaction, not unknown."""
    send(stores, *[(f"{n}", f"k{n}".encode()) for n in range(4)])
    database = stores.inbox()
    with worker(database) as session:
        with session.transaction() as (tx, _):
            a, b, c, d = database.work.claim_next(tx, ALL, 10, []).rows
            database.work.fail(tx, FailedAttempt(a.id, "later", False, 60.0))
            database.work.fail(tx, FailedAttempt(b.id, "dead", True, 0.0))
            database.work.done_many(tx, [c.id])
        with session.transaction() as (tx, _):
            claimed = database.work.claim_many(tx, [d.id, c.id, b.id, a.id, 10**12])
            assert sorted(claimed) == [a.id, d.id]
            assert claimed[a.id].attempts == 1


def test_an_async_worker_claims_handles_and_fails_one_row_at_a_time(
    stores: StoresUnderTest,
) -> None:
    send(stores, ("1", b"k"), ("2", b"other"))
    database = stores.inbox()
    with database.connect() as control:
        rows = control.fetch(ALL, 10, [])

    async def handle() -> None:
        session = await database.open_async_session("psycopg")
        try:
            async with session.transaction() as (tx, _):
                claimed = await database.work.claim_async(tx, rows[0].id)
                assert claimed is not None and claimed.payload == b"1"
                session.check()  # what the worker asks after a callback: all is well
                await database.work.done_async(tx, rows[0].id)
                assert await database.work.claim_async(tx, rows[0].id) is None
            async with session.transaction() as (tx, _):
                await database.work.fail_async(tx, FailedAttempt(rows[1].id, "no", True, 0.0))
        finally:
            await session.close()

    asyncio.run(handle())
    assert len(stores.processed()) == 1
    assert [d.error for d in stores.inbox_dead()] == ["no"]


def test_a_transaction_past_its_lease_is_ended_and_its_row_taken_back(
    stores: StoresUnderTest,
) -> None:
    """The runner's lease: `terminate` ends the worker's transaction (its lock goes, nothing
    of it can commit, its session is lost), another takes the row, and the control session
    records the attempt."""
    send(stores, ("1", b"k"), ("2", b"k"))
    database = stores.inbox()
    with database.connect() as control, worker(database) as hung, worker(database) as fresh:
        with pytest.raises(database.disconnects):
            with hung.transaction() as (tx, _):
                batch = database.work.claim_next(tx, ALL, 1, [])
                row = batch.rows[0]
                control.terminate(hung.backend_pid)

                def taken_back() -> bool:
                    with fresh.transaction() as (tx2, _):
                        return row.id in database.work.claim_many(tx2, [row.id])

                until(taken_back, "the ended transaction's row lock to go")
                database.work.done_many(tx, [row.id])
        assert hung.broken
        assert control.attempts(row.id) == 0
        control.fail(FailedAttempt(row.id, "TimeoutError: lease of 1s expired", False, 0.0))
        assert control.attempts(row.id) == 1
    assert stores.processed() == {}
    assert payloads(claim(database, done=True)) == [b"1", b"2"]


def test_terminating_an_unknown_backend_does_nothing(stores: StoresUnderTest) -> None:
    with stores.inbox().connect() as control:
        control.terminate(2**31 - 1)
        assert control.fetch(ALL, 1, []) == []


def test_handled_ids_are_forgotten_past_the_dedup_window_a_bounded_batch_at_a_time(
    stores: StoresUnderTest,
) -> None:
    send(stores, *[(f"{n}", None) for n in range(5)])
    database = stores.inbox()
    claim(database, done=True)
    assert len(stores.processed()) == 5
    with database.connect() as control:
        assert control.forget_processed(3600.0, 10) == 0
        time.sleep(0.05)
        assert control.forget_processed(0.01, 2) == 2
        assert control.forget_processed(0.01, 2) == 2
        assert control.forget_processed(0.01, 2) == 1
        assert control.forget_processed(0.01, 2) == 0
    assert stores.processed() == {}


def test_recent_topics_counts_the_last_rows_stored_whatever_their_state(
    stores: StoresUnderTest,
) -> None:
    store(stores, [inbox_row("a"), inbox_row("b"), inbox_row("b"), inbox_row("c")])
    database = stores.inbox()
    with database.connect() as control:
        assert control.recent_topics(3) == {"b": 2, "c": 1}
        assert control.recent_topics(100) == {"a": 1, "b": 2, "c": 1}
        assert control.recent_topics(0) == {}


def test_a_failure_recorded_by_the_control_session_or_on_a_row_gone_is_safe(
    stores: StoresUnderTest,
) -> None:
    send(stores, ("1", b"k"))
    database = stores.inbox()
    with database.connect() as control:
        [row] = control.fetch(ALL, 10, [])
        control.fail(FailedAttempt(row.id, "dead by hand", True, 0.0))
        assert control.fetch(ALL, 10, []) == []
        control.fail(FailedAttempt(10**12, "never there", False, 1.0))
    with worker(database) as session, session.transaction() as (tx, _):
        database.work.done_many(tx, [10**12])
        database.work.fail(tx, FailedAttempt(10**12, "never there", False, 1.0))
    assert [d.error for d in stores.inbox_dead()] == ["dead by hand"]


@pytest.mark.parametrize("error", ["NUL \x00 inside", "a lone surrogate \ud800"])
def test_an_error_that_is_not_storable_text_is_refused_for_its_data(
    stores: StoresUnderTest, error: str
) -> None:
    send(stores, ("1", b"k"))
    database = stores.inbox()
    with database.connect() as control:
        [row] = control.fetch(ALL, 10, [])
        with pytest.raises(Exception) as refused:
            control.fail(FailedAttempt(row.id, error, False, 1.0))
        assert refused_for_data(refused.value), repr(refused.value)
        assert control.attempts(row.id) == 0


def test_a_statement_on_a_row_another_transaction_holds_waits_for_it_to_end(
    stores: StoresUnderTest,
) -> None:
    """A failure recorded on a row a worker holds (the lease's `fail` racing a late commit)
    waits for the worker's transaction, then finds the row as it left it: here, handled."""
    send(stores, ("1", b"k"))
    database = stores.inbox()
    with database.connect() as control, worker(database) as session:
        with session.transaction() as (tx, _):
            [row] = database.work.claim_next(tx, ALL, 10, []).rows
            waiting = threading.Thread(
                target=control.fail, args=(FailedAttempt(row.id, "late", True, 0.0),)
            )
            waiting.start()
            waiting.join(0.5)
            assert waiting.is_alive(), "the statement did not wait for the row's lock"
            database.work.done_many(tx, [row.id])
        waiting.join(10)
        assert not waiting.is_alive()
        assert control.attempts(row.id) == 0
    assert stores.inbox_dead() == []
    assert len(stores.processed()) == 1
