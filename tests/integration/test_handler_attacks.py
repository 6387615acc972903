"""A callback that misbehaves cannot stop the Handler, lose another message's effects or hold
its key for ever: it exits, interrupts, swallows a failed statement, ends or closes the
transaction it was given, or kills its own session. Each is recorded as a failed attempt."""

from __future__ import annotations

import contextlib
import inspect
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from outbox import Backoff, Handlers, InboxMessage
from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.lanes import lane_for
from outbox.postgres.inbox import insert_params
from outbox.postgres.queries import channel, queries

from .relay_helpers import count, handler_thread, wait_for

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)


class _Custom(BaseException):
    pass


# Each returns what the connection's method returned: the async callback awaits it.


def _exit(conn: Any) -> Any:
    sys.exit(3)


def _interrupt(conn: Any) -> Any:
    raise KeyboardInterrupt


def _base(conn: Any) -> Any:
    raise _Custom("not an Exception")


async def _swallow_async(conn: Any) -> None:
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        await conn.execute("SELECT 1/0")


def _swallow(conn: Any) -> Any:
    if isinstance(conn, psycopg.AsyncConnection):
        return _swallow_async(conn)
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1/0")  # the transaction is aborted: its later statements fail
    return None


def _rollback(conn: Any) -> Any:
    return conn.execute("ROLLBACK")


def _commit(conn: Any) -> Any:
    return conn.execute("COMMIT")


def _close(conn: Any) -> Any:
    return conn.close()


def _kill(conn: Any) -> Any:
    return conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")


MISDEEDS: dict[str, Callable[[Any], Any]] = {
    "sys.exit": _exit,
    "KeyboardInterrupt": _interrupt,
    "BaseException": _base,
    "swallowed-error": _swallow,
    "ROLLBACK": _rollback,
    "COMMIT": _commit,
    "close": _close,
    "terminate-own-backend": _kill,
}


def _put(url: str, rows: list[tuple[bytes, bytes]]) -> list[uuid.UUID]:
    """Inbox rows of topic "t": (key, payload) each, in this order."""
    stored = []
    ids = []
    for offset, (key, payload) in enumerate(rows):
        mid = uuid.uuid4()
        ids.append(mid)
        row = InboxRow(
            mid, "t", key, payload, {}, "application/json", lane_for(key, mid),
            datetime.now(UTC), 0, offset,
        )  # fmt: skip
        stored.append(row)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS effects (n int)")
        conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of(stored), channel("outbox", "consumer_queue")),
        )
    return ids


