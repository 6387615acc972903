"""Shared steps of the integration tests: run the relay, read a topic back, count rows.

The daemons' transport is Kafka or the log kept in PostgreSQL: `spawn_producer` and
`spawn_consumer` take a Kafka bootstrap address or the log database's `postgresql://` URL in
the same place, and `RelayTransport` (the `relay_transport` fixture of tests/conftest.py,
parametrized over both) makes topics, reads them back, and builds in-process publishers and
subscribers for either.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox import transports
from outbox.core.handlers import Handlers
from outbox.runtime import (
    App,
    ConsumerConfig,
    Databases,
    HandlerConfig,
    ObservabilityConfig,
    ProducerConfig,
    Settings,
)

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


def app_of(
    url: str,
    transport: transports.TransportSettings | None = None,
    handlers: Handlers | None = None,
    *,
    schema: str = "outbox",
    group: str = "",
    topics: list[str] | None = None,
    observability: ObservabilityConfig | None = None,
    producer: dict[str, Any] | None = None,
    consumer: dict[str, Any] | None = None,
    handler: dict[str, Any] | None = None,
    publishers: Callable[[], Any] | None = None,
    subscribers: Callable[[], Any] | None = None,
) -> App:
    """The composition root over database `url` (its `schema`), as the commands build it;
    `publishers` and `subscribers` instead of the transport's (a test's own)."""
    return App(
        Settings(
            databases=Databases.of(url, schema=schema),
            transport=transport or transports.TransportSettings(),
            group=group,
            topics=tuple(topics or ()),
            producer=ProducerConfig(**(producer or {})),
            consumer=ConsumerConfig(**(consumer or {})),
            handler=HandlerConfig(**(handler or {})),
            observability=observability or ObservabilityConfig(),
        ),
        handlers,
        publishers=publishers,
        subscribers=subscribers,
    )


def producer_thread(
    url: str,
    bootstrap: str,
    *,
    schema: str = "outbox",
    kafka_config: dict[str, str] | None = None,
    observability: ObservabilityConfig | None = None,
    **tuning: Any,
) -> Any:
    """Run a Producer relay over Kafka in a background thread of this process."""
    where = transports.settings_of(
        "kafka", kafka_bootstrap=bootstrap, kafka_config=kafka_config or {}
    )
    app = app_of(url, where, schema=schema, observability=observability, producer=tuning)
    return running(app.producer())


#: Consumer settings for the tests: Tansu joins a group in half of session.timeout.ms.
TEST_CONSUMER_KAFKA = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}


def consumer_thread(
    url: str,
    bootstrap: str,
    topics: list[str],
    *,
    group: str | None = None,
    schema: str = "outbox",
    kafka_config: dict[str, str] | None = None,
    observability: ObservabilityConfig | None = None,
    **tuning: Any,
) -> Any:
    """Run a Consumer relay over Kafka in a background thread of this process."""
    where = transports.settings_of(
        "kafka",
        kafka_bootstrap=bootstrap,
        kafka_config=TEST_CONSUMER_KAFKA if kafka_config is None else kafka_config,
    )
    app = app_of(
        url,
        where,
        schema=schema,
        group=group or f"g-{topics[0]}",
        topics=topics,
        observability=observability,
        consumer=tuning,
    )
    return running(app.consumer())


def handler_thread(
    url: str,
    handlers: Handlers,
    *,
    schema: str = "outbox",
    observability: ObservabilityConfig | None = None,
    **tuning: Any,
) -> Any:
    """Run a HandlerRunner in a background thread of this process."""
    tuning.setdefault("poll_interval", 0.2)
    app = app_of(url, None, handlers, schema=schema, observability=observability, handler=tuning)
    return running(app.handler())


def relay_until_empty(url: str, bootstrap: str, timeout: float = 60, **options: Any) -> None:
    with producer_thread(url, bootstrap, **options):
        wait_for(lambda: count(url) == 0, timeout, "producer_queue to drain")


class Daemon:
    """An `outbox` daemon running as a separate process; its output goes to a temporary file.
    `command` runs instead of `python -m outbox.cli` (a script calling the CLI's main)."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, command: list[str] | None = None
    ) -> None:
        self.args = args
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [*(command or [sys.executable, "-m", "outbox.cli"]), *args],
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def catches(self, signum: int) -> bool | None:
        """Whether the process has a handler for `signum` yet (None: cannot tell here)."""
        try:
            with open(f"/proc/{self.process.pid}/status") as status:
                for line in status:
                    if line.startswith("SigCgt:"):
                        return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
        except OSError:
            return None
        return None

    def terminate(self, timeout: float = 30) -> None:
        """SIGTERM once the daemon handles it: a daemon restarted a moment ago is still
        importing, and SIGTERM would kill it (-15) instead of stopping it cleanly."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            caught = self.catches(signal.SIGTERM)
            if caught is None:
                time.sleep(3)  # no /proc: give it the time a start takes
                break
            if caught:
                break
            time.sleep(0.05)
        self.signal(signal.SIGTERM)

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


def is_log_url(endpoint: str) -> bool:
    """True for the PostgreSQL log's URL, False for a Kafka bootstrap address."""
    return endpoint.startswith(("postgresql://", "postgres://"))


