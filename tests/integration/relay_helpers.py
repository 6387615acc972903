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
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.daemons.producer import Producer, ProducerConfig


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


@contextmanager
def producer_thread(url: str, bootstrap: str, **options: Any) -> Iterator[Producer]:
    """Run a Producer relay in a background thread of this process."""
    relay = Producer(ProducerConfig(database_url=url, kafka_bootstrap=bootstrap, **options))
    errors: list[BaseException] = []

    def target() -> None:
        try:
            relay.run()
        except BaseException as exc:  # surfaced in the test below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(60)
        assert not thread.is_alive(), "producer did not stop within 60 s"
    if errors:
        raise errors[0]


def relay_until_empty(url: str, bootstrap: str, timeout: float = 60, **options: Any) -> None:
    with producer_thread(url, bootstrap, **options):
        wait_for(lambda: count(url) == 0, timeout, "producer_queue to drain")


class Daemon:
    """An `outbox` daemon running as a separate process; its output goes to a temporary file."""

    def __init__(self, *args: str) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", *args],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
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


def spawn_producer(url: str, bootstrap: str, *extra: str) -> Daemon:
    """Start `outbox producer` as a separate process."""
    return Daemon("producer", "--database-url", url, "--kafka-bootstrap", bootstrap, *extra)


def consume(bootstrap: str, topic: str, expected: int, timeout: float = 30) -> list[Any]:
    """Read a topic from the start of every partition until `expected` messages or timeout.

    Partitions are assigned directly (no consumer group), so there is no join delay. Waits a
    little past `expected` to catch unexpected extra messages.
    """
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    consumer = Consumer(
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
