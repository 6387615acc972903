"""handled_count: +1 per committed handling, never on a failure (consumer_processed since
migration 0007; migration 0002 added it to consumer_queue); a handled id is not handled again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from outbox import Backoff, Handlers, InboxMessage
from outbox.core.batches import InboxBatch
from outbox.core.lanes import lane_for
from outbox.kafka.subscriber import InboxRow
from outbox.postgres import migrate
from outbox.postgres.inbox import InboxStore, insert_params
from outbox.postgres.queries import channel, queries

from .relay_helpers import count, handler_thread, wait_for
from .test_inbox import put

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)


def _counts(url: str) -> dict[uuid.UUID, tuple[int, int, bool, bool]]:
    """message_id -> (handled_count, attempts, processed, dead); a handled message is in
    consumer_processed, the others in consumer_queue."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id, handled_count, attempts, true, false"
            " FROM outbox.consumer_processed UNION ALL"
            " SELECT message_id, handled_count, attempts, false, dead_at IS NOT NULL"
            " FROM outbox.consumer_queue"
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


def test_a_message_handled_again_counts_two(outbox_database_url: str) -> None:
    """What the audit calls "duplicated": a handling committed for a message id already in
    consumer_processed counts there (the claim should make it impossible: see
    test_a_row_stored_again_for_a_handled_id_is_dropped_not_handled)."""
    url = outbox_database_url
    topic = "handled.twice"
    (mid,) = put(url, topic, [{"n": 0}], ["k"])
    store = InboxStore("outbox")
    for handling in range(2):
        with psycopg.connect(url) as conn, conn.transaction():
            if handling:  # put back, as the race of inbox_insert with a committing handler
                conn.execute(
                    "INSERT INTO outbox.consumer_queue (message_id, topic, payload,"
                    " content_type, lane) VALUES (%s, %s, '{}', 'application/json', 0)",
                    (mid, topic),
                )
            found = conn.execute(
                "SELECT id FROM outbox.consumer_queue WHERE message_id = %s", (mid,)
            ).fetchone()
            assert found is not None
            store.done_many(conn.execute, [found[0]])
    assert _counts(url)[mid] == (2, 2, True, False)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT handled_count FROM outbox.consumer_processed WHERE message_id = %s", (mid,)
        ).fetchone()
    assert row == (2,)


def test_a_row_stored_again_for_a_handled_id_is_dropped_not_handled(
    outbox_database_url: str,
) -> None:
    """The Consumer's insert checks consumer_processed in its statement's snapshot: a
    redelivery stored while its first copy's handling commits gets in. The claim drops it."""
    url = outbox_database_url
    topic = "handled.race"
    handlers = Handlers()
    seen: list[uuid.UUID] = []

    @handlers.handler(topic)
    def on_message(message: InboxMessage, conn: Any) -> None:
        seen.append(message.id)

    (mid,) = put(url, topic, [{"n": 0}], ["k"])
    with handler_thread(url, handlers):
        wait_for(lambda: _counts(url).get(mid) == (1, 1, True, False), 30, "the first handling")
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO outbox.consumer_queue (message_id, topic, payload, content_type,"
                " lane) VALUES (%s, %s, '{}', 'application/json', 0)",
                (mid, topic),
            )
        wait_for(lambda: count(url, "consumer_queue") == 0, 30, "the copy to be dropped")
    assert seen == [mid]
    assert _counts(url)[mid] == (1, 1, True, False)
    # and the Consumer's own statement refuses it outright
    assert put_again(url, topic, mid) == 0


def put_again(url: str, topic: str, mid: uuid.UUID) -> int:
    """Store message `mid` again with the Consumer's statement; the rows stored."""
    row = InboxRow(
        message_id=mid,
        topic=topic,
        key=b"k",
        payload=b"{}",
        headers={},
        content_type="application/json",
        lane=lane_for(b"k", mid),
        created_at=datetime.now(UTC),
        partition=0,
        offset=0,
    )
    with psycopg.connect(url) as conn, conn.transaction():
        found = conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of([row]), channel("outbox", "consumer_queue")),
        ).fetchone()
    assert found is not None
    return int(found[0])


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
    migrate.upgrade(url, revision="0002")
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
