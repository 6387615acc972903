"""What the servers of `outbox.testing.servers` share: where a server came from (`Source`), the
handles callers rely on whatever the source (`PostgresHandle`, `KafkaHandle`), `ServerError`,
the `atexit` safety net that stops what its owner forgot, and small helpers."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, Self
from urllib.parse import urlsplit, urlunsplit

from outbox import settings

#: libpq URL of an existing PostgreSQL server whose role may CREATE DATABASE.
ENV_DATABASE_URL = settings.TEST_DATABASE_URL
#: bootstrap servers ("host:port[,...]") of an existing Kafka cluster.
ENV_KAFKA_BOOTSTRAP = settings.TEST_KAFKA_BOOTSTRAP
#: set to 1/true/yes to use local servers even when a Docker engine answers.
ENV_NO_DOCKER = settings.TEST_NO_DOCKER
#: optional explicit path of a `tansu` executable.
ENV_TANSU_BIN = settings.TANSU_BIN

#: Where a server came from: "local" process, "docker" container, or "external" (env var).
Source = Literal["local", "docker", "external"]


class ServerError(RuntimeError):
    """A test server could not be found, started or stopped."""


# --------------------------------------------------------------------------------------------
# atexit safety net: every server we start registers here and unregisters in stop().


class _Stoppable(Protocol):
    def stop(self) -> None: ...


_live: dict[int, _Stoppable] = {}
_live_lock = threading.Lock()


def _track(server: _Stoppable) -> None:
    with _live_lock:
        _live[id(server)] = server


def _untrack(server: _Stoppable) -> None:
    with _live_lock:
        _live.pop(id(server), None)


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop servers whose owner never called stop() (last resort; errors are swallowed)."""
    with _live_lock:
        servers = list(_live.values())
    for server in reversed(servers):
        with contextlib.suppress(Exception):
            server.stop()


# --------------------------------------------------------------------------------------------
# Small helpers


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (callers retry on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def url_for_database(server_url: str, dbname: str) -> str:
    """Return `server_url` with its database (URL path) replaced by `dbname`; query kept."""
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-limit:].decode("utf-8", "replace").strip() or "(empty log)"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


# --------------------------------------------------------------------------------------------
# Handles: what callers may rely on, whatever the source


class PostgresHandle(Protocol):
    """A PostgreSQL server: `url` is a superuser-ish admin URL for the `postgres` database."""

    @property
    def source(self) -> Source: ...

    @property
    def url(self) -> str: ...

    def url_for(self, dbname: str) -> str:
        """URL of database `dbname` on this server."""
        ...

    def restart(self) -> None:
        """Restart keeping data and port (local only; else NotImplementedError)."""
        ...

    def stop(self) -> None:
        """Stop the server if we started it; idempotent."""
        ...


class KafkaHandle(Protocol):
    """A Kafka-protocol broker reachable at `bootstrap`."""

    @property
    def source(self) -> Source: ...

    @property
    def bootstrap(self) -> str: ...

    def pause(self) -> None:
        """Freeze the broker (local only; else NotImplementedError)."""
        ...

    def resume(self) -> None:
        """Unfreeze a paused broker (local only; else NotImplementedError)."""
        ...

    def stop(self) -> None:
        """Stop the broker if we started it; idempotent."""
        ...


class _ContextManagerMixin:
    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
