"""`@handlers.batch_handler`: one callback per run of messages, with every inbox guarantee.

The callback writes a list of messages' effects at once; the runner marks them processed in the
same transaction. A failure for a list rolls it all back and handles each message alone, so the
failure lands on the message that causes it and the others' effects are written exactly once.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outbox import Handlers, InboxMessage
from outbox.core.errors import ConfigurationError
from outbox.core.handlers import HandlerConflict

from .relay_helpers import count, handler_thread, wait_for
from .test_inbox import _effects, _prepare, dead, processed, put


def _batch_handlers(
    calls: list[list[int]], *, poison: set[int], pipeline: bool = False, ordered: bool = True
) -> Handlers:
    handlers = Handlers(pipeline=pipeline)

    @handlers.batch_handler("orders.batch", max_attempts=1, ordered=ordered)
    def write(messages: list[InboxMessage], conn: psycopg.Connection[Any]) -> None:
        numbers = [m.payload["n"] for m in messages]
        calls.append(numbers)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO effects (message_id, attempt, body) VALUES (%s, %s, %s)",
                [(m.id, m.attempt, str(m.payload["n"])) for m in messages],
            )
        bad = poison.intersection(numbers)
        if bad:
            raise ValueError(f"cannot apply order {min(bad)}")

    return handlers


def test_a_batch_handler_gets_runs_of_messages_in_order(outbox_database_url: str) -> None:
    url = outbox_database_url
    _prepare(url)
    bodies, keys = [{"n": i} for i in range(500)], [f"k{i % 7}" for i in range(500)]
    ids = put(url, "orders.batch", bodies, keys)
    calls: list[list[int]] = []
    handlers = _batch_handlers(calls, poison=set())
    with handler_thread(url, handlers, concurrency=2, transaction_size=100):
        wait_for(lambda: processed(url) == 500, 30, "500 handled")

    assert sorted(r[0] for r in _effects(url)) == sorted(ids)
    assert count(url, "consumer_processed", "handled_count <> 1") == 0
    assert all(1 <= len(call) <= 100 for call in calls)
    assert len(calls) < 100, f"{len(calls)} calls for 500 messages: not batched"
    # Within a call, and for each key across calls, messages come in the order they were stored.
    assert all(call == sorted(call) for call in calls)
    for key in range(7):
        seen = [n for call in calls for n in call if n % 7 == key]
        assert seen == sorted(seen)


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipelined"])
def test_a_failing_batch_is_split_and_blames_its_own_message(
    outbox_database_url: str, pipeline: bool
) -> None:
    url = outbox_database_url
    _prepare(url)
    ids = put(url, "orders.batch", [{"n": i} for i in range(60)], [f"k{i % 3}" for i in range(60)])
    calls: list[list[int]] = []
    handlers = _batch_handlers(calls, poison={17, 42}, pipeline=pipeline, ordered=False)
    with handler_thread(url, handlers, concurrency=1, transaction_size=30):
        wait_for(lambda: processed(url) == 58 and dead(url) == 2, 30, "58 handled, two dead")

    # Every other message's effect exactly once; nothing of the failing lists committed.
    assert sorted(int(r[2]) for r in _effects(url)) == [n for n in range(60) if n not in (17, 42)]
    assert count(url, "consumer_processed", "handled_count > 1") == 0
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id, last_error FROM outbox.consumer_queue "
            "WHERE dead_at IS NOT NULL ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == [ids[17], ids[42]]
    assert "cannot apply order 17" in rows[0][1]
    assert "cannot apply order 42" in rows[1][1]
    # The poison messages were each called alone at the end.
    assert [17] in calls and [42] in calls


def test_an_ordered_batch_handler_holds_a_key_behind_its_failure(outbox_database_url: str) -> None:
    """ordered=True: after a failure, the later messages of that key wait for it (here it dies
    at once, max_attempts=1); the other keys are not held back."""
    url = outbox_database_url
    _prepare(url)
    put(url, "orders.batch", [{"n": i} for i in range(40)], [f"k{i % 2}" for i in range(40)])
    calls: list[list[int]] = []
    handlers = _batch_handlers(calls, poison={10}, ordered=True)
    with handler_thread(url, handlers, concurrency=1, transaction_size=40):
        wait_for(lambda: processed(url) == 39 and dead(url) == 1, 30, "39 handled, one dead")
    # The first call had all 40 and failed (rolled back); then each message alone, in order,
    # until 10 failed; key k0's later messages only after that.
    assert calls[0] == list(range(40))
    first_10 = calls.index([10])
    assert calls[1:first_10] == [[n] for n in range(10)]
    after = [n for call in calls[first_10 + 1 :] for n in call]
    assert sorted(after) == [n for n in range(11, 40)]
    assert sorted(int(r[2]) for r in _effects(url)) == [n for n in range(40) if n != 10]


def test_batch_handler_registration_errors() -> None:
    handlers = Handlers()

    with pytest.raises(ConfigurationError, match="batch handlers must be sync functions"):

        @handlers.batch_handler("orders.async")
        async def handle_async(messages: list[InboxMessage], conn: Any) -> None: ...

    @handlers.batch_handler("orders.taken")
    def first(messages: list[InboxMessage], conn: Any) -> None: ...

    with pytest.raises(HandlerConflict, match=r"orders\.taken"):

        @handlers.handler("orders.taken")
        def second(message: InboxMessage, conn: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="max_attempts"):
        handlers.batch_handler("orders.x", max_attempts=0)
