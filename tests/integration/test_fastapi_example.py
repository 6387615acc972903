"""examples/fastapi_app: a real HTTP request sends, and the handler's effect shows, with the
relay, consumer and handler running in the web process's lifespan (uvicorn, a subprocess)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

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
