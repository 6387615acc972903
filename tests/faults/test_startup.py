"""A daemon started while PostgreSQL is down: exits 1 at once, or waits with --wait-for-database."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

from outbox import Broker, transports
from outbox.core.errors import DatabaseUnavailable
from outbox.observability.runtime import ObservabilityConfig
from outbox.testing.servers import Servers
from tests.integration.relay_helpers import app_of, count, producer_thread, wait_for

pytestmark = pytest.mark.faults


def _take_down(servers: Servers, url: str, downtime: float = 4.0) -> threading.Thread:
    """Restart the harness's PostgreSQL in the background, down for `downtime` seconds; return
    once `url` refuses connections (skip where the harness did not start the server)."""
    postgres = servers.postgres
    if not hasattr(postgres, "restart") or postgres.source != "local":  # type: ignore[attr-defined]
        pytest.skip("needs a PostgreSQL server the harness started")
    restarting = threading.Thread(
        target=postgres.restart,  # type: ignore[attr-defined]
        kwargs={"downtime": downtime},
        daemon=True,
    )
    restarting.start()
    wait_for(lambda: _down(url), 30, "PostgreSQL to go down", interval=0.02)
    return restarting


def _down(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=1).close()
    except psycopg.OperationalError:
        return True
    return False


def test_a_daemon_started_while_postgres_is_down_waits_for_it_when_asked(
    outbox_servers: Servers,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        Broker().send(conn, outbox_topic, {"n": 1}, key="k")
    restarting = _take_down(outbox_servers, url)
    # By default: one clear error at once, for a supervisor to restart the daemon.
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="cannot connect to PostgreSQL"):
        app_of(
            url, transports.settings_of("kafka", kafka_bootstrap=outbox_kafka_bootstrap)
        ).producer().run()
    assert time.monotonic() - started < 3
    # --wait-for-database: waits, with a WARNING per attempt, then relays.
    caplog.set_level(logging.WARNING, "outbox.relay")
    observe = ObservabilityConfig(wait_for_database=60)
    with producer_thread(url, outbox_kafka_bootstrap, observability=observe):
        wait_for(lambda: not _down(url) and count(url) == 0, 60, "the message relayed")
    restarting.join(30)
    waits = [r for r in caplog.records if "--wait-for-database" in r.getMessage()]
    assert waits and "cannot connect to PostgreSQL" in waits[0].getMessage()


def test_a_connection_lost_during_the_schema_check_is_the_same_one_line_outage(
    outbox_database_url: str,
) -> None:
    # The chaos soak restarted a daemon while PostgreSQL was shutting down: it connected, lost
    # the connection during the schema check, and exited with an "unexpected AdminShutdown".
    from outbox.postgres.connection import check_database, connect

    def terminated() -> psycopg.Connection[tuple[object, ...]]:
        conn = connect(outbox_database_url, timeout=5, application_name="outbox-test")
        with psycopg.connect(outbox_database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        return conn

    with pytest.raises(DatabaseUnavailable, match="cannot connect to PostgreSQL"):
        check_database(terminated, "outbox")


def test_a_log_daemon_started_while_postgres_is_down_waits_for_the_log_when_asked(
    outbox_servers: Servers,
    outbox_database_url: str,
    outbox_log_url: str,
) -> None:
    """On the log transport the CLI checks the log database first: --wait-for-database covers
    that check too (it exited 1 at once, however long the daemon was told to wait)."""
    from outbox.pglog import PgLog
    from tests.integration.relay_helpers import spawn_consumer

    PgLog(outbox_log_url).create_topic("t.waits", 1)
    restarting = _take_down(outbox_servers, outbox_log_url)
    quick = spawn_consumer(outbox_database_url, outbox_log_url, "t.waits", "g-quick")
    waiting = spawn_consumer(
        outbox_database_url, outbox_log_url, "t.waits", "g-waits", "--wait-for-database", "60"
    )
    try:
        assert quick.wait(30) == 1
        assert "cannot connect to the log database" in quick.output()
        restarting.join(30)
        wait_for(
            lambda: "consumer starting" in waiting.output() or waiting.process.poll() is not None,
            60,
            "the waiting consumer to start",
        )
        time.sleep(1)
        assert waiting.process.poll() is None, waiting.output()[-2000:]
        assert "cannot connect to the log database" in waiting.output()  # the waits, logged
    finally:
        quick.close()
        waiting.terminate()
        waiting.wait(30)
        waiting.close()
