"""examples/fastapi_app: a typed FastAPI service.

A real HTTP request (uvicorn, a subprocess) sends, and the handler's effect shows, with the
relay, consumer and handler running in the web process's lifespan. Through uvicorn serving the
app without the runtime in this process (so that the outbox row stays for the test to see, and
a test can override the Broker dependency): the note and its `NoteCreated` commit together, and
a request that fails after writing both, or whose message the Broker refuses, leaves neither.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI

from examples.fastapi_app.app import NOTES_CREATED, NoteCreated, create_app, get_broker
from outbox import Broker
from outbox.testing import sent

from .relay_helpers import RelayTransport, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def app_env(outbox_database_url: str, relay_transport: RelayTransport) -> dict[str, str]:
    env = {
        "OUTBOX_DATABASE_URL": outbox_database_url,
        "OUTBOX_GROUP": "notes",
        "NOTES_TOPIC": relay_transport.topic(3),
    }
    if relay_transport.is_log:
        env |= {"OUTBOX_TRANSPORT": "postgres", "OUTBOX_LOG_URL": relay_transport.endpoint}
    else:
        env |= {"OUTBOX_TRANSPORT": "kafka", "OUTBOX_KAFKA_BOOTSTRAP": relay_transport.endpoint}
    return env


@pytest.fixture
def server(app_env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes], object]]:
    port = _free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "examples.fastapi_app.app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **app_env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, process, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


def _output(log: object) -> str:
    log.seek(0)  # type: ignore[attr-defined]
    return log.read().decode(errors="replace")  # type: ignore[attr-defined]


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_a_post_sends_in_its_transaction_and_the_handler_in_the_lifespan_sees_it_once(
    server: tuple[str, subprocess.Popen[bytes], object], outbox_database_url: str
) -> None:
    base, process, log = server
    deadline = time.monotonic() + 90
    while not _answers(base):
        assert process.poll() is None, _output(log)
        assert time.monotonic() < deadline, _output(log)
        time.sleep(0.2)

    created = httpx.post(f"{base}/notes", json={"text": "hello"}, timeout=10)
    assert created.status_code == 201, created.text
    note = created.json()["id"]

    def handled() -> int:
        answer = httpx.get(f"{base}/notes/{note}", timeout=10)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["handled"])

    wait_for(lambda: handled() >= 1, 60, "the handler's effect to show")
    process.send_signal(signal.SIGTERM)  # uvicorn ends the lifespan: the runtime drains
    # uvicorn re-raises the signal once shut down (0.29 and later): -15 is its clean exit.
    assert process.wait(60) in (0, -signal.SIGTERM), _output(log)
    output = _output(log)
    assert "Application shutdown complete" in output, output
    assert "outbox: producer, consumer and handler stopped" in output, output
    with psycopg.connect(outbox_database_url) as conn:
        rows = conn.execute("SELECT note_id FROM note_events").fetchall()
        queued = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
    assert rows == [(note,)]  # once
    assert queued == (0,)


# -- the sending side, in process ----------------------------------------------------------------


def _rows(url: str) -> tuple[list[tuple[Any, ...]], int]:
    """The notes, and the rows of producer_queue, committed in the database at `url`."""
    with psycopg.connect(url) as conn:
        notes = conn.execute("SELECT id, text FROM notes ORDER BY id").fetchall()
        queued = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
    assert queued is not None
    return notes, int(queued[0])


class Served:
    """The app served by uvicorn in a thread of this process, on a free loopback port."""

    def __init__(self, app: FastAPI, client: httpx.Client) -> None:
        self.app = app
        self.client = client


@pytest.fixture
def served(outbox_database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """The app without the runtime (nothing relays: the outbox rows stay) on this test's
    database, and an HTTP client of it."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", outbox_database_url)
    app = create_app(run_outbox=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), 30, "uvicorn to start")
        assert server.started, "uvicorn did not start"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield Served(app, client)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_a_post_commits_the_note_and_its_message_together(
    served: Served, outbox_database_url: str
) -> None:
    client = served.client
    with sent(outbox_database_url, NOTES_CREATED) as messages:
        created = client.post("/notes", json={"text": "hello <b>world</b>"})
    assert created.status_code == 201, created.text
    body = created.json()
    message = messages.one()
    assert UUID(body["message_id"]) == message.message_id
    assert isinstance(message.payload, NoteCreated)
    assert (message.payload.note_id, message.payload.text) == (body["id"], "hello <b>world</b>")
    assert message.key == str(body["id"]).encode()
    assert message.topic == NOTES_CREATED.name
    assert _rows(outbox_database_url) == ([(body["id"], "hello <b>world</b>")], 1)

    shown = client.get(f"/notes/{body['id']}")
    assert shown.json() == {"id": body["id"], "text": "hello <b>world</b>", "handled": 0}
    assert client.get("/notes/999999").status_code == 404
    assert client.get("/readyz").status_code == 503  # no runtime in this process


class _FailsAfterSending(Broker):
    """Sends for real, then fails: the request dies with both rows written, uncommitted."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[UUID] = []

    async def send_async(self, tx: object, *args: Any, **kwargs: Any) -> UUID:
        self.sent.append(await super().send_async(tx, *args, **kwargs))
        raise RuntimeError("the request fails after writing the note and its message")


def test_a_request_that_fails_after_both_writes_leaves_neither(
    served: Served, outbox_database_url: str
) -> None:
    failing = _FailsAfterSending()
    served.app.dependency_overrides[get_broker] = lambda: failing
    with sent(outbox_database_url) as messages:
        answer = served.client.post("/notes", json={"text": "never"})
    assert answer.status_code == 500
    assert len(failing.sent) == 1  # the message was written, then rolled back with the note
    assert list(messages) == []
    assert _rows(outbox_database_url) == ([], 0)


def test_a_message_the_broker_refuses_leaves_no_note(
    served: Served, outbox_database_url: str
) -> None:
    small = Broker(max_message_bytes=500)  # PayloadTooLarge after the note was flushed
    served.app.dependency_overrides[get_broker] = lambda: small
    answer = served.client.post("/notes", json={"text": "x" * 1000})
    assert answer.status_code == 500
    assert _rows(outbox_database_url) == ([], 0)


@pytest.mark.parametrize(
    "body", [{}, {"text": ""}, {"text": 7}, {"text": "x" * 10_001}, {"note": "x"}]
)
def test_an_invalid_request_writes_nothing(
    served: Served, outbox_database_url: str, body: dict[str, Any]
) -> None:
    answer = served.client.post("/notes", json=body)
    assert answer.status_code == 422, answer.text
    assert _rows(outbox_database_url) == ([], 0)


def test_the_docs_show_the_endpoint_as_it_is() -> None:
    page = (REPO_ROOT / "docs" / "how-to" / "one-process.md").read_text(encoding="utf-8")
    section = page[page.index("### FastAPI") : page.index("### Django")]
    source = (REPO_ROOT / "examples" / "fastapi_app" / "app.py").read_text(encoding="utf-8")
    endpoint = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "@router" in b]
    assert len(endpoint) == 1 and endpoint[0] in source, "one-process.md shows create_note"
