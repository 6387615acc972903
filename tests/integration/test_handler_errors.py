"""No callback error stops the Handler: every failure is recorded, whatever its text."""

from __future__ import annotations

import json
import uuid
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


class _RaisingStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


ERRORS: dict[str, BaseException] = {
    "nul": RuntimeError("bad\x00byte"),
    "surrogate": RuntimeError("lone \udc80 surrogate"),
    "raising-str": _RaisingStr(),
}


def _put(
    url: str, topic: str, payloads: list[bytes], content_type: str = "application/json"
) -> None:
    rows = []
    for offset, payload in enumerate(payloads):
        mid = uuid.uuid4()
        rows.append(
            InboxRow(
                mid,
                topic,
                b"k",
                payload,
                {},
                content_type,
                lane_for(b"k", mid),
                datetime.now(UTC),
                0,
                offset,
            )
        )
    with psycopg.connect(url) as conn:
        conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of(rows), channel("outbox", "consumer_queue")),
        )


def _done(url: str) -> bool:
    """One row processed and one dead."""
    return (
        count(url, "consumer_processed") == 1
        and count(url, "consumer_queue", "dead_at IS NOT NULL") == 1
    )


def _dead(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT attempts, last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL "
            "ORDER BY id"
        ).fetchall()


@pytest.mark.parametrize("flavour", ["sync", "async", "batch"])
@pytest.mark.parametrize("kind", list(ERRORS))
def test_any_exception_text_is_recorded(outbox_database_url: str, kind: str, flavour: str) -> None:
    # defect 3: a NUL in an exception's text made `outbox handler` exit on every start
    url = outbox_database_url
    handlers = Handlers()
    error = ERRORS[kind]
    if flavour == "sync":

        @handlers.handler("t", max_attempts=2, backoff=FAST)
        def sync(message: InboxMessage, conn: Any) -> None:
            if message.payload["fail"]:
                raise error

    elif flavour == "async":

        @handlers.handler("t", max_attempts=2, backoff=FAST)
        async def run_async(message: InboxMessage, conn: Any) -> None:
            if message.payload["fail"]:
                raise error

    else:

        @handlers.batch_handler("t", max_attempts=2, backoff=FAST)
        def batch(messages: list[InboxMessage], conn: Any) -> None:
            if any(m.payload["fail"] for m in messages):
                raise error

    _put(url, "t", [b'{"fail": true}', b'{"fail": false}'])
    with handler_thread(url, handlers):
        wait_for(lambda: _done(url), 30, "both rows done")
    [(attempts, last_error)] = _dead(url)
    assert attempts == 2
    assert type(error).__name__ in last_error
    if kind == "nul":
        assert "bad\\x00byte" in last_error
    if kind == "surrogate":
        assert "\\udc80" in last_error


@pytest.mark.parametrize("flavour", ["sync", "async", "batch"])
def test_an_undecodable_payload_is_dead_at_once(outbox_database_url: str, flavour: str) -> None:
    # defect 3: a payload that can never be decoded was retried max_attempts times
    url = outbox_database_url
    handlers = Handlers()
    seen: list[Any] = []
    if flavour == "sync":
        handlers.handler("t", max_attempts=5, backoff=FAST)(lambda m, c: seen.append(m.payload))
    elif flavour == "async":

        @handlers.handler("t", max_attempts=5, backoff=FAST)
        async def run_async(message: InboxMessage, conn: Any) -> None:
            seen.append(message.payload)

    else:
        handlers.batch_handler("t", max_attempts=5, backoff=FAST)(
            lambda ms, c: seen.extend(m.payload for m in ms)
        )
    _put(url, "t", [b"{not json", json.dumps({"ok": 1}).encode()])
    with handler_thread(url, handlers):
        wait_for(lambda: _done(url), 30, "both rows done")
    [(attempts, last_error)] = _dead(url)
    assert attempts == 1
    assert "cannot decode the payload as 'application/json'" in last_error
    assert seen == [{"ok": 1}]


@pytest.mark.parametrize("flavour", ["sync", "async", "batch"])
def test_the_log_line_of_a_failed_callback_names_the_exception_class(
    outbox_database_url: str, flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 24: a KeyError was logged as `'via'` alone, which says nothing
    url = outbox_database_url
    handlers = Handlers()
    if flavour == "sync":

        @handlers.handler("t", max_attempts=2, backoff=FAST)
        def sync(message: InboxMessage, conn: Any) -> None:
            if message.payload["fail"]:
                _ = {}["via"]

    elif flavour == "async":

        @handlers.handler("t", max_attempts=2, backoff=FAST)
        async def run_async(message: InboxMessage, conn: Any) -> None:
            if message.payload["fail"]:
                _ = {}["via"]

    else:

        @handlers.batch_handler("t", max_attempts=2, backoff=FAST)
        def batch(messages: list[InboxMessage], conn: Any) -> None:
            if any(m.payload["fail"] for m in messages):
                _ = {}["via"]

    _put(url, "t", [b'{"fail": true}', b'{"fail": false}'])
    with caplog.at_level("WARNING", logger="outbox.handler"), handler_thread(url, handlers):
        wait_for(lambda: _done(url), 30, "both rows done")
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 2, failed
    assert all(line.endswith(": KeyError: 'via'") for line in failed), failed
    assert "(now dead): KeyError: 'via'" in failed[-1]
