"""A transport defined only in the tests runs under every command, `status` and the console.

tests/transport/files_log.py (an append-only log in a directory of files) declares its registry
entry and registers it; naming its module in OUTBOX_TRANSPORT_MODULES is all it takes: no other
file knows it. The daemons run as separate processes, as an operator starts them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from outbox import Broker, transports
from outbox.console import ConsoleConfig, Database, serve
from tests.transport.conftest import register_test_transport

from . import inbox_app
from .relay_helpers import Daemon, count, wait_for

APP = "tests.integration.inbox_app:handlers"
MODULE = "tests.transport.files_log"


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files log's directory; the module that registers it named for every process (and
    registered in this one for the test only)."""
    directory = tmp_path / "files-log"
    directory.mkdir()
    monkeypatch.setenv("OUTBOX_TRANSPORT_MODULES", MODULE)
    register_test_transport(monkeypatch)
    return directory


def _env(topic: str) -> dict[str, str]:
    return {"OUTBOX_TRANSPORT_MODULES": MODULE, "INBOX_APP_TOPIC": topic}


def _send(url: str, topic: str, n: int, start: int = 0) -> None:
    broker = Broker()
    with psycopg.connect(url) as conn, conn.transaction():
        for i in range(start, start + n):
            broker.send(conn, topic, {"n": i}, key=f"k{i % 5}")


def _effects(url: str) -> Counter[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT body::jsonb->>'n' FROM effects").fetchall()
    return Counter(int(row[0]) for row in rows)


def _prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)


def _outbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUTBOX_TRANSPORT_MODULES": MODULE},
    )


def _stop(daemon: Daemon) -> None:
    daemon.terminate()
    assert daemon.wait(30) == 0, daemon.output()


def test_producer_consumer_and_handler_run_on_it_and_status_shows_its_lag(
    outbox_database_url: str, files: Path
) -> None:
    url = outbox_database_url
    _prepare(url)
    topic = "files.orders"
    group = "g-files"
    flags = ("--transport", "files", "--files-dir", str(files))
    _send(url, topic, 12)
    with Daemon("producer", "--database-url", url, *flags, env=_env(topic)) as producer:
        wait_for(lambda: count(url) == 0, 60, "the producer to relay into the files log")
        _stop(producer)
        assert "transport=files" in producer.output()
    records = sum(
        len(path.read_text().splitlines()) for path in (files / "topics" / topic).glob("*.log")
    )
    assert records == 12
    with Daemon(
        "consumer", "--database-url", url, *flags, "--topic", topic, "--group", group,
        env=_env(topic),
    ) as consumer:  # fmt: skip
        wait_for(lambda: count(url, "consumer_queue") == 12, 60, "the consumer to store")
        with Daemon("handler", APP, "--database-url", url, "--poll-interval", "0.2",
                    env=_env(topic)) as handler:  # fmt: skip
            wait_for(lambda: sum(_effects(url).values()) == 12, 60, "the handler")
            _stop(handler)
        wait_for(lambda: _lag_total(url, flags, group) == 0, 30, "the group's commits")
        _stop(consumer)
    assert _effects(url) == Counter(range(12))
    shown = _outbox("status", "--database-url", url, *flags, "--group", group, "--json")
    assert shown.returncode == 0, shown.stderr
    [lag] = json.loads(shown.stdout)["lag"]
    assert lag["group"] == group and lag["total"] == 0
    assert sorted(p["partition"] for p in lag["partitions"]) == [0, 1, 2]
    assert sum(p["end"] for p in lag["partitions"]) == 12
    text = _outbox("status", "--database-url", url, *flags, "--group", group)
    assert text.returncode == 0, text.stderr
    assert group in text.stdout
    # --check --max-lag reads it too: lag 0 passes.
    checked = _outbox(
        "status", "--database-url", url, *flags, "--group", group, "--check", "--max-lag", "0"
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _lag_total(url: str, flags: tuple[str, ...], group: str) -> int:
    shown = _outbox("status", "--database-url", url, *flags, "--group", group, "--json")
    assert shown.returncode == 0, shown.stderr
    [lag] = json.loads(shown.stdout)["lag"]
    return int(lag["total"])


def test_outbox_run_handles_each_message_once(outbox_database_url: str, files: Path) -> None:
    url = outbox_database_url
    _prepare(url)
    topic = "files.run"
    _send(url, topic, 20)
    with Daemon(
        "run", APP, "--database-url", url, "--transport", "files", "--files-dir", str(files),
        "--group", "g-run", "--poll-interval", "0.2", env=_env(topic),
    ) as run:  # fmt: skip
        wait_for(lambda: sum(_effects(url).values()) >= 20, 60, "outbox run to handle")
        _send(url, topic, 5, start=20)
        wait_for(lambda: sum(_effects(url).values()) >= 25, 60, "outbox run to handle more")
        _stop(run)
    assert _effects(url) == Counter(range(25))


def test_asyncapi_takes_it(files: Path) -> None:
    unknown = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "asyncapi", APP, "--transport", "files"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "OUTBOX_TRANSPORT_MODULES"},
    )
    assert unknown.returncode == 2 and "--transport" in unknown.stderr, unknown.stderr
    written = _outbox("asyncapi", APP, "--transport", "files", "--files-dir", str(files))
    assert written.returncode == 0, written.stderr
    assert "files" in json.loads(written.stdout)["servers"]


def test_the_console_shows_its_lag(outbox_database_url: str, files: Path) -> None:
    from outbox.core.batches import outgoing
    from tests.transport.files_log import FilesOptions, FilesPublisher, FilesSubscriber
    from tests.transport.test_contract import message

    options = FilesOptions(str(files))
    FilesPublisher(options).publish([outgoing(message("files.console", b"{}")) for _ in range(4)])
    member = FilesSubscriber(options, ["files.console"], "shipping")
    member.commit(member.poll(1, 5.0))
    member.close()
    config = ConsoleConfig(
        databases=(Database("orders", outbox_database_url),),
        port=0,
        sample_interval=0.2,
        transport=transports.settings_of("files", files_dir=str(files)),
        groups=("shipping",),
    )
    app = serve(config)
    try:
        from tests.integration.test_console import Client

        client = Client(app)
        wait_for(lambda: client.get_json("/api/status?db=orders")[1]["lag"], 30, "the lag read")
        [shipping] = client.get_json("/api/status?db=orders")[1]["lag"]
        assert shipping["group"] == "shipping" and shipping["total"] == 3, shipping
        _, view = client.get_json("/api/view?db=orders")
        assert "group shipping" in view["lag"]
    finally:
        app.close()


def test_drain_runs_on_it(outbox_database_url: str, files: Path) -> None:
    from outbox.testing import drain

    url = outbox_database_url
    _prepare(url)
    handlers = inbox_app.handlers
    _send(url, inbox_app.TOPIC, 3)
    result = drain(handlers, url, transports.settings_of("files", files_dir=str(files)), timeout=60)
    assert result.handled == 3
    assert _effects(url) == Counter(range(3))
