"""Handlers(pipeline=True): batches in psycopg's pipeline mode keep every inbox guarantee.

A failing statement surfaces late in pipeline mode; these tests check the runner still blames
the right message, keeps the others' writes exactly once, and commits nothing of a failure.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outbox import Handlers, InboxMessage
from outbox.core.errors import ConfigurationError

from .relay_helpers import count, handler_thread, wait_for
from .test_inbox import _effects, _prepare, dead, processed, put


def _pipelined_handlers(fail_on: int | None, *, sql_failure: bool) -> Handlers:
    handlers = Handlers(pipeline=True)

    @handlers.handler("piped", max_attempts=1, ordered=False)
    def write(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        n = message.payload["n"]
        conn.execute(
            "INSERT INTO effects (message_id, attempt, body) VALUES (%s, %s, %s)",
            (message.id, message.attempt, str(n)),
        )
        if n == fail_on:
            if sql_failure:
                # Fails on the server: in pipeline mode the error arrives after later callbacks.
                conn.execute("INSERT INTO effects (message_id, attempt) VALUES (NULL, 1)")
            else:
                raise RuntimeError("planned failure")

    return handlers


def test_a_pipelined_batch_handles_every_message_once(outbox_database_url: str) -> None:
    url = outbox_database_url
    _prepare(url)
    ids = put(url, "piped", [{"n": i} for i in range(300)], [f"k{i % 7}" for i in range(300)])
    handlers = _pipelined_handlers(None, sql_failure=False)
    with handler_thread(url, handlers, concurrency=2, transaction_size=100):
        wait_for(lambda: processed(url) == 300, 30, "300 handled")
    effects = _effects(url)
    assert sorted(r[0] for r in effects) == sorted(ids)
    assert count(url, "consumer_processed", "handled_count <> 1") == 0


@pytest.mark.parametrize("sql_failure", [True, False], ids=["failing statement", "exception"])
@pytest.mark.parametrize("failing", [5, 19], ids=["in the middle", "last"])
def test_a_failure_in_a_pipelined_batch_blames_its_own_message(
    outbox_database_url: str, sql_failure: bool, failing: int
) -> None:
    """The last message's failing statement can only surface when the batch ends."""
    url = outbox_database_url
    _prepare(url)
    ids = put(url, "piped", [{"n": i} for i in range(20)], ["one key"] * 20)
    handlers = _pipelined_handlers(failing, sql_failure=sql_failure)
    with handler_thread(url, handlers, concurrency=1, transaction_size=100):
        wait_for(lambda: processed(url) == 19 and dead(url) == 1, 30, "19 handled, one dead")
    assert sorted(int(r[2]) for r in _effects(url)) == [n for n in range(20) if n != failing]
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT message_id, last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
        ).fetchone()
    assert row is not None
    assert row[0] == ids[failing]
    expected = "NotNullViolation" if sql_failure else "planned failure"
    assert expected in row[1]


def test_pipeline_needs_psycopg_transactions() -> None:
    with pytest.raises(ConfigurationError, match="pipeline=True needs transaction='psycopg'"):
        Handlers(transaction="sqlalchemy", pipeline=True)
    with pytest.raises(ConfigurationError, match="pipeline=False into one with pipeline=True"):
        Handlers(pipeline=True).include(Handlers())
