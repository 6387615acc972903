"""`outbox consumer MODULE:ATTR`: the consumer reads the topics of the handlers' registry, as a
process, on both transports; with --topic too, it consumes the list and warns once about what
does not match; `outbox handler` warns once about stored topics its registry does not handle."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from outbox import Broker
from outbox.testing.plugin import DatabaseFactory, TopicFactory

from .relay_helpers import (
    TEST_CONSUMER_KAFKA,
    Daemon,
    RelayTransport,
    _for_transport,
    count,
    running,
    spawn_handler,
    transport_args,
    wait_for,
)

REGISTRY = """
from outbox import Handlers

handlers = Handlers()


@handlers.handler({first!r})
def first(message, conn):
    pass


@handlers.handler({second!r})
def second(message, conn):
    pass
"""


def _registry(tmp_path: Path, first: str, second: str) -> tuple[str, dict[str, str]]:
    """MODULE:ATTRIBUTE of a registry handling `first` and `second`, and the environment in
    which a daemon process imports it."""
    (tmp_path / "topics_registry.py").write_text(
        REGISTRY.format(first=first, second=second), encoding="utf-8"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return "topics_registry:handlers", {"PYTHONPATH": path}


def _send(url: str, relay_transport: RelayTransport, messages: list[tuple[str, int]]) -> None:
    """Send `messages` (topic, n) through the outbox at `url` and relay them."""
    broker = Broker()
    with psycopg.connect(url) as conn, conn.transaction():
        for topic, n in messages:
            broker.send(conn, topic, {"n": n}, key=str(n))
    with running(relay_transport.producer(url, poll_interval=0.1)):
        wait_for(lambda: count(url) == 0, 60, "producer_queue to drain")


def _stored(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT topic, count(*) FROM outbox.consumer_queue GROUP BY topic"
        ).fetchall()
    return {topic: int(n) for topic, n in rows}


def _consumer(url: str, relay_transport: RelayTransport, *args: str, env: dict[str, str]) -> Daemon:
    settings = [f"--kafka-config={k}={v}" for k, v in TEST_CONSUMER_KAFKA.items()]
    return Daemon(
        "consumer",
        *args,
        "--database-url",
        url,
        *transport_args(relay_transport.endpoint),
        *_for_transport(relay_transport.endpoint, tuple(settings)),
        env=env,
    )


def _stored_while_running(daemon: Daemon, url: str) -> int:
    """Rows in consumer_queue; fails at once, with its output, if the daemon has exited."""
    assert daemon.process.poll() is None, daemon.output()
    return sum(_stored(url).values())


def _stop(daemon: Daemon) -> str:
    daemon.terminate()
    assert daemon.wait(60) == 0, daemon.output()
    return daemon.output()


def test_the_consumer_reads_exactly_the_registered_topics(
    outbox_database_factory: DatabaseFactory,
    relay_transport: RelayTransport,
    tmp_path: Path,
) -> None:
    created, cancelled, elsewhere = (relay_transport.topic() for _ in range(3))
    sender, receiver = outbox_database_factory(), outbox_database_factory()
    registry, env = _registry(tmp_path, created, cancelled)
    # The unregistered topic's records go first: a consumer reading it would meet them first.
    _send(sender, relay_transport, [(elsewhere, n) for n in range(3)])
    _send(sender, relay_transport, [(t, n) for n in range(3) for t in (created, cancelled)])
    group = f"g-{created}"
    with _consumer(receiver, relay_transport, registry, "--group", group, env=env) as daemon:
        wait_for(
            lambda: _stored_while_running(daemon, receiver) >= 6, 60, "the 6 registered records"
        )
        output = _stop(daemon)
    assert _stored(receiver) == {created: 3, cancelled: 3}
    consumes = [line for line in output.splitlines() if f"consumer group {group} consumes" in line]
    assert len(consumes) == 1, output
    assert consumes[0].endswith(
        f"consumes {', '.join(sorted([created, cancelled]))} (the registered topics of the "
        "handlers)"
    )
    assert "WARNING" not in output, output


def test_a_topic_list_that_does_not_match_the_registry_is_warned_about_once(
    outbox_database_factory: DatabaseFactory,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """With --topic and a registry the list is consumed: a listed topic without a handler and
    a registered topic not listed are one WARNING each at start; the handler, finding rows of
    a topic it does not handle among the last stored, says so once."""
    relay_transport = RelayTransport(
        "kafka", outbox_kafka_bootstrap, outbox_topic_factory, TEST_CONSUMER_KAFKA
    )
    created, cancelled, elsewhere = (relay_transport.topic() for _ in range(3))
    sender, receiver = outbox_database_factory(), outbox_database_factory()
    registry, env = _registry(tmp_path, created, cancelled)
    _send(sender, relay_transport, [(t, n) for n in range(2) for t in (created, elsewhere)])
    args = (registry, "--topic", f"{created},{elsewhere}", "--group", f"g-{created}")
    with _consumer(receiver, relay_transport, *args, env=env) as daemon:
        wait_for(lambda: _stored_while_running(daemon, receiver) >= 4, 60, "the 4 listed records")
        output = _stop(daemon)
    assert _stored(receiver) == {created: 2, elsewhere: 2}
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert len(warnings) == 2, output
    assert f"topic {elsewhere!r} is consumed but no handler of the registry reads it" in output
    assert f"topic {cancelled!r} has a handler but this consumer does not consume it" in output

    with spawn_handler(receiver, registry, env=env) as handler:
        wait_for(
            lambda: count(receiver, "consumer_queue", "dead_at IS NOT NULL") == 2,
            60,
            "the rows of the unhandled topic to go dead",
        )
        output = _stop(handler)
    unhandled = [line for line in output.splitlines() if "which no handler" in line]
    assert len(unhandled) == 1, output
    assert (
        f"consumer_queue holds rows of topic {elsewhere!r} (2 of the last 1000 stored)"
        in (unhandled[0])
    )
