"""Shared steps of the integration tests: run the relay, read a topic back, count rows."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import psycopg
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.core.handlers import Handlers
from outbox.daemons.consumer import ConsumerConfig
from outbox.daemons.handler import HandlerConfig, HandlerRunner
from outbox.daemons.producer import ProducerConfig
from outbox.transports import kafka_consumer, kafka_producer

R = TypeVar("R", bound="Runnable")


def count(url: str, table: str = "producer_queue", where: str = "true") -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM outbox.{table} WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Runnable(Protocol):
    def run(self) -> None: ...
    def stop(self) -> None: ...


@contextmanager
def running(daemon: R) -> Iterator[R]:
    """Run a daemon object (Producer, Consumer, HandlerRunner) in a thread of this process."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            daemon.run()
        except BaseException as exc:  # surfaced in the test below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(60)
        assert not thread.is_alive(), f"{type(daemon).__name__} did not stop within 60 s"
    if errors:
        raise errors[0]


def producer_thread(url: str, bootstrap: str, **options: Any) -> Any:
    """Run a Producer relay in a background thread of this process."""
    config = ProducerConfig(database_url=url, kafka_bootstrap=bootstrap, **options)
    return running(kafka_producer(config))


#: Consumer settings for the tests: Tansu joins a group in half of session.timeout.ms.
TEST_CONSUMER_KAFKA = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}


def consumer_thread(url: str, bootstrap: str, topics: list[str], **options: Any) -> Any:
    """Run a Consumer relay in a background thread of this process."""
    options.setdefault("kafka_config", TEST_CONSUMER_KAFKA)
    options.setdefault("group", f"g-{topics[0]}")
    return running(
        kafka_consumer(
            ConsumerConfig(database_url=url, kafka_bootstrap=bootstrap, topics=topics, **options)
        )
    )


def handler_thread(url: str, handlers: Handlers, **options: Any) -> Any:
    """Run a HandlerRunner in a background thread of this process."""
    options.setdefault("poll_interval", 0.2)
    return running(HandlerRunner(HandlerConfig(database_url=url, **options), handlers))


def relay_until_empty(url: str, bootstrap: str, timeout: float = 60, **options: Any) -> None:
    with producer_thread(url, bootstrap, **options):
        wait_for(lambda: count(url) == 0, timeout, "producer_queue to drain")


class Daemon:
    """An `outbox` daemon running as a separate process; its output goes to a temporary file."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", *args],
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spawn_producer(
    url: str, bootstrap: str, *extra: str, env: dict[str, str] | None = None
) -> Daemon:
    """Start `outbox producer` as a separate process."""
    return Daemon(
        "producer", "--database-url", url, "--kafka-bootstrap", bootstrap, *extra, env=env
    )


def spawn_consumer(
    url: str,
    bootstrap: str,
    topic: str,
    group: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Daemon:
    """Start `outbox consumer` as a separate process, with test-friendly group timings."""
    settings = [f"--kafka-config={k}={v}" for k, v in TEST_CONSUMER_KAFKA.items()]
    return Daemon(
        "consumer",
        "--database-url",
        url,
        "--kafka-bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        *settings,
        *extra,
        env=env,
    )


def spawn_handler(
    url: str, handlers: str, *extra: str, env: dict[str, str] | None = None
) -> Daemon:
    """Start `outbox handler MODULE:ATTR` as a separate process."""
    return Daemon(
        "handler", handlers, "--database-url", url, "--poll-interval", "0.2", *extra, env=env
    )


def consume(bootstrap: str, topic: str, expected: int, timeout: float = 30) -> list[Any]:
    """Read a topic from the start of every partition until `expected` messages or timeout.

    Partitions are assigned directly (no consumer group), so there is no join delay. Waits a
    little past `expected` to catch unexpected extra messages.
    """
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    consumer = KafkaConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    settle: float | None = None
    try:
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    messages.append(m)
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error: {m.error()}")
            if len(messages) >= expected:
                settle = settle or time.monotonic() + 0.3
                if time.monotonic() >= settle:
                    break
    finally:
        consumer.close()
    return messages


def header(message: Any, name: str) -> bytes | None:
    for key, value in message.headers() or []:
        if key == name:
            return bytes(value)
    return None