def _effects(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT n FROM effects ORDER BY n")]


@pytest.mark.parametrize("flavour", ["sync", "async", "batch"])
@pytest.mark.parametrize("misdeed", list(MISDEEDS))
def test_a_misbehaving_callback_is_a_recorded_failure(
    outbox_database_url: str, misdeed: str, flavour: str
) -> None:
    url = outbox_database_url
    bad = MISDEEDS[misdeed]
    handlers = Handlers()

    def effect(message: InboxMessage, conn: Any) -> None:
        conn.execute("INSERT INTO effects VALUES (%s)", (message.payload["n"],))

    if flavour == "sync":

        @handlers.handler("t", max_attempts=2, backoff=FAST)
        def sync(message: InboxMessage, conn: Any) -> None:
            effect(message, conn)
            if message.payload.get("bad"):
                bad(conn)

    elif flavour == "async":

        @handlers.handler("t", max_attempts=2, backoff=FAST)
        async def run_async(message: InboxMessage, conn: Any) -> None:
            await conn.execute("INSERT INTO effects VALUES (%s)", (message.payload["n"],))
            if message.payload.get("bad"):
                result = bad(conn)
                if inspect.isawaitable(result):
                    await result

    else:

        @handlers.batch_handler("t", max_attempts=2, backoff=FAST)
        def batch(messages: list[InboxMessage], conn: Any) -> None:
            for m in messages:
                effect(m, conn)
            if any(m.payload.get("bad") for m in messages):
                bad(conn)

    # One transaction holds the three (transaction_size 100, one worker): the good row
    # before the bad one must keep its effect, the one after must be handled too.
    _put(url, [(b"a", b'{"n": 1}'), (b"b", b'{"n": 2, "bad": true}'), (b"c", b'{"n": 3}')])
    with handler_thread(url, handlers, concurrency=1, lease=30) as runner:
        wait_for(
            lambda: (
                count(url, "consumer_processed") == 2
                and count(url, "consumer_queue", "dead_at IS NOT NULL") == 1
            ),
            30,
            "two handled, the bad one dead",
        )
        assert runner.failed == 2
    with psycopg.connect(url) as conn:
        attempts, error = conn.execute(
            "SELECT attempts, last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
        ).fetchone()
    assert attempts == 2 and error
    effects = _effects(url)
    if misdeed == "COMMIT":
        # The callback committed its own writes and those of the messages before it in the
        # transaction: they are handled again (at least once, documented), none is lost.
        assert {1, 3} <= set(effects)
    else:
        # Each good message's effect committed exactly once, with its processed mark.
        assert effects == [1, 3]


def test_a_callback_that_hangs_again_does_not_hold_the_other_keys_of_its_batch(
    outbox_database_url: str,
) -> None:
    """Its lease expires and its transaction rolls back, with the other keys batched with it.
    Its next attempt (due at once here) runs alone, after them: they commit before it starts
    again, instead of waiting behind it for a second lease."""
    import threading
    import time

    url = outbox_database_url
    handlers = Handlers()
    starts: dict[bytes, list[float]] = {}
    lock = threading.Lock()

    @handlers.handler("t", max_attempts=3, backoff=FAST)
    def hang(message: InboxMessage, conn: Any) -> None:
        with lock:
            starts.setdefault(message.key or b"", []).append(time.monotonic())
        if message.payload.get("hang"):
            time.sleep(5)  # past the lease, every time
        conn.execute("INSERT INTO effects VALUES (%s)", (message.payload["n"],))

    rows = [(b"hung", b'{"n": 0, "hang": true}')]
    rows += [(b"k%d" % n, b'{"n": %d}' % n) for n in range(1, 7)]
    _put(url, rows)
    with handler_thread(url, handlers, lease=1.0, concurrency=1):
        wait_for(lambda: len(_effects(url)) == 6, 30, "the six other keys")
        wait_for(lambda: len(starts.get(b"hung", [])) >= 2, 30, "the hung one's second try")
    second_try = starts[b"hung"][1]
    others = [starts[b"k%d" % n][-1] for n in range(1, 7)]
    assert max(others) < second_try, "the other keys waited behind the hung callback again"
    assert _effects(url) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("kind", ["sync", "async", "batch"])
def test_a_lease_overrun_is_logged_with_its_message_id(
    outbox_database_url: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease's error line and the failed attempt's warning name the message by its id
    (they said `message None (row 1)`): an operator searches the logs for that id."""
    import asyncio
    import logging
    import time

    url = outbox_database_url
    handlers = Handlers()
    hung: list[bool] = []

    def once() -> bool:
        first = not hung
        hung.append(True)
        return first

    def effect(message: InboxMessage, conn: Any) -> None:
        conn.execute("INSERT INTO effects VALUES (%s)", (message.payload["n"],))

    if kind == "sync":

        @handlers.handler("t", max_attempts=3, backoff=FAST)
        def slow(message: InboxMessage, conn: Any) -> None:
            if once():
                time.sleep(3)
            effect(message, conn)

    elif kind == "async":

        @handlers.handler("t", max_attempts=3, backoff=FAST)
        async def slow_async(message: InboxMessage, session: Any) -> None:
            if once():
                await asyncio.sleep(3)
            await session.execute("INSERT INTO effects VALUES (%s)", (message.payload["n"],))

    else:

        @handlers.batch_handler("t", max_attempts=3, backoff=FAST)
        def slow_batch(messages: list[InboxMessage], conn: Any) -> None:
            if once():
                time.sleep(3)
            for message in messages:
                effect(message, conn)

    [message_id] = _put(url, [(b"k", b'{"n": 1}')])
    with caplog.at_level(logging.WARNING, logger="outbox"):
        with handler_thread(url, handlers, lease=1.0, concurrency=1):
            wait_for(lambda: _effects(url) == [1], 30, "the message handled on its retry")
    lines = [record.getMessage() for record in caplog.records]
    lease = [line for line in lines if "past its lease" in line]
    failed = [line for line in lines if "attempt 1/3 failed" in line]
    assert lease and failed, lines
    for line in (*lease, *failed):
        assert str(message_id) in line and "None" not in line, line


@pytest.mark.parametrize("batch", [False, True])
def test_a_sync_registered_callback_returning_an_awaitable_fails_instead_of_marking_done(
    outbox_database_url: str, batch: bool
) -> None:
    """A wrapper that hides its coroutine function (a decorator without functools.wraps) is
    not seen as async by the registry: called as a sync callback it returns a coroutine that
    never runs. Its message must not be marked done with its effect never applied: the attempt
    fails, with an error that says why."""
    url = outbox_database_url
    handlers = Handlers()

    async def effect(message: Any, conn: Any) -> None:
        raise AssertionError("never awaited, never run")

    def hidden(message: Any, conn: Any) -> Any:
        return effect(message, conn)

    if batch:
        handlers.batch_handler("t", max_attempts=1, backoff=FAST)(hidden)
    else:
        handlers.handler("t", max_attempts=1, backoff=FAST)(hidden)
    _put(url, [(b"k", b'{"n": 1}')])
    with handler_thread(url, handlers, concurrency=1):
        wait_for(
            lambda: count(url, "consumer_queue", "dead_at IS NOT NULL") == 1, 30, "dead letter"
        )
    assert count(url, "consumer_processed") == 0
    with psycopg.connect(url) as conn:
        [error] = conn.execute(
            "SELECT last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
        ).fetchone()
    assert "returned an awaitable" in error and "async def" in error
