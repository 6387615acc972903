"""The fault-injection suite: real daemons as processes, real servers, one fault each.

Each scenario sends messages through the whole path (Broker.send -> producer_queue ->
`outbox producer` -> Kafka -> `outbox consumer` -> consumer_queue -> `outbox handler`),
the SIGKILL and PostgreSQL-restart ones on both transports (Kafka, and the log kept in
PostgreSQL, which the restart takes down too),
injects its fault, restarts what died, and counts: every message is handled exactly once
(or, where the fault makes it undeliverable, kept dead), none lost, no effect twice.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from outbox import Broker, Message
from outbox.testing.servers import Servers

from ..integration import inbox_app
from ..integration.relay_helpers import (
    Daemon,
    RelayTransport,
    count,
    spawn_consumer,
    spawn_handler,
    spawn_producer,
    spawn_run,
    wait_for,
)
from .conftest import FaultResult

pytestmark = pytest.mark.faults

APP = "tests.integration.inbox_app:handlers"


@dataclass
class Pipeline:
    """The three daemons of one scenario; a daemon killed by its failpoint is restarted.

    With `one_process`, the three run as one `outbox run` over one database (a service that
    handles the messages it sends): sender_url and receiver_url are the same."""

    sender_url: str
    receiver_url: str
    bootstrap: str
    topic: str
    failpoints: dict[str, str] = field(default_factory=dict)
    producer_args: tuple[str, ...] = ()
    handler_args: tuple[str, ...] = ()
    daemons: dict[str, Daemon] = field(default_factory=dict)
    killed: Counter[str] = field(default_factory=Counter)
    one_process: bool = False

    def _env(self, name: str, armed: bool) -> dict[str, str]:
        env = {"INBOX_APP_TOPIC": self.topic}
        if armed and name in self.failpoints:
            env["OUTBOX_FAILPOINT"] = self.failpoints[name]
        elif armed and name == "run" and self.failpoints:  # any component's point
            (env["OUTBOX_FAILPOINT"],) = self.failpoints.values()
        return env

    def _start(self, name: str, armed: bool) -> Daemon:
        env = self._env(name, armed)
        if name == "run":
            return spawn_run(
                self.receiver_url,
                self.bootstrap,
                APP,
                f"g-{self.topic}",
                "--consumer-batch-size",
                "100",
                "--handler-batch-size",
                "50",
                *self.producer_args,
                env=env,
            )
        if name == "producer":
            return spawn_producer(
                self.sender_url,
                self.bootstrap,
                "--poll-interval",
                "0.2",
                *self.producer_args,
                env=env,
            )
        if name == "consumer":
            return spawn_consumer(
                self.receiver_url,
                self.bootstrap,
                self.topic,
                f"g-{self.topic}",
                "--batch-size",
                "100",
                env=env,
            )
        return spawn_handler(
            self.receiver_url, APP, "--batch-size", "50", *self.handler_args, env=env
        )

    def start(self) -> None:
        for name in ("run",) if self.one_process else ("producer", "consumer", "handler"):
            self.daemons[name] = self._start(name, armed=True)

    def supervise(self) -> None:
        """Restart (unarmed) any daemon that its failpoint killed; fail on any other exit."""
        for name, daemon in list(self.daemons.items()):
            code = daemon.process.poll()
            if code is None:
                continue
            assert code == -signal.SIGKILL, f"{name} exited with {code}:\n{daemon.output()}"
            self.killed[name] += 1
            daemon.close()
            self.daemons[name] = self._start(name, armed=False)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        def check() -> bool:
            self.supervise()
            return predicate()

        wait_for(check, timeout, what, interval=0.1)

    def stop(self) -> None:
        for name, daemon in self.daemons.items():
            if daemon.process.poll() is None:
                daemon.terminate()
                code = daemon.wait(60)
                assert code == 0, f"{name} exited {code} on SIGTERM:\n{daemon.output()}"
            daemon.close()


def _send(
    url: str, topic: str, bodies: list[dict[str, Any]], broker: Broker | None = None
) -> list[Any]:
    broker = broker or Broker()
    ids = []
    with psycopg.connect(url) as conn:
        for start in range(0, len(bodies), 50):
            chunk = bodies[start : start + 50]
            with conn.transaction():
                ids += broker.send_many(
                    conn,
                    [Message(topic, b, key=f"key-{(start + i) % 11}") for i, b in enumerate(chunk)],
                )
    return ids


def _effects(url: str) -> Counter[Any]:
    with psycopg.connect(url) as conn:
        return Counter(r[0] for r in conn.execute("SELECT message_id FROM effects"))


def _dead(url: str, table: str) -> set[Any]:
    """Dead rows of a queue; the producer moves its dead rows to producer_dead."""
    with psycopg.connect(url) as conn:
        dead = {
            r[0]
            for r in conn.execute(
                f"SELECT message_id FROM outbox.{table} WHERE dead_at IS NOT NULL"
            )
        }
        if table == "producer_queue":
            dead |= {r[0] for r in conn.execute("SELECT message_id FROM outbox.producer_dead")}
    return dead


def _handled(url: str) -> int:
    return count(url, "consumer_processed")


@pytest.fixture
def two_services(outbox_database_factory: Any) -> tuple[str, str]:
    sender, receiver = outbox_database_factory(), outbox_database_factory()
    with psycopg.connect(receiver) as conn:
        conn.execute(inbox_app.SCHEMA)
    return sender, receiver


def _account(
    fault: str,
    sender: str,
    receiver: str,
    ids: list[Any],
    results: list[FaultResult],
    started: float,
    expect_dead: int = 0,
) -> None:
    effects = _effects(receiver)
    dead = _dead(sender, "producer_dead") | _dead(receiver, "consumer_queue")
    handled_once = sum(1 for i in ids if effects[i] == 1)
    duplicates = sum(1 for i in ids if effects[i] > 1)
    lost = sum(1 for i in ids if effects[i] == 0 and i not in dead)
    results.append(
        FaultResult(
            fault, len(ids), handled_once, duplicates, lost, len(dead), time.monotonic() - started
        )
    )
    assert set(effects) <= set(ids), "an effect for a message never sent"
    assert duplicates == 0, "a handler effect was applied twice"
    assert lost == 0, "a message was lost"
    assert len(dead) == expect_dead


KILL_POINTS = [
    ("producer", "producer.before_produce@3"),
    ("producer", "producer.after_produce@3"),
    ("consumer", "consumer.after_insert@2"),
    ("handler", "handler.before_commit@3"),
]


@pytest.mark.parametrize(("daemon", "point"), KILL_POINTS, ids=[p for _, p in KILL_POINTS])
def test_sigkill_at_each_point_of_each_loop(
    daemon: str,
    point: str,
    two_services: tuple[str, str],
    relay_transport: RelayTransport,
    fault_results: list[FaultResult],
) -> None:
    sender, receiver = two_services
    topic = relay_transport.topic()
    started = time.monotonic()
    ids = _send(sender, topic, [{"n": i} for i in range(600)])
    pipeline = Pipeline(
        sender,
        receiver,
        relay_transport.endpoint,
        topic,
        failpoints={daemon: point},
        producer_args=("--batch-size", "100"),
    )
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(receiver) == len(ids), 120, "every message handled")
    finally:
        pipeline.stop()
    assert pipeline.killed[daemon] == 1, f"the failpoint {point} never fired"
    fault = f"SIGKILL at {point.split('@')[0]} ({relay_transport.name})"
    _account(fault, sender, receiver, ids, fault_results, started)


@pytest.mark.parametrize(("daemon", "point"), KILL_POINTS, ids=[p for _, p in KILL_POINTS])
def test_sigkill_of_outbox_run_at_each_point_of_each_loop(
    daemon: str,
    point: str,
    outbox_database_url: str,
    relay_transport: RelayTransport,
    fault_results: list[FaultResult],
) -> None:
    """The same kill -9 rows against `outbox run`: the one process dies at the point (all three
    loops with it), is restarted, and every message is handled exactly once."""
    url = outbox_database_url
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)
    topic = relay_transport.topic()
    started = time.monotonic()
    ids = _send(url, topic, [{"n": i} for i in range(600)])
    pipeline = Pipeline(
        url,
        url,
        relay_transport.endpoint,
        topic,
        failpoints={daemon: point},
        producer_args=("--producer-batch-size", "100"),
        one_process=True,
    )
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(url) == len(ids), 120, "every message handled")
    finally:
        pipeline.stop()
    assert pipeline.killed["run"] == 1, f"the failpoint {point} never fired"
    fault = f"SIGKILL of outbox run at {point.split('@')[0]} ({relay_transport.name})"
    _account(fault, url, url, ids, fault_results, started)


def test_postgres_restarted_under_load(
    outbox_servers: Servers,
    two_services: tuple[str, str],
    relay_transport: RelayTransport,
    fault_results: list[FaultResult],
) -> None:
    postgres = outbox_servers.postgres
    if not hasattr(postgres, "restart") or outbox_servers.postgres.source != "local":  # type: ignore[attr-defined]
        pytest.skip("needs a PostgreSQL server the harness started")
    sender, receiver = two_services
    topic = relay_transport.topic()
    started = time.monotonic()
    ids = _send(sender, topic, [{"n": i, "sleep": 0.002} for i in range(600)])
    pipeline = Pipeline(
        sender, receiver, relay_transport.endpoint, topic, producer_args=("--batch-size", "50")
    )
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(receiver) > 50, 60, "the pipeline to be under way")
        postgres.restart(downtime=2.0)  # type: ignore[attr-defined]
        pipeline.wait(lambda: _handled(receiver) == len(ids), 180, "every message handled")
    finally:
        pipeline.stop()
    fault = f"PostgreSQL restarted ({relay_transport.name})"
    _account(fault, sender, receiver, ids, fault_results, started)


def test_broker_stopped_for_seconds_then_resumed(
    outbox_servers: Servers,
    two_services: tuple[str, str],
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    fault_results: list[FaultResult],
) -> None:
    kafka = outbox_servers.kafka
    if outbox_servers.kafka.source != "local":  # type: ignore[attr-defined]
        pytest.skip("needs a broker the harness started")
    sender, receiver = two_services
    started = time.monotonic()
    first = _send(sender, outbox_topic, [{"n": i} for i in range(200)])
    pipeline = Pipeline(
        sender,
        receiver,
        outbox_kafka_bootstrap,
        outbox_topic,
        producer_args=("--kafka-config", "message.timeout.ms=2000"),
    )
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(receiver) == len(first), 60, "the first messages")
        kafka.pause()  # type: ignore[attr-defined]
        try:
            later = _send(sender, outbox_topic, [{"n": i} for i in range(200, 400)])
            time.sleep(5)
        finally:
            kafka.resume()  # type: ignore[attr-defined]
        pipeline.wait(lambda: _handled(receiver) == 400, 120, "everything after the outage")
    finally:
        pipeline.stop()
    _account("broker frozen 5 s", sender, receiver, first + later, fault_results, started)


def test_handler_that_hangs_past_its_lease(
    two_services: tuple[str, str],
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    fault_results: list[FaultResult],
) -> None:
    sender, receiver = two_services
    started = time.monotonic()
    bodies = [{"n": i} for i in range(100)]
    bodies[10] = {"n": 10, "hang": 30}
    ids = _send(sender, outbox_topic, bodies)
    pipeline = Pipeline(
        sender, receiver, outbox_kafka_bootstrap, outbox_topic, handler_args=("--lease", "2")
    )
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(receiver) == len(ids), 60, "every message handled")
    finally:
        pipeline.stop()
    with psycopg.connect(receiver) as conn:
        attempts = conn.execute(
            "SELECT attempts FROM outbox.consumer_processed WHERE message_id = %s", (ids[10],)
        ).fetchone()
    assert attempts == (2,), "the hung attempt should count, the second one succeed"
    _account("handler hangs past lease", sender, receiver, ids, fault_results, started)


def test_message_larger_than_the_broker_accepts(
    two_services: tuple[str, str],
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    fault_results: list[FaultResult],
) -> None:
    sender, receiver = two_services
    started = time.monotonic()
    ids = _send(sender, outbox_topic, [{"n": i} for i in range(50)])
    big = _send(
        sender,
        outbox_topic,
        [{"n": 50, "blob": "x" * 1_500_000}],
        broker=Broker(max_payload_bytes=2_000_000),
    )
    ids += _send(sender, outbox_topic, [{"n": i} for i in range(51, 100)])
    pipeline = Pipeline(sender, receiver, outbox_kafka_bootstrap, outbox_topic)
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(receiver) == len(ids), 60, "the others handled")
    finally:
        pipeline.stop()
    # A message that can never be delivered leaves producer_queue for producer_dead.
    assert _dead(sender, "producer_dead") == set(big)
    assert count(sender, "producer_queue") == 0
    with psycopg.connect(sender) as conn:
        error = conn.execute("SELECT last_error FROM outbox.producer_dead").fetchone()[0]
    assert "MSG_SIZE_TOO_LARGE" in error
    _account(
        "message too large", sender, receiver, ids + big, fault_results, started, expect_dead=1
    )


def test_topic_that_does_not_exist_and_cannot_be_created(
    two_services: tuple[str, str],
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    fault_results: list[FaultResult],
) -> None:
    sender, receiver = two_services
    started = time.monotonic()
    ids = _send(sender, outbox_topic, [{"n": i} for i in range(100)])
    with psycopg.connect(sender) as conn, conn.transaction():
        missing = Broker().send(conn, f"{outbox_topic}.missing", {"n": -1}, key="lonely")
    pipeline = Pipeline(
        sender,
        receiver,
        outbox_kafka_bootstrap,
        outbox_topic,
        producer_args=(
            "--kafka-config",
            "allow.auto.create.topics=false",
            "--kafka-config",
            "message.timeout.ms=1500",
        ),
    )
    pipeline.start()
    try:
        pipeline.wait(lambda: _handled(receiver) == len(ids), 60, "the others handled")
        pipeline.wait(
            lambda: count(sender, where="attempts > 0") == 1, 30, "the failure to be recorded"
        )
    finally:
        pipeline.stop()
    with psycopg.connect(sender) as conn:
        row = conn.execute(
            "SELECT message_id, attempts, dead_at, last_error FROM outbox.producer_queue"
        ).fetchone()
    # Retriable: kept waiting (with backoff) for the topic to appear, never dropped.
    assert row[0] == missing and row[1] >= 1 and row[2] is None and "TIMED_OUT" in row[3]
    _account("topic cannot be created", sender, receiver, ids, fault_results, started)


def test_status_shows_lanes_and_a_claim_held_by_a_hanging_handler(
    two_services: tuple[str, str],
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
) -> None:
    import json as _json
    import subprocess
    import sys

    sender, receiver = two_services
    _send(sender, outbox_topic, [{"n": 0, "hang": 8}])
    pipeline = Pipeline(
        sender, receiver, outbox_kafka_bootstrap, outbox_topic, handler_args=("--lease", "30")
    )
    pipeline.start()
    try:

        def claimed() -> bool:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "outbox.cli",
                    "status",
                    "--json",
                    "--database-url",
                    receiver,
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            doc = _json.loads(out)
            handler = [p for p in doc["processes"] if p["queue"] == "handler"]
            return bool(doc["claims"]) and handler and handler[0]["lanes"] == 64

        pipeline.wait(claimed, 60, "status to show the handler's lanes and its claim")
    finally:
        for daemon in pipeline.daemons.values():
            daemon.close()  # SIGKILL: the hanging callback would hold SIGTERM for seconds
