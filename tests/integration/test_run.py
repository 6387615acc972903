"""`outbox run MODULE:ATTR`: relay, consumer and handler in one process, on both transports.

A message sent in a transaction is relayed, stored and handled exactly once by the one process;
SIGTERM drains and exits 0; kill -9 mid-flow and a restart lose nothing and handle nothing
twice; one health port answers for the three components.
"""

from __future__ import annotations

import signal
import socket
import urllib.request
from collections import Counter
from typing import Any

import psycopg
import pytest

from outbox import Broker

from . import inbox_app
from . import relay_helpers as helpers
from .relay_helpers import Daemon, RelayTransport, count, wait_for

APP = "tests.integration.inbox_app:handlers"


def spawn_run(url: str, transport: RelayTransport, topic: str, group: str, *extra: str) -> Daemon:
    """Start `outbox run` on `transport`, its handlers reading `topic`."""
    return helpers.spawn_run(
        url, transport.endpoint, APP, group, *extra, env={"INBOX_APP_TOPIC": topic}
    )


def send(url: str, topic: str, count: int, start: int = 0) -> None:
    broker = Broker()
    with psycopg.connect(url) as conn, conn.transaction():
        for n in range(start, start + count):
            broker.send(conn, topic, {"n": n}, key=f"k{n % 7}")


