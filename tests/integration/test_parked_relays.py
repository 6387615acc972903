"""A relay parked by --idle-disconnect (a database with nothing to do: no lanes, no connection)
is shown as parked, with since when, by `outbox status` (text and --json) and the console; it
was "processes: none registered". It is listed again as working when rows come, and its row
goes when the process stops."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg

from outbox.console import ConsoleConfig, Database, serve

from . import inbox_app
from .relay_helpers import Daemon, wait_for
from .test_console import Client
from .test_operations import insert

APP = "tests.integration.inbox_app:handlers"
TOPIC = "parked.orders"


def _status(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", "status", "--database-url", url, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _processes(url: str) -> list[dict[str, Any]]:
    shown = _status(url, "--json")
    assert shown.returncode == 0, shown.stderr
    found: list[dict[str, Any]] = json.loads(shown.stdout)["processes"]
    return found


def _prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)


def test_a_parked_relay_is_shown_as_parked_by_status_and_the_console(
    outbox_database_factory: Any,
) -> None:
    acme, globex = outbox_database_factory(), outbox_database_factory()
    for url in (acme, globex):
        _prepare(url)
    with Daemon(
        "handler", APP, "--database-url", f"acme={acme}", "--database-url", f"globex={globex}",
        "--idle-disconnect", "1", "--poll-interval", "0.2",
        env={"INBOX_APP_TOPIC": TOPIC},
    ) as handler:  # fmt: skip
        wait_for(
            lambda: any(p["parked"] for p in _processes(acme)), 60, "the relay of acme to park"
        )
        [process] = _processes(acme)
        assert process["parked"] and process["parked_since"] is not None, process
        assert process["alive"] and process["lanes"] == 0, process
        assert process["queue"] == "handler"
        text = _status(acme)
        assert text.returncode == 0, text.stderr
        assert "processes: 1 registered in relay_state (1 parked" in text.stdout, text.stdout
        assert "parked since " in text.stdout
        assert "none registered" not in text.stdout

        app = serve(ConsoleConfig(databases=(Database("acme", acme),), port=0))
        try:
            client = Client(app)
            _, doc = client.get_json("/api/status?db=acme")
            [shown] = doc["processes"]
            assert shown["parked"] and shown["parked_since"] == process["parked_since"], shown
            _, view = client.get_json("/api/view?db=acme")
            assert "parked since " in json.dumps(view)
        finally:
            app.close()

        # Rows come: the relay goes back to its lanes (not parked), handles them, parks again.
        insert(acme, "consumer", "pending", topic=TOPIC, payload=b'{"n": 1}')
        wait_for(lambda: _effects(acme) == 1, 60, "the parked relay to find and handle the row")
        wait_for(lambda: any(p["parked"] for p in _processes(acme)), 60, "the relay to park again")
        handler.terminate()
        assert handler.wait(30) == 0, handler.output()
    # Stopped while parked: its row is gone.
    assert _processes(acme) == []
    assert _processes(globex) == []


def _effects(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM effects").fetchone()
    assert row is not None
    return int(row[0])
