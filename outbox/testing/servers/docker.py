"""Servers in Docker: whether a Docker engine answers (`docker_available`), and PostgreSQL and
Apache Kafka in testcontainers containers (imported lazily, only when one answers)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import socket
import time
import warnings
from typing import Any
from urllib.parse import urlsplit

from outbox import settings
from outbox.testing.servers._base import (
    ENV_NO_DOCKER,
    ServerError,
    Source,
    _ContextManagerMixin,
    _track,
    _untrack,
    url_for_database,
)
from outbox.testing.servers.postgres import _FAST_SETTINGS, POSTGRES_IMAGE


def docker_available(timeout: float = 0.3) -> bool:
    """Return True when a Docker engine answers `GET /_ping` with OK within `timeout` seconds.

    Probes `$DOCKER_HOST` when set (unix:// or plain tcp:// only; other schemes count as
    unavailable), else `/var/run/docker.sock`. Never raises.
    """
    host = os.environ.get(settings.DOCKER_HOST, "").strip()
    if not host:
        return _docker_ping(socket.AF_UNIX, "/var/run/docker.sock", timeout)
    parts = urlsplit(host)
    if parts.scheme == "unix":
        return _docker_ping(socket.AF_UNIX, parts.path, timeout)
    if parts.scheme in {"tcp", "http"} and parts.hostname:
        try:
            port = parts.port or 2375
        except ValueError:
            return False
        return _docker_ping(socket.AF_INET, (parts.hostname, port), timeout)
    return False


def _docker_ping(family: int, address: str | tuple[str, int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    data = b""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            while len(data) < 65536:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                sock.settimeout(remaining)
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\nOK" in data:
                    break
    except OSError:  # includes timeouts, missing socket, refused connection
        return False
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    return len(status) >= 2 and status[1] == b"200" and body.strip().startswith(b"OK")


# --------------------------------------------------------------------------------------------
# testcontainers (only when a Docker engine answers; imported lazily)


def _testcontainers_class(module: str, name: str) -> Any:
    # testcontainers >= 4.13 moved modules to testcontainers.community and warns on the old path.
    for module_name in (f"testcontainers.community.{module}", f"testcontainers.{module}"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                imported = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue  # this layout of testcontainers is not installed: try the next one
            raise ServerError(
                f"Docker is available but testcontainers could not be imported ({exc}): "
                f"pip install 'pg-kafka-outbox[testing]', or set {ENV_NO_DOCKER}=1"
            ) from exc
        return getattr(imported, name)
    raise ServerError(
        "Docker is available but testcontainers is not installed: pip install "
        f"'pg-kafka-outbox[testing]', or set {ENV_NO_DOCKER}=1 to use local servers"
    )


class ContainerPostgres(_ContextManagerMixin):
    """PostgreSQL in a testcontainers container (`postgres:16-alpine`); no fault injection."""

    def __init__(self, container: Any, url: str) -> None:
        """Wrap a started container; use `start()` rather than calling this directly."""
        self.container = container
        self._url = url
        self._stopped = False

    @property
    def source(self) -> Source:
        """Always "docker"."""
        return "docker"

    @property
    def url(self) -> str:
        """Admin URL (user/password/database `postgres`)."""
        return self._url

    def url_for(self, dbname: str) -> str:
        """URL of database `dbname` on this server."""
        return url_for_database(self._url, dbname)

    @classmethod
    def start(cls, image: str = POSTGRES_IMAGE, *, fast: bool = True) -> ContainerPostgres:
        """Start the container and wait until it accepts queries."""
        container_class = _testcontainers_class("postgres", "PostgresContainer")
        container = container_class(
            image, username="postgres", password="postgres", dbname="postgres", driver=None
        )
        command = ["postgres", "-c", "max_connections=300"]
        if fast:
            for setting in _FAST_SETTINGS:
                command += ["-c", setting]
        container.with_command(shlex.join(command))
        container.start()
        try:
            url = str(container.get_connection_url(driver=None))
            server = cls(container, url)
        except BaseException:
            container.stop()
            raise
        _track(server)
        return server

    def restart(self) -> None:
        """Not supported for containers."""
        raise NotImplementedError("restart() needs a local PostgresServer")

    def stop(self) -> None:
        """Stop and remove the container."""
        if not self._stopped:
            self._stopped = True
            _untrack(self)
            self.container.stop()


class ContainerKafka(_ContextManagerMixin):
    """Apache Kafka in a testcontainers container; no fault injection."""

    def __init__(self, container: Any, bootstrap: str) -> None:
        """Wrap a started container; use `start()` rather than calling this directly."""
        self.container = container
        self._bootstrap = bootstrap
        self._stopped = False

    @property
    def source(self) -> Source:
        """Always "docker"."""
        return "docker"

    @property
    def bootstrap(self) -> str:
        """Kafka `bootstrap.servers` value."""
        return self._bootstrap

    @classmethod
    def start(cls) -> ContainerKafka:
        """Start the container (testcontainers' default Kafka image) and wait until ready."""
        container = _testcontainers_class("kafka", "KafkaContainer")()
        container.start()
        try:
            server = cls(container, str(container.get_bootstrap_server()))
        except BaseException:
            container.stop()
            raise
        _track(server)
        return server

    def pause(self) -> None:
        """Not supported for containers."""
        raise NotImplementedError("pause() needs a local TansuBroker")

    def resume(self) -> None:
        """Not supported for containers."""
        raise NotImplementedError("resume() needs a local TansuBroker")

    def stop(self) -> None:
        """Stop and remove the container."""
        if not self._stopped:
            self._stopped = True
            _untrack(self)
            self.container.stop()
