"""Daemons fail fast on what retrying cannot fix, and ride out what it can (decision 15).

Each daemon CLI (producer and consumer on both transports, handler) is started as a process
against a database whose schema is not migrated, with a role that lacks privileges, and (the
handler) with a module that cannot be imported or async SQLAlchemy callbacks without greenlet
(a plain install: the extra is simulated missing by a `greenlet` on PYTHONPATH whose import
fails). Each must exit 1 with exactly one error line and no traceback. A failure that retrying
can fix (connections refused for a while) keeps the daemon running, backing off, logging at
most a line every few seconds, with /readyz failing until it recovers.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException
from psycopg import sql

from outbox import Broker
from outbox.core.batches import InboxBatch, outgoing_batch
from outbox.core.envelope import InboxRow, StoredMessage
from outbox.core.ids import uuid7
from outbox.core.lanes import lane_for
from outbox.daemons.consumer import Consumer
from outbox.memory import InMemoryTransport
from outbox.postgres.inbox import insert_params
from outbox.postgres.queries import channel, queries
from outbox.testing.servers import Servers

from .relay_helpers import (
    Daemon,
    RelayTransport,
    app_of,
    count,
    running,
    spawn_consumer,
    spawn_handler,
    spawn_producer,
    spawn_run,
    wait_for,
)

#: A handler registry of one sync callback (the daemon's plumbing, not the callback, is tested).
SYNC_APP = """
from outbox import Handlers

handlers = Handlers()


@handlers.handler("fail.fast")
def on_message(message, conn):
    conn.execute("SELECT 1")
"""

#: Async callbacks with SQLAlchemy sessions: they need SQLAlchemy's asyncio extra (greenlet).
ASYNC_SQLALCHEMY_APP = """
from outbox import Handlers

handlers = Handlers(transaction="sqlalchemy")


@handlers.handler("fail.fast")
async def on_message(message, session):
    pass
"""

#: A module that fails when imported.
BROKEN_APP = """
raise RuntimeError("this service's configuration is broken")
"""

#: Stands in for greenlet on a plain install: importing it fails as a missing module does.
NO_GREENLET = """
raise ModuleNotFoundError("No module named 'greenlet' (a plain install)", name="greenlet")
"""

#: `outbox handler` with its start-up check of async support skipped, to reach what the loop
#: itself does when a worker cannot open its session (the defect: it spun, logging "lost its
#: database connection" 1,000 times a second, and never counted an attempt).
LOOP_ONLY = """
import sys

from outbox.cli.command import main
from outbox.daemons.handler import runner

runner.check_async_support = lambda handlers: None
sys.exit(main(sys.argv[1:]))
"""


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("outbox: error:")]


def _assert_one_line_exit(daemon: Daemon, *expected: str) -> str:
    """The daemon exits 1 with one error line containing each of `expected`, no traceback."""
    try:
        code = daemon.wait(60)
    except Exception:
        tail = daemon.output()[-3000:]
        raise AssertionError(f"still running after 60s; its output ends with:\n{tail}") from None
    output = daemon.output()
    assert code == 1, output[-3000:]
    errors = _errors(output)
    assert len(errors) == 1, output[-3000:]
    for text in expected:
        assert text in errors[0], errors[0]
    assert "Traceback" not in output, output[-3000:]
    assert len(output.splitlines()) < 20, output[-3000:]  # no spam before the line
    return errors[0]


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A directory for the test's handler modules, first on the daemons' PYTHONPATH."""
    return tmp_path


def _env(*paths: Path) -> dict[str, str]:
    here = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join([*(str(p) for p in paths), here])}


def _module(directory: Path, source: str) -> str:
    name = f"app_{secrets.token_hex(4)}"
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def _no_greenlet(tmp_path: Path) -> Path:
    shadow = tmp_path / "plain-install"
    (shadow / "greenlet").mkdir(parents=True)
    (shadow / "greenlet" / "__init__.py").write_text(NO_GREENLET)
    return shadow


def _queue_message(url: str, topic: str = "fail.fast") -> None:
    mid = uuid.uuid4()
    row = InboxRow(
        mid,
        topic,
        b"k",
        b"{}",
        {},
        "application/json",
        lane_for(b"k", mid),
        datetime.now(UTC),
        0,
        0,
    )
    with psycopg.connect(url) as conn:
        conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of([row]), channel("outbox", "consumer_queue")),
        )


# -- the handler: what it runs cannot work -----------------------------------------------------


