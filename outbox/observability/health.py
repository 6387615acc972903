"""Liveness and readiness over HTTP (`--health-port`), from the standard library's http.server.

`/livez` answers 200 while the daemon's main loop made progress within the liveness timeout (it
beats a `Heartbeat` every turn, every reconnect attempt, every backoff wait, and while it waits
for its workers), else 503: the process is wedged and restarting it is the cure. `/readyz`
answers 200 while the main loop runs, the last dependency checks (PostgreSQL; Kafka for the
producer and consumer) succeeded and are recent, and none of the daemon's loops (the main loop,
the Handler's workers, the Consumer's inserts) is failing again and again (`watch`), else 503
with the reason in the body: an outage or a startup, where a restart does not help. (A failure
that retrying cannot fix does not make a daemon unready: it stops the daemon, exit code 1.)
Both answer in microseconds from state kept by the probe thread, never by probing on the request.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from outbox.core.errors import ConfigurationError

log = logging.getLogger("outbox.health")


class Heartbeat:
    """When the main loop last made progress; `beat()` costs one attribute write."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        """Record progress now."""
        self.last = time.monotonic()

    def age(self) -> float:
        """Seconds since the last beat."""
        return time.monotonic() - self.last


@dataclass
class HealthState:
    """What the health endpoints report; written by the daemon and its probe thread."""

    heartbeat: Heartbeat
    liveness_timeout: float
    #: Checks older than this (seconds) no longer count as passing (a hung probe).
    check_expiry: float
    #: Set once the daemon passed its startup checks and entered its main loop.
    running: bool = False
    stopping: bool = False
    #: name -> None when the dependency answered, else why not.
    failures: dict[str, str | None] = field(default_factory=dict)
    checked_at: float | None = None
    #: Each says why a loop of the daemon keeps failing, or None (see `watch`).
    troubles: list[Callable[[], str | None]] = field(default_factory=list)
    #: A daemon of several databases: the state of each, added to `/readyz`'s reason.
    report: Callable[[], str] | None = None

    def watch(self, trouble: Callable[[], str | None]) -> None:
        """Make `/readyz` fail whenever `trouble()` gives a reason (a loop in a retry backoff
        that keeps failing: `outbox.daemons.outages.Outage.trouble`)."""
        self.troubles.append(trouble)

    def live(self) -> tuple[bool, str]:
        """(alive, reason): the main loop beat within the liveness timeout."""
        age = self.heartbeat.age()
        if age > self.liveness_timeout:
            return False, (
                f"main loop made no progress for {age:.0f}s "
                f"(liveness timeout {self.liveness_timeout:g}s)"
            )
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """(ready, reason): running, alive, no loop failing again and again, and every
        dependency answered recently."""
        if self.stopping:
            return False, "stopping"
        if not self.running:
            return False, "starting"
        alive, reason = self.live()
        if not alive:
            return False, reason
        problems = [reason for reason in (trouble() for trouble in self.troubles) if reason]
        if self.checked_at is None:
            problems.append("dependencies not checked yet")
        else:
            age = time.monotonic() - self.checked_at
            if age > self.check_expiry:
                problems.append(f"dependency checks have not completed for {age:.0f}s")
            else:
                problems.extend(reason for reason in self.failures.values() if reason)
        report = "" if self.report is None else f"; {self.report()}"
        if problems:
            return False, "; ".join(problems) + report
        return True, "ok" + report

    def record(self, failures: dict[str, str | None]) -> None:
        """Store the outcome of one round of dependency checks."""
        self.failures = failures
        self.checked_at = time.monotonic()


def _handler_class(state: HealthState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """GET /livez and /readyz: 200 or 503, the reason as text (JSON with ?format=json)."""

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/livez":
                ok, reason = state.live()
            elif path == "/readyz":
                ok, reason = state.ready()
            else:
                self._answer(404, "not found: try /livez or /readyz\n", "text/plain")
                return
            if "format=json" in query:
                body = json.dumps({"ok": ok, "reason": reason}) + "\n"
                self._answer(200 if ok else 503, body, "application/json")
            else:
                self._answer(200 if ok else 503, reason + "\n", "text/plain")

        def _answer(self, status: int, body: str, content_type: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("health request: " + format, *args)

    return Handler


class _ProbeServer(ThreadingHTTPServer):
    #: Connections waiting to be accepted: a probe that comes while the process is busy waits
    #: in this queue rather than finding it full (socketserver's default is 5).
    request_queue_size = 64


class HealthServer:
    """Serves `/livez` and `/readyz` from a daemon thread until `stop()`."""

    def __init__(self, state: HealthState, host: str, port: int) -> None:
        try:
            self._server = _ProbeServer((host, port), _handler_class(state))
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve health checks on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="outbox-health", daemon=True
        )
        self._started = False

    @property
    def port(self) -> int:
        """The bound port (the chosen one when 0 was asked for)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Start answering."""
        self._thread.start()
        self._started = True

    def stop(self) -> None:
        """Stop answering and close the socket."""
        if self._started:
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()