def transport_args(endpoint: str) -> list[str]:
    """The daemons' flags for a Kafka bootstrap address or the PostgreSQL log's URL."""
    if is_log_url(endpoint):
        return ["--transport", transports.LOG.name, transports.LOG.endpoint_flag, endpoint]
    return [transports.KAFKA.endpoint_flag, endpoint]


def _for_transport(endpoint: str, extra: tuple[str, ...]) -> list[str]:
    """`extra` without its librdkafka settings when the transport is the PostgreSQL log."""
    if not is_log_url(endpoint):
        return list(extra)
    out: list[str] = []
    skip = False
    for arg in extra:
        if skip:
            skip = False
        elif arg == "--kafka-config":
            skip = True
        elif not arg.startswith("--kafka-config="):
            out.append(arg)
    return out


def spawn_producer(
    url: str, bootstrap: str, *extra: str, env: dict[str, str] | None = None
) -> Daemon:
    """Start `outbox producer` as a separate process; `bootstrap` is a Kafka bootstrap
    address or the PostgreSQL log's URL (then `--kafka-config` settings are left out)."""
    return Daemon(
        "producer",
        "--database-url",
        url,
        *transport_args(bootstrap),
        *_for_transport(bootstrap, extra),
        env=env,
    )


def spawn_consumer(
    url: str,
    bootstrap: str,
    topic: str,
    group: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Daemon:
    """Start `outbox consumer` as a separate process, with test-friendly group timings;
    `bootstrap` is a Kafka bootstrap address or the PostgreSQL log's URL."""
    settings = [f"--kafka-config={k}={v}" for k, v in TEST_CONSUMER_KAFKA.items()]
    return Daemon(
        "consumer",
        "--database-url",
        url,
        *transport_args(bootstrap),
        "--topic",
        topic,
        "--group",
        group,
        *_for_transport(bootstrap, (*settings, *extra)),
        env=env,
    )


def spawn_handler(
    url: str, handlers: str, *extra: str, env: dict[str, str] | None = None
) -> Daemon:
    """Start `outbox handler MODULE:ATTR` as a separate process."""
    return Daemon(
        "handler", handlers, "--database-url", url, "--poll-interval", "0.2", *extra, env=env
    )


def spawn_run(
    url: str,
    bootstrap: str,
    handlers: str,
    group: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Daemon:
    """Start `outbox run MODULE:ATTR` (relay, consumer and handler in one process) with
    test-friendly group timings; `bootstrap` is a Kafka bootstrap address or the PostgreSQL
    log's URL."""
    settings = [f"--kafka-config={k}={v}" for k, v in TEST_CONSUMER_KAFKA.items()]
    return Daemon(
        "run",
        handlers,
        "--database-url",
        url,
        *transport_args(bootstrap),
        "--group",
        group,
        "--poll-interval",
        "0.2",
        *_for_transport(bootstrap, (*settings, *extra)),
        env=env,
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


# -- either transport --------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """A record read back from a topic: where it is, its value and outbox's message id."""

    partition: int
    offset: int
    value: bytes
    message_id: str | None


@dataclass
class RelayTransport:
    """One of the daemons' transports, for tests parametrized over both (`relay_transport`).

    `endpoint` goes where `spawn_producer` / `spawn_consumer` take the bootstrap address: the
    Kafka bootstrap address, or the log database's URL.
    """

    name: str  # a name of the registry (outbox.transports): "kafka" or "postgres"
    endpoint: str
    make_topic: Callable[[int], str]
    consumer_settings: dict[str, str]

    @property
    def transport(self) -> transports.Transport[Any]:
        return transports.get(self.name)

    @property
    def is_log(self) -> bool:
        return self.transport is transports.LOG

    def settings(self, kafka_config: dict[str, str] | None = None) -> transports.TransportSettings:
        """Where the transport is: the endpoint in its field (faster log rebalances)."""
        return transports.settings_of(
            self.name,
            {
                self.transport.endpoint_dest: self.endpoint,
                "kafka_config": kafka_config or {},
                "log_rebalance_interval": 0.2,
            },
        )

    def topic(self, partitions: int = 3) -> str:
        """A new topic unique to the test."""
        return self.make_topic(partitions)

    def publisher(self) -> Any:
        """A Publisher as the producer daemon builds it (close it after use)."""
        publishers, _ = self.transport.make_publishers(self.settings().options)
        return publishers()

    def subscriber_factory(self, topics: list[str], group: str) -> Callable[[], Any]:
        """The `subscriber_factory` of a Consumer daemon reading `topics` as `group`."""
        subscribers, _ = self.transport.make_subscribers(
            self.settings(self.consumer_settings).options, group, topics, None
        )
        return subscribers

    def consumer(self, url: str, topics: list[str], group: str, **tuning: Any) -> Any:
        """A Consumer daemon (not started) storing `topics` into `url`'s inbox."""
        where = dataclasses.replace(self.settings(self.consumer_settings), name=self.name)
        app = app_of(url, where, group=group, topics=topics, consumer=tuning)
        return app.consumer()

    def producer(self, url: str, **tuning: Any) -> Any:
        """A Producer daemon (not started) relaying `url`'s outbox."""
        where = dataclasses.replace(self.settings(), name=self.name)
        return app_of(url, where, producer=tuning).producer()

    def records(self, topic: str, expected: int, timeout: float = 30) -> list[Record]:
        """Every record of `topic`, in offset order within each partition."""
        if not self.is_log:
            return [
                Record(
                    m.partition(),
                    m.offset(),
                    m.value(),
                    (header(m, "outbox-message-id") or b"").decode() or None,
                )
                for m in consume(self.endpoint, topic, expected, timeout)
            ]
        from outbox.pglog.log import decode_headers

        with psycopg.connect(self.endpoint) as conn:
            rows = conn.execute(
                "SELECT p.partition, r.log_offset, r.value, r.headers "
                "FROM outbox_log.log_records r "
                "JOIN outbox_log.log_partitions p ON p.id = r.partition_id "
                "JOIN outbox_log.log_topics t ON t.id = p.topic_id "
                "WHERE t.name = %s ORDER BY p.partition, r.log_offset",
                (topic,),
            ).fetchall()
        out = []
        for partition, offset, value, headers in rows:
            ids = [v for k, v in decode_headers(headers) if k == "outbox-message-id"]
            out.append(
                Record(partition, offset, bytes(value), ids[0].decode() if ids and ids[0] else None)
            )
        return out
