"""The Consumer relay: Kafka -> `consumer_queue`.

Contract: a batch of records is inserted into the inbox in one transaction (idempotent on the
message id), and only after that transaction committed are the Kafka offsets committed. A crash
in between redelivers the batch, and the unique message id stores it once. The daemon reads
through a `Subscriber` (outbox.ports): Kafka by default, or any other, e.g. the in-memory one.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outbox.core.envelope import InboxRow
from outbox.core.errors import ConfigurationError
from outbox.core.headers import to_json
from outbox.core.numbers import check_fields
from outbox.core.topics import validate_topic
from outbox.daemons.failpoints import failpoint
from outbox.daemons.lanes import (
    Connection,
    check_database,
    connect,
    new_relay_id,
    retrying_database,
)
from outbox.kafka.publisher import check_reachable
from outbox.kafka.subscriber import KafkaBatch, KafkaSubscriber, consumer_config
from outbox.observability.health import Heartbeat
from outbox.observability.runtime import Observability, ObservabilityConfig, observed
from outbox.ports import Subscriber
from outbox.postgres.queries import channel, queries, validate_schema

log = logging.getLogger("outbox.consumer")

#: A polled batch: rows from any `Subscriber`, or the columns Kafka's gives the Consumer.
Batch = list[InboxRow] | KafkaBatch


@dataclass(frozen=True)
class ConsumerConfig:
    """Settings of one Consumer relay process; validated at construction."""

    database_url: str
    kafka_bootstrap: str
    topics: Sequence[str]
    group: str
    schema: str = "outbox"
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    batch_size: int = 1000
    poll_timeout: float = 0.2
    connect_timeout: float = 10.0
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        if not self.topics:
            raise ConfigurationError("at least one --topic is required")
        for topic in self.topics:
            validate_topic(topic)
        check_fields(
            self,
            {"batch_size": "count", "poll_timeout": "seconds", "connect_timeout": "seconds"},
        )


def insert_params(rows: Sequence[InboxRow], wake_channel: str) -> dict[str, Any]:
    """Bind parameters of `inbox_insert` for a batch of rows."""
    return {
        "message_ids": [r.message_id for r in rows],
        "topics": [r.topic for r in rows],
        "keys": [r.key for r in rows],
        "payloads": [r.payload for r in rows],
        "headers": [json.dumps(to_json(r.headers)) if r.headers else "{}" for r in rows],
        "content_types": [r.content_type for r in rows],
        "lanes": [r.lane for r in rows],
        "created_ats": [r.created_at for r in rows],
        "partitions": [r.partition for r in rows],
        "offsets": [r.offset for r in rows],
        "channel": wake_channel,
    }


class Consumer:
    """Stores Kafka records in `consumer_queue` until asked to stop.

    `subscriber_factory` replaces Kafka with another transport (the config's Kafka settings
    are then unused); it is called once per `run`, in the running thread.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        subscriber_factory: Callable[[], Subscriber] | None = None,
    ) -> None:
        self.config = config
        self._sql = queries(config.schema)
        self._channel = channel(config.schema, "consumer_queue")
        self._subscriber_factory = subscriber_factory
        self._kafka_config = (
            consumer_config(config.kafka_bootstrap, config.group, config.kafka_config)
            if subscriber_factory is None
            else {}
        )
        self._stop = threading.Event()
        #: Counters for tests and logs: records received, rows stored (not duplicates).
        self.received = 0
        self.stored = 0
        #: Beaten every turn of the loop and every connection attempt (for /livez).
        self.heartbeat = Heartbeat()
        self.observability = Observability(
            "consumer",
            config,
            heartbeat=self.heartbeat,
            relay_id=new_relay_id(),
            kafka=(lambda: self._kafka_config) if subscriber_factory is None else None,
        )

    def stop(self) -> None:
        """Ask the consumer to store and commit the batch in hand, then return from `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _connect(self) -> Connection:
        self.heartbeat.beat()
        return connect(
            self.config.database_url,
            timeout=self.config.connect_timeout,
            application_name="outbox-consumer",
        )

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or broker or old schema."""
        check_database(self._connect, self.config.schema)
        if self._subscriber_factory is None:
            check_reachable(self._kafka_config, timeout=self.config.connect_timeout)

    @observed
    def run(self) -> None:
        """Check, subscribe, and store batches until `stop()`."""
        self.check()
        subscriber = self._subscribe()
        kafka = subscriber if isinstance(subscriber, KafkaSubscriber) else None
        conn: Connection | None = None
        rows: Batch = []

        def poll(timeout: float) -> Batch:
            if kafka is not None:  # as columns: no object per record
                return kafka.poll_batch(self.config.batch_size, timeout)
            return subscriber.poll(self.config.batch_size, timeout)

        def waiting() -> Batch:
            """The records already there (no wait), taken while a batch is being stored."""
            if self.stopping:
                return []
            return poll(0)

        try:
            while not self.stopping:
                self.heartbeat.beat()
                if not rows:
                    rows = poll(self.config.poll_timeout)
                    if not rows:
                        continue
                conn, following = self._store(conn, rows, meanwhile=waiting)
                if conn is None:
                    break  # stopped while the database was unreachable: nothing committed
                failpoint("consumer.after_insert")
                if isinstance(rows, KafkaBatch):
                    assert kafka is not None
                    kafka.commit(rows)
                else:
                    subscriber.commit(rows)
                # Records polled but not stored are never committed: if the consumer stops
                # before storing them, they are delivered again.
                rows = following
        finally:
            subscriber.close()
            if conn is not None:
                conn.close()
            log.info("consumer stopped: received=%d stored=%d", self.received, self.stored)

    def _subscribe(self) -> Subscriber:
        """The transport client: the factory's, else a Kafka consumer-group member."""
        if self._subscriber_factory is not None:
            return self._subscriber_factory()
        return KafkaSubscriber(self._kafka_config, self.config.topics)

    def _store(
        self,
        conn: Connection | None,
        rows: Batch,
        meanwhile: Callable[[], Batch] | None = None,
    ) -> tuple[Connection | None, Batch]:
        """Insert the batch, retrying through database outages; (None, ...) if stopped
        meanwhile. While the database works on it, `meanwhile()` is called (once): its result
        is returned beside the connection."""
        if isinstance(rows, KafkaBatch):
            params = rows.params(self._channel)
        else:
            params = insert_params(rows, self._channel)
        retrying = retrying_database(lambda: self.stopping, "cannot store a batch in PostgreSQL")
        following: Batch = []
        try:
            for attempt in retrying:
                with attempt:
                    if conn is None or conn.closed or conn.broken:
                        conn = self._connect()
                    # One statement, atomic on its own (autocommit). In a pipeline it is sent
                    # at once, and committed when the pipeline ends, after `meanwhile`.
                    with conn.pipeline():
                        cursor = conn.execute(self._sql["inbox_insert"], params)
                        if meanwhile is not None:
                            following, meanwhile = meanwhile(), None
                    row = cursor.fetchone()
        except psycopg.OperationalError:
            if self.stopping:
                return None, following
            raise
        self.received += len(rows)
        self.stored += int(row[0]) if row else 0
        self.observability.consumer_batch(
            rows.topical() if isinstance(rows, KafkaBatch) else rows,
            (row[2] if row else None) or {},
        )
        return conn, following
