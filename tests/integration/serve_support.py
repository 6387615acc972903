"""`outbox serve` in a subprocess for the tests, and a small JSON client over urllib."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from outbox.testing.servers import free_port

from .relay_helpers import Daemon


@dataclass
class Server:
    """A running `outbox serve`: its port and its process."""

    port: int
    daemon: Daemon
    token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> tuple[int, Any]:
        """(status, decoded JSON answer or None) of one request."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        given = token if token is not None else self.token
        if given:
            request.add_header("Authorization", f"Bearer {given}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        if status >= 500 and not text.startswith(b"{"):
            raise AssertionError(f"{status} {text!r}: {self.daemon.output()}")
        return status, json.loads(text) if text.strip() else None


def serve_args(url: str, log_url: str | None, *extra: str) -> list[str]:
    """The flags of `outbox serve` over database `url` and, given, the log at `log_url`."""
    transport = ["--transport", "postgres", "--log-url", log_url] if log_url else []
    return ["serve", "--database-url", url, *transport, *extra]


@contextmanager
def serving(
    url: str,
    log_url: str | None,
    *extra: str,
    token: str | None = None,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Iterator[Server]:
    """`outbox serve` in a subprocess until the block ends (SIGKILL if it does not stop)."""
    chosen = port or free_port()
    with Daemon(*serve_args(url, log_url, "--port", str(chosen), *extra), env=env) as daemon:
        server = Server(chosen, daemon, token)
        wait_until_up(server)
        yield server


def wait_until_up(server: Server, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.daemon.process.poll() is not None:
            raise AssertionError(f"outbox serve exited: {server.daemon.output()}")
        try:
            status, _ = server.call("GET", "/livez", timeout=2)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"outbox serve did not answer within {timeout}s: {server.daemon.output()}")
