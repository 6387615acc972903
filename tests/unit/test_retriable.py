"""What retrying can fix (outbox.core.retriable), and how a loop retries it (decision 15):
the classification on real driver exceptions, the log line that cannot flood, the backoff."""

from __future__ import annotations

import logging
import threading

import psycopg
import psycopg.errors
import pytest
import sqlalchemy.exc
from confluent_kafka import KafkaError, KafkaException

from outbox.core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    KafkaUnavailable,
    SchemaNotMigrated,
)
from outbox.core.retriable import retriable
from outbox.core.retry import Backoff
from outbox.daemons.outages import NOT_READY_AFTER, Outage
from outbox.observability.health import HealthState, Heartbeat
from outbox.observability.logs import LimitedLog


def _server(code: str) -> BaseException:
    """The exception psycopg raises for a server error of SQLSTATE `code`."""
    return psycopg.errors.lookup(code)("the server says so")


@pytest.mark.parametrize(
    "code",
    [
        "08006",  # connection_failure
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "53100",  # disk_full
        "55P03",  # lock_not_available
        "57014",  # query_canceled: a statement timeout
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now
        "25P03",  # idle_in_transaction_session_timeout
    ],
)
def test_server_errors_that_say_later_are_retriable(code: str) -> None:
    assert retriable(_server(code))
    wrapped = sqlalchemy.exc.DBAPIError("SELECT 1", {}, _server(code))
    assert retriable(wrapped)


@pytest.mark.parametrize(
    "code",
    [
        "42501",  # insufficient_privilege
        "42P01",  # undefined_table
        "42601",  # syntax_error
        "3F000",  # invalid_schema_name
        "22P02",  # invalid_text_representation
        "23505",  # unique_violation
        "55000",  # object_not_in_prerequisite_state (an OperationalError without a retry)
        "57P04",  # database_dropped
        "XX000",  # internal_error
    ],
)
def test_other_server_errors_are_not(code: str) -> None:
    assert not retriable(_server(code))
    wrapped = sqlalchemy.exc.DBAPIError("SELECT 1", {}, _server(code))
    assert not retriable(wrapped)


def test_a_lost_or_refused_connection_is_retriable() -> None:
    # What psycopg raises when the client gives up: no SQLSTATE.
    assert retriable(psycopg.OperationalError("connection failed: Connection refused"))
    assert retriable(psycopg.OperationalError("the connection is closed"))
    assert retriable(psycopg.InterfaceError("connection already closed"))
    lost = sqlalchemy.exc.OperationalError(
        "SELECT 1",
        {},
        psycopg.OperationalError("server closed the connection unexpectedly"),
    )
    assert retriable(lost)
    assert retriable(DatabaseUnavailable("cannot connect to PostgreSQL: refused"))
    assert retriable(KafkaUnavailable("no broker"))
    assert retriable(ConnectionRefusedError())


def test_kafka_errors_are_retriable_as_librdkafka_says() -> None:
    assert retriable(KafkaException(KafkaError(KafkaError._TRANSPORT, retriable=True)))
    assert not retriable(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert not retriable(KafkaException(KafkaError(KafkaError._FATAL, fatal=True, retriable=True)))
    assert not retriable(KafkaException("cannot read a partition again"))


@pytest.mark.parametrize(
    "error",
    [
        ModuleNotFoundError("No module named 'greenlet'"),
        ImportError("cannot import name 'x'"),
        ValueError("the greenlet library is required to use this function"),
        ConfigurationError("bad flag"),
        SchemaNotMigrated("run outbox migrate"),
        psycopg.ProgrammingError("cannot adapt type"),
        psycopg.InterfaceError("the cursor is not open"),
        TypeError("a bug"),
        RuntimeError("delivery reports never arrived"),
    ],
)
def test_everything_else_is_not(error: BaseException) -> None:
    assert not retriable(error)


def test_a_wrapper_of_a_lost_connection_says_what_it_is_itself() -> None:
    try:
        try:
            raise psycopg.OperationalError("lost")
        except psycopg.OperationalError as lost:
            raise ImportError("a bug while handling it") from lost
    except ImportError as wrapper:
        assert not retriable(wrapper)


# -- the log line that cannot flood -----------------------------------------------------------


def test_a_limited_log_says_how_often_it_repeated(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "outbox.test")
    limited = LimitedLog(logging.getLogger("outbox.test"), interval=3600)
    assert limited("lost: %s", "first")
    for n in range(999):
        assert not limited("lost: %s", n)
    assert [r.getMessage() for r in caplog.records] == ["lost: first"]
    limited.flush()
    limited.flush()  # nothing more to say
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[1].startswith("lost: 998 (repeated 999 times in the last ")


def test_a_limited_log_lets_a_line_through_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "outbox.test")
    limited = LimitedLog(logging.getLogger("outbox.test"), interval=0)
    for n in range(3):
        assert limited("line %d", n)
    assert [r.getMessage() for r in caplog.records] == ["line 0", "line 1", "line 2"]


# -- the outage: what a loop does with an error ------------------------------------------------


def test_an_outage_raises_what_retrying_cannot_fix() -> None:
    outage = Outage("the loop", logging.getLogger("outbox.test"))
    missing = ModuleNotFoundError("No module named 'greenlet'")
    with pytest.raises(ModuleNotFoundError):
        outage.failed(missing)
    assert outage.failures == 0


def test_an_outage_backs_off_and_makes_readyz_fail_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "outbox.test")
    backoff = Backoff(initial=0.1, maximum=5.0, jitter=0)
    outage = Outage("the loop", logging.getLogger("outbox.test"), backoff)
    health = HealthState(heartbeat=Heartbeat(), liveness_timeout=60, check_expiry=60)
    health.running = True
    health.record({"postgres": None})
    health.watch(outage.trouble)
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    delays = [outage.failed(lost) for _ in range(10)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0]
    ready, reason = health.ready()
    assert not ready and "the loop: 10 failed attempts" in reason, reason
    assert health.live()[0]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # the first; the others within the interval are counted
    outage.recovered()
    assert health.ready() == (True, "ok")
    lines = [r.getMessage() for r in caplog.records]
    assert "repeated 9 times" in lines[-2]
    assert lines[-1].startswith("the loop: recovered after 10 failed attempts")


def test_readyz_fails_only_after_failures_in_a_row() -> None:
    outage = Outage("the loop", logging.getLogger("outbox.test"))
    lost = psycopg.OperationalError("lost")
    for _ in range(NOT_READY_AFTER - 1):
        outage.failed(lost)
    assert outage.trouble() is None
    outage.failed(lost)
    assert outage.trouble() is not None


def test_a_pause_ends_when_the_loop_is_stopped() -> None:
    outage = Outage("the loop", logging.getLogger("outbox.test"))
    stop = threading.Event()
    beats: list[int] = []
    threading.Timer(0.1, stop.set).start()
    outage.pause(60, stop, lambda: beats.append(1))
    assert stop.is_set() and beats
