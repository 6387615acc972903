"""PostgreSQL for tests: a private local cluster run from the OS's binaries (`PostgresServer`),
an existing server named by `OUTBOX_TEST_DATABASE_URL` (`ExternalPostgres`), and creating and
dropping databases on either."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from outbox import settings
from outbox.testing.servers._base import (
    ENV_DATABASE_URL,
    ServerError,
    Source,
    _ContextManagerMixin,
    _tail,
    _track,
    _untrack,
    free_port,
    url_for_database,
)

POSTGRES_IMAGE = "postgres:16-alpine"
_FAST_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
_DB_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


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
        opts += ["-c", f"max_connections={_max_connections()}"]
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


def _max_connections() -> int:
    """The local server's max_connections: 300, or OUTBOX_TEST_PG_MAX_CONNECTIONS (a benchmark
    of hundreds of tenant databases needs more)."""
    raw = os.environ.get(settings.TEST_PG_MAX_CONNECTIONS, "").strip()
    if not raw:
        return 300
    if not (raw.isascii() and raw.isdigit()) or not 10 <= int(raw) <= 10_000:
        raise ValueError(
            f"OUTBOX_TEST_PG_MAX_CONNECTIONS must be a whole number from 10 to 10000, got {raw!r}"
        )
    return int(raw)
