"""The Consumer relay: Kafka -> `consumer_queue`.

Contract: a batch of records is inserted into the inbox in one transaction (idempotent on the
message id), and only after that transaction committed are the Kafka offsets committed. A crash
in between redelivers the batch, and the unique message id stores it once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, Message

from outbox.core.errors import ConfigurationError
from outbox.core.headers import to_json
from outbox.core.topics import validate_topic
from outbox.daemons.failpoints import failpoint
from outbox.daemons.lanes import Connection, check_database, connect, retrying_database
from outbox.kafka.publisher import check_reachable
from outbox.kafka.subscriber import InboxRow, consumer_config, next_offsets, to_inbox_row
from outbox.postgres.queries import channel, queries, validate_schema

log = logging.getLogger("outbox.consumer")


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

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        if not self.topics:
            raise ConfigurationError("at least one --topic is required")
        for topic in self.topics:
            validate_topic(topic)
        if self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {self.batch_size}")


def insert_params(rows: Sequence[InboxRow], wake_channel: str) -> dict[str, Any]:
    """Bind parameters of `inbox_insert` for a batch of rows."""
    return {
        "message_ids": [r.message_id for r in rows],
        "topics": [r.topic for r in rows],
        "keys": [r.key for r in rows],
        "payloads": [r.payload for r in rows],
        "headers": [json.dumps(to_json(r.headers)) for r in rows],
        "content_types": [r.content_type for r in rows],
        "lanes": [r.lane for r in rows],
        "created_ats": [r.created_at for r in rows],
        "partitions": [r.partition for r in rows],
        "offsets": [r.offset for r in rows],
        "channel": wake_channel,
    }


class Consumer:
    """Stores Kafka records in `consumer_queue` until asked to stop."""

    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self._sql = queries(config.schema)
        self._channel = channel(config.schema, "consumer_queue")
        self._kafka_config = consumer_config(
            config.kafka_bootstrap, config.group, config.kafka_config
        )
        self._stop = threading.Event()
        #: Counters for tests and logs: records received, rows stored (not duplicates).
        self.received = 0
        self.stored = 0

    def stop(self) -> None:
        """Ask the consumer to store and commit the batch in hand, then return from `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _connect(self) -> Connection:
        return connect(
            self.config.database_url,
            timeout=self.config.connect_timeout,
            application_name="outbox-consumer",
        )

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or broker or old schema."""
        check_database(self._connect, self.config.schema)
        check_reachable(self._kafka_config, timeout=self.config.connect_timeout)

    def run(self) -> None:
        """Check, subscribe, and store batches until `stop()`."""
        self.check()
        kafka = KafkaConsumer(self._kafka_config)
        kafka.subscribe(list(self.config.topics))
        conn: Connection | None = None
        try:
            while not self.stopping:
                records = self._records(self._next_batch(kafka))
                if not records:
                    continue
                conn = self._store(conn, records)
                if conn is None:
                    break  # stopped while the database was unreachable: nothing committed
                failpoint("consumer.after_insert")
                self._commit(kafka, records)
        finally:
            kafka.close()
            if conn is not None:
                conn.close()
            log.info("consumer stopped: received=%d stored=%d", self.received, self.stored)

    def _next_batch(self, kafka: KafkaConsumer) -> list[Message]:
        """Wait for one record, then take what else is already there, up to the batch size.

        `consume(n, timeout)` alone would hold the first record until n arrived or the timeout
        passed, adding the whole timeout to every message's latency at low rates.
        """
        first = kafka.poll(self.config.poll_timeout)
        if first is None:
            return []
        if self.config.batch_size == 1:
            return [first]
        return [first, *kafka.consume(self.config.batch_size - 1, 0)]

    def _records(self, batch: list[Message]) -> list[Message]:
        records = []
        for message in batch:
            error = message.error()
            if error is None:
                records.append(message)
            elif error.fatal():
                raise KafkaException(error)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("kafka: %s", error.str())
        return records

    def _store(self, conn: Connection | None, records: list[Message]) -> Connection | None:
        """Insert the batch, retrying through database outages; None if stopped meanwhile."""
        rows = [to_inbox_row(m) for m in records]
        params = insert_params(rows, self._channel)
        retrying = retrying_database(lambda: self.stopping, "cannot store a batch in PostgreSQL")
        try:
            for attempt in retrying:
                with attempt:
                    if conn is None or conn.closed or conn.broken:
                        conn = self._connect()
                    with conn.transaction():
                        row = conn.execute(self._sql["inbox_insert"], params).fetchone()
        except psycopg.OperationalError:
            if self.stopping:
                return None
            raise
        self.received += len(rows)
        self.stored += int(row[0]) if row else 0
        log.debug("stored %d of %d records", int(row[0]) if row else 0, len(rows))
        return conn

    def _commit(self, kafka: KafkaConsumer, records: list[Message]) -> None:
        try:
            kafka.commit(offsets=next_offsets(records), asynchronous=False)
        except KafkaException as exc:
            # The rows are stored; a lost commit only means a redelivery, which dedup absorbs.
            log.warning("offset commit failed (the batch will be redelivered): %s", exc)