def test_async_sqlalchemy_handlers_without_greenlet_exit_1_at_start(
    outbox_database_url: str, app_dir: Path, tmp_path: Path
) -> None:
    _queue_message(outbox_database_url)
    app = _module(app_dir, ASYNC_SQLALCHEMY_APP)
    env = _env(_no_greenlet(tmp_path), app_dir)
    with spawn_handler(outbox_database_url, f"{app}:handlers", env=env) as daemon:
        _assert_one_line_exit(daemon, "fail.fast", "greenlet", "pg-kafka-outbox[sqlalchemy]")
    assert count(outbox_database_url, "consumer_queue", "attempts = 0") == 1  # untouched


def test_a_worker_that_cannot_open_its_session_stops_the_daemon_instead_of_spinning(
    outbox_database_url: str, app_dir: Path, tmp_path: Path
) -> None:
    _queue_message(outbox_database_url)
    app = _module(app_dir, ASYNC_SQLALCHEMY_APP)
    (app_dir / "loop_only.py").write_text(LOOP_ONLY)
    env = _env(_no_greenlet(tmp_path), app_dir)
    daemon = Daemon(
        "handler",
        f"{app}:handlers",
        "--database-url",
        outbox_database_url,
        "--poll-interval",
        "0.2",
        env=env,
        command=[sys.executable, str(app_dir / "loop_only.py")],
    )
    with daemon:
        line = _assert_one_line_exit(daemon, "greenlet")
    assert "lost" not in line
    assert count(outbox_database_url, "consumer_queue", "attempts = 0") == 1  # not an attempt


def test_a_handler_module_that_fails_to_import_exits_1(
    outbox_database_url: str, app_dir: Path
) -> None:
    app = _module(app_dir, BROKEN_APP)
    with spawn_handler(outbox_database_url, f"{app}:handlers", env=_env(app_dir)) as daemon:
        _assert_one_line_exit(daemon, f"cannot import {app!r}", "configuration is broken")


# -- every daemon: a database it cannot use ---------------------------------------------------

#: `run`: the three in one process (`outbox run`), its consumer reading the test's topic.
DAEMONS = ["producer", "consumer", "handler", "run"]


def _spawn(
    kind: str, url: str, transport: RelayTransport, app_dir: Path, topic: str | None = None
) -> Daemon:
    if kind == "producer":
        return spawn_producer(url, transport.endpoint)
    if kind == "consumer":
        topic = topic or transport.topic(1)
        return spawn_consumer(url, transport.endpoint, topic, f"g-{topic}")
    app = _module(app_dir, SYNC_APP)
    if kind == "run":
        topic = topic or transport.topic(1)
        return spawn_run(
            url,
            transport.endpoint,
            f"{app}:handlers",
            f"g-{topic}",
            "--topic",
            topic,
            env=_env(app_dir),
        )
    return spawn_handler(url, f"{app}:handlers", env=_env(app_dir))


@pytest.mark.parametrize("kind", DAEMONS)
def test_a_database_not_migrated_exits_1(
    kind: str, outbox_empty_database_url: str, relay_transport: RelayTransport, app_dir: Path
) -> None:
    if kind == "handler" and relay_transport.is_log:
        pytest.skip("the handler has no transport")
    with _spawn(kind, outbox_empty_database_url, relay_transport, app_dir) as daemon:
        _assert_one_line_exit(daemon, "outbox migrate")


#: Kafka settings librdkafka refuses before it asks any broker, and a secret beside them.
REFUSED_KAFKA_SETTINGS = {
    "OUTBOX_KAFKA_CONFIG_SECURITY_PROTOCOL": "SSL",
    "OUTBOX_KAFKA_CONFIG_SSL_CA_PEM": "not a certificate",
    "OUTBOX_KAFKA_CONFIG_SSL_KEY_PASSWORD": "s3cret-key-passw0rd",
}