def effects(url: str) -> Counter[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT body::jsonb->>'n' FROM effects").fetchall()
    return Counter(int(row[0]) for row in rows)


def prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_one_process_handles_each_message_once_and_drains_on_sigterm(
    outbox_database_url: str, relay_transport: RelayTransport, free_port: Any
) -> None:
    url = outbox_database_url
    prepare(url)
    topic = relay_transport.topic(3)
    port, metrics = free_port(), free_port()
    send(url, topic, 30)
    with spawn_run(
        url,
        relay_transport,
        topic,
        f"g-{topic}",
        "--health-port",
        str(port),
        "--health-host",
        "127.0.0.1",
        "--metrics-port",
        str(metrics),
        "--metrics-host",
        "127.0.0.1",
    ) as run:
        wait_for(lambda: sum(effects(url).values()) >= 30, 90, "30 messages handled")
        wait_for(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz to answer 200")
        status, body = get(port, "/livez")
        assert (status, body.strip()) == (200, "ok")
        status, body = get(metrics, "/metrics")
        assert status == 200
        for daemon in ("producer", "consumer", "handler"):
            assert f'outbox_seconds_since_progress{{daemon="{daemon}"}}' in body, body
        assert "outbox_handler_messages_handled_total{" in body
        send(url, topic, 10, start=30)  # while running: the NOTIFY path
        wait_for(lambda: sum(effects(url).values()) >= 40, 60, "40 messages handled")
        run.terminate()
        assert run.wait(60) == 0, run.output()
        output = run.output()
    assert effects(url) == Counter(range(40)), output
    assert count(url) == 0  # producer_queue
    assert "producer starting" in output and "consumer starting" in output, output
    assert "handler starting" in output, output


def test_kill_9_mid_flow_then_restart_loses_nothing_and_handles_nothing_twice(
    outbox_database_url: str, relay_transport: RelayTransport
) -> None:
    # Killed once the first effects show, wherever the loops are; tests/faults/test_faults.py
    # kills `outbox run` at each named point of each loop.
    url = outbox_database_url
    prepare(url)
    topic = relay_transport.topic(3)
    group = f"g-{topic}"
    send(url, topic, 300)
    with spawn_run(
        url,
        relay_transport,
        topic,
        group,
        "--producer-batch-size",
        "20",
        "--consumer-batch-size",
        "20",
        "--handler-batch-size",
        "10",
    ) as run:
        wait_for(lambda: sum(effects(url).values()) > 0, 90, "the first messages handled")
        run.signal(signal.SIGKILL)
        assert run.wait(10) == -signal.SIGKILL
    send(url, topic, 50, start=300)
    with spawn_run(url, relay_transport, topic, group) as run:
        wait_for(lambda: sum(effects(url).values()) >= 350, 120, "350 messages handled")
        run.terminate()
        assert run.wait(60) == 0, run.output()
    assert effects(url) == Counter(range(350))


def test_a_component_that_cannot_start_stops_the_process_with_one_line(
    outbox_database_url: str, relay_transport: RelayTransport
) -> None:
    topic = relay_transport.topic(1)
    with spawn_run(outbox_database_url, relay_transport, topic, "") as run:
        assert run.wait(60) == 1, run.output()
        assert run.output().strip() == "outbox: error: --group is required (or set OUTBOX_GROUP)"
    # Every component checks its schema in its own thread: the first refusal stops them all.
    with spawn_run(outbox_database_url, relay_transport, topic, "g", "--schema", "nosuch") as run:
        assert run.wait(60) == 1, run.output()
        errors = [line for line in run.output().splitlines() if line.startswith("outbox: error")]
        assert len(errors) == 1, run.output()
        assert "nosuch" in errors[0], run.output()


@pytest.fixture
def free_port() -> Any:
    import socket

    def pick() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    return pick


def test_the_runtime_object_starts_and_stops_with_an_application(
    outbox_database_url: str, relay_transport: RelayTransport
) -> None:
    from outbox import Handlers, InboxMessage
    from outbox.runtime import OutboxRuntime

    url = outbox_database_url
    prepare(url)
    topic = relay_transport.topic(2)
    handlers = Handlers()

    @handlers.handler(topic)
    def record(message: InboxMessage[Any], conn: Any) -> None:
        conn.execute(
            "INSERT INTO effects (message_id, attempt, body) VALUES (%s, 1, %s)",
            (message.id, message.raw_payload.decode()),
        )

    transport: dict[str, Any] = (
        {"transport": "postgres", "log_url": relay_transport.endpoint}
        if relay_transport.is_log
        else {
            "kafka_bootstrap": relay_transport.endpoint,
            "kafka_config": relay_transport.consumer_settings,
        }
    )
    runtime = OutboxRuntime(
        handlers,
        database_url=url,
        group=f"g-{topic}",
        producer={"poll_interval": 0.2},
        handler={"poll_interval": 0.2},
        **transport,
    )
    with runtime:
        send(url, topic, 20)
        wait_for(lambda: sum(effects(url).values()) >= 20, 60, "20 messages handled")
        assert runtime.live() == (True, "ok")
    assert effects(url) == Counter(range(20))
    runtime.stop()  # a second stop is a no-op


def test_the_runtime_object_refuses_to_start_on_an_unmigrated_schema(
    outbox_database_url: str, relay_transport: RelayTransport
) -> None:
    from outbox.core.errors import OutboxError
    from outbox.runtime import OutboxRuntime

    transport: dict[str, Any] = (
        {"transport": "postgres", "log_url": relay_transport.endpoint}
        if relay_transport.is_log
        else {"kafka_bootstrap": relay_transport.endpoint}
    )
    runtime = OutboxRuntime(
        inbox_app.handlers,
        database_url=outbox_database_url,
        group="g",
        schema="nosuch",
        **transport,
    )
    with pytest.raises(OutboxError, match="nosuch"):
        runtime.start()
    runtime.stop()  # nothing started: nothing to stop, no error


def test_sigterm_while_waiting_for_the_database_ends_the_start(
    relay_transport: RelayTransport,
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"postgresql://postgres@127.0.0.1:{sock.getsockname()[1]}/app"
    with spawn_run(dead, relay_transport, "t", "g", "--wait-for-database", "300") as run:
        wait_for(lambda: "--wait-for-database" in run.output(), 60, "the wait to begin")
        run.terminate()
        # As `outbox producer` does: the start-up check gives up with its one line.
        assert run.wait(30) == 1, run.output()
        assert "outbox: error: cannot connect to PostgreSQL" in run.output()


# -- over several databases --------------------------------------------------------------------


def send_as(url: str, tenant: str, topic: str, numbers: range) -> None:
    """Send `numbers` from tenant `tenant`'s database: the tenant header routes them back."""
    broker = Broker(tenant=tenant)
    with psycopg.connect(url) as conn, conn.transaction():
        for n in numbers:
            broker.send(conn, topic, {"n": n}, key=f"k{n % 5}")


def dead_rows(url: str) -> int:
    return count(url, "consumer_queue", "dead_at IS NOT NULL")


def test_over_two_tenant_databases_each_tenants_messages_are_handled_once_in_its_own_inbox(
    outbox_database_factory: Any, relay_transport: RelayTransport, free_port: Any
) -> None:
    """`outbox run` with two `--database-url NAME=URL`: a relay per database, the consumer
    routing by the tenant header, a handler per database; kill -9 mid-flow and a restart lose
    nothing and handle nothing twice, and no record lands in the other tenant's inbox."""
    acme, globex = outbox_database_factory(), outbox_database_factory()
    for url in (acme, globex):
        prepare(url)
    topic = relay_transport.topic(3)
    group = f"g-{topic}"
    send_as(acme, "acme", topic, range(0, 150))
    send_as(globex, "globex", topic, range(1000, 1100))
    port = free_port()
    tenants = ("--database-url", f"globex={globex}", "--database-turns", "1")
    tenants += ("--quarantine-database", "acme")  # required when routing: nothing is guessed
    small = ("--producer-batch-size", "20", "--consumer-batch-size", "20")
    with spawn_run(f"acme={acme}", relay_transport, topic, group, *tenants, *small) as run:
        wait_for(
            lambda: sum(effects(acme).values()) + sum(effects(globex).values()) > 0,
            90,
            "the first messages handled",
        )
        run.signal(signal.SIGKILL)
        assert run.wait(10) == -signal.SIGKILL
    send_as(acme, "acme", topic, range(150, 200))
    send_as(globex, "globex", topic, range(1100, 1130))
    health = ("--health-port", str(port), "--health-host", "127.0.0.1")
    with spawn_run(f"acme={acme}", relay_transport, topic, group, *tenants, *health) as run:
        wait_for(
            lambda: sum(effects(acme).values()) >= 200 and sum(effects(globex).values()) >= 130,
            120,
            "every tenant's messages handled",
        )
        status, body = get(port, "/readyz")
        assert status == 200, body
        run.terminate()
        assert run.wait(60) == 0, run.output()
        output = run.output()
    assert effects(acme) == Counter(range(0, 200))
    assert effects(globex) == Counter(range(1000, 1130))
    assert dead_rows(acme) == dead_rows(globex) == 0, "nothing quarantined"
    assert count(acme) == count(globex) == 0, "every outbox relayed"
    assert "databases" in output and "acme" in output and "globex" in output, output


def test_over_several_databases_a_record_without_tenant_is_quarantined_in_the_named_database(
    outbox_database_factory: Any, relay_transport: RelayTransport
) -> None:
    """`--quarantine-database` names where what cannot be routed is kept, dead: never in a
    tenant's inbox as a live row."""
    acme, globex = outbox_database_factory(), outbox_database_factory()
    for url in (acme, globex):
        prepare(url)
    topic = relay_transport.topic(1)
    send(acme, topic, 3)  # sent without a tenant
    send_as(globex, "globex", topic, range(10, 13))
    extra = ("--database-url", f"globex={globex}", "--quarantine-database", "globex")
    with spawn_run(f"acme={acme}", relay_transport, topic, f"g-{topic}", *extra) as run:
        wait_for(
            lambda: dead_rows(globex) == 3 and sum(effects(globex).values()) == 3,
            90,
            "the untenanted records quarantined and globex's handled",
        )
        run.terminate()
        assert run.wait(60) == 0, run.output()
    assert effects(acme) == Counter() and effects(globex) == Counter(range(10, 13))
    assert dead_rows(acme) == 0
