"""consumer_queue.handled_count: +1 per committed handling, never on a failure; migration 0002."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from outbox import Backoff, Handlers, InboxMessage
from outbox.postgres import migrate

from .relay_helpers import handler_thread, wait_for
from .test_inbox import put

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)


def _counts(url: str) -> dict[uuid.UUID, tuple[int, int, bool, bool]]:
    """message_id -> (handled_count, attempts, processed, dead)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id, handled_count, attempts, processed_at IS NOT NULL,"
            " dead_at IS NOT NULL FROM outbox.consumer_queue"
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_handled_count_is_one_per_committed_handling_and_untouched_by_failures(
    outbox_database_url: str, is_async: bool
) -> None:
    url = outbox_database_url
    topic = "handled.count"
    handlers = Handlers()
    seen: dict[int, int] = {}

    def outcome(message: InboxMessage) -> None:
        n = message.payload["n"]
        seen[n] = seen.get(n, 0) + 1
        if n == 1 and message.attempt <= 2:
            raise RuntimeError("fails twice, then succeeds")
        if n == 2:
            raise ValueError("always fails: ends dead")

    if is_async:

        @handlers.handler(topic, max_attempts=3, backoff=FAST)
        async def on_async(message: InboxMessage, conn: Any) -> None:
            outcome(message)

    else:

        @handlers.handler(topic, max_attempts=3, backoff=FAST)
        def on_sync(message: InboxMessage, conn: Any) -> None:
            outcome(message)

    ids = put(url, topic, [{"n": n} for n in range(4)], ["a", "b", "c", "d"])
    with handler_thread(url, handlers, concurrency=1):
        wait_for(lambda: all(c[2] or c[3] for c in _counts(url).values()), 30, "every row settled")
    counts = _counts(url)
    assert counts[ids[0]] == (1, 1, True, False)  # handled at once
    assert counts[ids[1]] == (1, 3, True, False)  # two failures, then handled once
    assert counts[ids[2]] == (0, 3, False, True)  # dead: never handled
    assert counts[ids[3]] == (1, 1, True, False)


def test_a_processed_row_handled_again_counts_two(outbox_database_url: str) -> None:
    """What the audit calls "duplicated": the row was put back to pending and handled again."""
    url = outbox_database_url
    topic = "handled.twice"
    handlers = Handlers()

    @handlers.handler(topic)
    def on_message(message: InboxMessage, conn: Any) -> None:
        pass

    (mid,) = put(url, topic, [{"n": 0}], ["k"])
    with handler_thread(url, handlers):
        wait_for(lambda: _counts(url)[mid][0] == 1, 30, "the first handling")
        with psycopg.connect(url) as conn:
            conn.execute(
                "UPDATE outbox.consumer_queue SET processed_at = NULL, payload = '{}'"
                " WHERE message_id = %s",
                (mid,),
            )
        wait_for(lambda: _counts(url)[mid][0] == 2, 30, "the second handling")
    assert _counts(url)[mid] == (2, 2, True, False)


def test_migration_counts_rows_processed_before_it_once(outbox_empty_database_url: str) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url, revision="0001")
    with psycopg.connect(url) as conn:
        for processed in (True, False):
            conn.execute(
                "INSERT INTO outbox.consumer_queue (message_id, topic, payload, content_type,"
                " lane, processed_at) VALUES (%s, 't', '', 'x', 0,"
                " CASE WHEN %s THEN now() END)",
                (uuid.uuid4(), processed),
            )
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT processed_at IS NOT NULL, handled_count FROM outbox.consumer_queue ORDER BY 1"
        ).fetchall()
        assert rows == [(False, 0), (True, 1)]
    migrate.downgrade(url, revision="0001")
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'outbox' AND table_name = 'consumer_queue'"
        ).fetchall()
    assert ("handled_count",) not in columns
    assert ("processed_at",) in columns
