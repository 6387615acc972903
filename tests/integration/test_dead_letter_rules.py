"""Dead letters of the inbox: quarantined records shown and requeued, and a dead message's key."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg

from outbox import Backoff, Handlers, InboxMessage
from outbox.kafka.subscriber import decode_record

from .relay_helpers import app_of, count, handler_thread, running, wait_for
from .test_handler_errors import _put
from .test_quarantine import _Once

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)
CLI = [sys.executable, "-m", "outbox.cli"]


def _ok(*args: str) -> str:
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_quarantined_row_is_listed_shown_and_requeued_as_raw_bytes(
    outbox_database_url: str,
) -> None:
    # defect 2: quarantined rows in `outbox dead-letters`, and their requeue
    url = outbox_database_url
    record = decode_record(
        topic="t",
        partition=0,
        offset=9,
        key=b"k",
        value=b'{"not": "decoded"}',
        headers=[("bad\x00name", b"\x00\x01"), ("content-type", b"application/json")],
        timestamp_ms=1_700_000_000_000,
    )
    assert record.quarantine is not None
    subscriber = _Once([record])
    consumer = app_of(url, group="g", topics=["t"], subscribers=lambda: subscriber).consumer()
    with running(consumer):
        wait_for(lambda: bool(subscriber.committed), 30, "the commit")

    listing = _ok("dead-letters", "list", "--database-url", url)
    assert "(quarantined) header name 'bad\\x00name' cannot be stored" in listing
    page = json.loads(_ok("dead-letters", "list", "--database-url", url, "--json"))
    assert page["rows"][0]["quarantined"] is True
    row_id = str(page["rows"][0]["id"])
    shown = _ok("dead-letters", "show", row_id, "--database-url", url)
    assert "quarantined: stored dead on arrival" in shown
    assert "b'bad\\x00name': b'\\x00\\x01'" in shown
    assert "b'content-type': b'application/json'" in shown
    doc = json.loads(_ok("dead-letters", "show", row_id, "--database-url", url, "--json"))
    assert doc["quarantined"] is True
    assert doc["raw_headers"][0] == {
        "name": b"bad\x00name".hex(),
        "name_encoding": "hex",
        "value": "0001",
        "value_encoding": "hex",
    }

    _ok("dead-letters", "requeue", row_id, "--database-url", url)
    seen: list[Any] = []
    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: seen.append((message.payload, message.headers)))
    with handler_thread(url, handlers):
        wait_for(lambda: count(url, "consumer_processed") == 1, 30, "it")
    assert seen == [(b'{"not": "decoded"}', {})]


def test_a_dead_message_does_not_hold_its_key_and_requeued_runs_after_the_later_ones(
    outbox_database_url: str,
) -> None:
    # defect 6: the ordering rule, made deliberate; requeue warns about the overtaken order
    url = outbox_database_url
    handled: list[int] = []
    broken = {0}

    def build() -> Handlers:
        handlers = Handlers()

        @handlers.handler("t", ordered=True, max_attempts=1, backoff=FAST)
        def on(message: InboxMessage, conn: Any) -> None:
            if message.payload["n"] in broken:
                raise RuntimeError("broken for now")
            handled.append(message.payload["n"])

        return handlers

    _put(url, "t", [json.dumps({"n": n}).encode() for n in range(4)])  # one key: b"k"
    with handler_thread(url, build()):
        wait_for(lambda: count(url, "consumer_processed") == 3, 30, "1-3")
    assert handled == [1, 2, 3]  # n=0 is dead; its key's later messages were not held

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT id FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
        ).fetchone()
    assert row is not None
    out = _ok("dead-letters", "requeue", str(row[0]), "--database-url", url)
    assert (
        f"warning: row {row[0]} (key k): 3 later messages of the same key were already handled"
        in out
    )
    broken.clear()
    with handler_thread(url, build()):
        wait_for(lambda: count(url, "consumer_processed") == 4, 30, "0")
    assert handled == [1, 2, 3, 0]  # requeued, it ran after them
    # Nothing overtaken, nothing to warn about.
    assert "warning" not in _ok("dead-letters", "requeue", "--all", "--database-url", url)