@pytest.mark.parametrize("kind", ["producer", "consumer", "run"])
def test_kafka_settings_librdkafka_refuses_exit_1_naming_the_setting_not_the_network(
    kind: str,
    outbox_database_url: str,
    relay_transport: RelayTransport,
    app_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if relay_transport.is_log:
        pytest.skip("Kafka's settings only")
    for name, value in REFUSED_KAFKA_SETTINGS.items():
        monkeypatch.setenv(name, value)  # the daemon's environment is the test's, and these
    with _spawn(kind, outbox_database_url, relay_transport, app_dir) as daemon:
        line = _assert_one_line_exit(daemon, "librdkafka refused the Kafka settings", "ssl.ca.pem")
        output = daemon.output()
    assert "no Kafka broker answered" not in line
    assert "s3cret-key-passw0rd" not in output


@pytest.fixture
def role_url(outbox_database_url: str) -> Iterator[tuple[str, str]]:
    """(url, role): the test database, as a new role that may log in and nothing more."""
    role = f"r_{secrets.token_hex(4)}"
    with psycopg.connect(outbox_database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(role)))
    parts = urlsplit(outbox_database_url)
    netloc = f"{role}:pw@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    yield urlunsplit(parts._replace(netloc=netloc)), role
    with psycopg.connect(outbox_database_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _grant(admin_url: str, statement: str, role: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL(statement).format(role=sql.Identifier(role)))


@pytest.mark.parametrize("kind", DAEMONS)
def test_a_role_without_privileges_exits_1(
    kind: str,
    outbox_database_url: str,
    role_url: tuple[str, str],
    relay_transport: RelayTransport,
    app_dir: Path,
) -> None:
    if kind == "handler" and relay_transport.is_log:
        pytest.skip("the handler has no transport")
    url, _role = role_url
    with _spawn(kind, url, relay_transport, app_dir) as daemon:
        _assert_one_line_exit(daemon, "PostgreSQL refused", "privilege")


@pytest.mark.parametrize("kind", DAEMONS)
def test_a_role_that_can_read_the_version_only_exits_1_from_its_loop(
    kind: str,
    outbox_database_url: str,
    role_url: tuple[str, str],
    relay_transport: RelayTransport,
    app_dir: Path,
) -> None:
    """The start-up check passes; the loop's first statement is refused, for good."""
    if kind == "handler" and relay_transport.is_log:
        pytest.skip("the handler has no transport")
    url, role = role_url
    _grant(outbox_database_url, "GRANT USAGE ON SCHEMA outbox TO {role}", role)
    _grant(outbox_database_url, "GRANT SELECT ON outbox.alembic_version TO {role}", role)
    topic = None
    if kind in ("consumer", "run"):
        topic = relay_transport.topic(1)
        publisher = relay_transport.publisher()
        try:
            assert publisher.publish(outgoing_batch([_record(topic)])) == [None]
        finally:
            publisher.close()
    with _spawn(kind, url, relay_transport, app_dir, topic) as daemon:
        _assert_one_line_exit(daemon, "PostgreSQL refused", "permission denied")


def _record(topic: str) -> StoredMessage:
    return StoredMessage(
        id=1,
        message_id=uuid7(),
        topic=topic,
        key=b"k",
        payload=b"{}",
        content_type="application/json",
        headers={},
        created_at=datetime.now(UTC),
        attempts=0,
    )


# -- what retrying can fix -----------------------------------------------------------------------


def _wait_for_line(daemon: Daemon, text: str, timeout: float = 60) -> None:
    """Wait until the daemon logged `text`; fail with its output's end."""
    try:
        wait_for(lambda: text in daemon.output(), timeout, repr(text))
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; output:\n{daemon.output()[-3000:]}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def test_workers_refused_connections_back_off_quietly_and_fail_readyz_until_they_get_one(
    outbox_database_url: str, role_url: tuple[str, str], app_dir: Path
) -> None:
    """A role at its connection limit: the main loop and the probe have their connections,
    the worker cannot open its own (too_many_connections, which retrying fixes). Before the
    fix the worker treated it as a lost connection and looked again at once: a busy loop
    logging a line per turn, never counting an attempt, /readyz answering 200."""
    url, role = role_url
    admin = outbox_database_url
    _grant(admin, "GRANT USAGE ON SCHEMA outbox TO {role}", role)
    _grant(
        admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox TO {role}", role
    )
    _grant(admin, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA outbox TO {role}", role)
    _grant(admin, "ALTER ROLE {role} CONNECTION LIMIT 2", role)
    _queue_message(admin)
    app = _module(app_dir, SYNC_APP)
    port = _free_port()
    extra = ("--concurrency", "1", "--health-port", str(port), "--health-host", "127.0.0.1")
    with spawn_handler(url, f"{app}:handlers", *extra, env=_env(app_dir)) as daemon:
        _wait_for_line(daemon, "handler workers lost")
        started = time.monotonic()
        wait_for(lambda: _readyz(port)[0] == 503, 30, "/readyz to fail")
        status, reason = _readyz(port)
        assert "handler workers lost their database connections" in reason, (status, reason)
        time.sleep(max(0.0, 3 - (time.monotonic() - started)))
        assert daemon.process.poll() is None, daemon.output()[-3000:]
        refusals = [line for line in daemon.output().splitlines() if "handler workers lost" in line]
        # A first line, then at most one every 5 s (it was hundreds a second).
        assert len(refusals) <= 2, refusals
        assert count(admin, "consumer_queue", "attempts > 0") == 0  # no attempt counted
        _grant(admin, "ALTER ROLE {role} CONNECTION LIMIT -1", role)
        wait_for(
            lambda: count(admin, "consumer_processed") == 1,
            60,
            "the message handled once the worker connects",
        )
        wait_for(lambda: _readyz(port)[0] == 200, 30, "/readyz to pass again")
        assert "recovered after" in daemon.output()
        daemon.terminate()
        assert daemon.wait(30) == 0, daemon.output()[-3000:]


@pytest.mark.faults
def test_daemons_ride_out_postgres_down_then_up_quietly(
    outbox_servers: Servers,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    app_dir: Path,
) -> None:
    """PostgreSQL restarted, down for 4 s, under a running producer, consumer and handler: each
    keeps running, logs its outage at most once per 5 s (and once more when it recovers), and
    a message sent afterwards goes all the way through."""
    from tests.faults.test_startup import _take_down

    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    app = _module(app_dir, SYNC_APP.replace("fail.fast", topic))
    daemons = [
        spawn_producer(url, bootstrap),
        spawn_consumer(url, bootstrap, topic, f"g-{topic}"),
        spawn_handler(url, f"{app}:handlers", env=_env(app_dir)),
    ]
    try:
        for daemon in daemons:
            wait_for(lambda d=daemon: "starting:" in d.output(), 60, f"{daemon.args[0]} to start")
        _take_down(outbox_servers, url).join(60)
        with psycopg.connect(url) as conn, conn.transaction():
            Broker().send(conn, topic, {"n": 1}, key="k")
        wait_for(
            lambda: count(url, "consumer_processed") == 1,
            90,
            "the message sent after the restart to be handled",
        )
        for daemon in daemons:
            output = daemon.output()
            assert daemon.process.poll() is None, output[-3000:]
            lines = [line for line in output.splitlines() if " WARNING " in line]
            assert len(lines) <= 4, "\n".join(lines)
            assert "Traceback" not in output, output[-3000:]
        for daemon in daemons[0], daemons[2]:  # the relays' main loops saw the outage
            assert "recovered after" in daemon.output(), daemon.output()[-3000:]
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            daemon.wait(30)
            daemon.close()


class _Flaky:
    """A subscriber whose first `failures` polls raise `error`, then reads `inner`."""

    def __init__(self, inner: Any, error: BaseException, failures: int) -> None:
        self.inner, self.error, self.failures = inner, error, failures
        self.polls = 0

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        self.polls += 1
        if self.polls <= self.failures:
            raise self.error
        batch: InboxBatch = self.inner.poll(max_records, timeout)
        return batch

    def commit(self, batch: InboxBatch) -> None:
        self.inner.commit(batch)

    def close(self) -> None:
        self.inner.close()


def _memory_consumer(url: str, error: BaseException, failures: int) -> tuple[Consumer, _Flaky]:
    transport = InMemoryTransport()
    transport.create_topic("fail.fast", 1)
    transport.append("fail.fast", b"k", b"{}")
    flaky = _Flaky(transport.subscriber(["fail.fast"], "g"), error, failures)
    app = app_of(
        url,
        group="g",
        topics=["fail.fast"],
        consumer={"poll_timeout": 0.05},
        subscribers=lambda: flaky,
    )
    return app.consumer(), flaky


def test_the_consumer_retries_a_transports_retriable_error_quietly(
    outbox_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "outbox.consumer")
    retriable = KafkaException(KafkaError(KafkaError._TRANSPORT, retriable=True))
    consumer, flaky = _memory_consumer(outbox_database_url, retriable, 5)
    with running(consumer):
        wait_for(lambda: consumer.stored == 1, 30, "the record stored after the failures")
    assert flaky.polls > 5
    lines = [r.getMessage() for r in caplog.records if "read from the transport" in r.getMessage()]
    # The first failure; the 4 others in one line; the recovery.
    assert len(lines) == 3, lines
    assert "repeated 4 times" in lines[1], lines
    assert "recovered after 5 failed attempts" in lines[2], lines


def test_the_consumer_stops_on_a_transports_fatal_error(outbox_database_url: str) -> None:
    fatal = KafkaException(KafkaError(KafkaError._FATAL, fatal=True))
    consumer, flaky = _memory_consumer(outbox_database_url, fatal, 1)
    safety = threading.Timer(10, consumer.stop)  # had it retried, it would stop, not raise
    safety.start()
    try:
        with pytest.raises(KafkaException):
            consumer.run()
    finally:
        safety.cancel()
    assert flaky.polls == 1
    assert consumer.stored == 0
