"""The Consumer relay: Kafka -> `consumer_queue`.

Contract: a batch of records is inserted into the inbox in one transaction (idempotent on the
message id), and only after that transaction committed are the Kafka offsets committed. A crash
in between redelivers the batch, and the unique message id stores it once. The daemon reads
through a `Subscriber` (outbox.ports): Kafka by default, or any other, e.g. the in-memory one.

No record can stop the Consumer: a record that cannot be an ordinary row (a header name
PostgreSQL cannot hold, a content type that is not storable text) is quarantined, stored dead
with its raw bytes and the reason. If PostgreSQL refuses a batch for its data all the same,
the batch is split in halves until the refused record is alone; the others are stored as
usual, that one is quarantined. Offsets are committed only after all of it is stored.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outbox.core.envelope import InboxRow
from outbox.core.errors import ConfigurationError
from outbox.core.headers import to_json
from outbox.core.numbers import check_fields
from outbox.core.text import first_line
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
from outbox.kafka.subscriber import (
    KafkaBatch,
    KafkaSubscriber,
    Quarantined,
    consumer_config,
    quarantine_params,
    quarantined_row,
)
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
    """Bind parameters of `inbox_insert` for a batch of rows (the quarantined ones left out)."""
    if any(r.quarantine is not None for r in rows):
        rows = [r for r in rows if r.quarantine is None]
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


class _Refused(Exception):
    """PostgreSQL refused a statement for its data (not for a lost connection); `conn` is the
    connection it ran on, still usable."""

    def __init__(self, error: BaseException, conn: Connection) -> None:
        super().__init__(str(error))
        self.error = error
        self.conn = conn


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
        #: Records stored dead because they cannot be ordinary rows (not counted in `stored`).
        self.quarantined = 0
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
        check_database(
            self._connect,
            self.config.schema,
            wait=self.config.observability.wait_for_database,
            stopping=lambda: self.stopping,
        )
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
            log.info(
                "consumer stopped: received=%d stored=%d quarantined=%d",
                self.received,
                self.stored,
                self.quarantined,
            )

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
        quarantined: list[Quarantined]
        ordinary: Batch
        if isinstance(rows, KafkaBatch):
            quarantined = list(rows.quarantined)
            ordinary = rows
        else:
            quarantined = [quarantined_row(r) for r in rows if r.quarantine is not None]
            ordinary = [r for r in rows if r.quarantine is None] if quarantined else rows
        following: list[Batch] = []

        def fetch_following() -> None:
            if meanwhile is not None and not following:
                following.append(meanwhile())

        try:
            try:
                conn, row = self._execute(
                    conn, "inbox_insert", self._params(ordinary), fetch_following
                )
                stored = Counter[str](row[2] if row and row[2] else {})
            except _Refused as refused:  # some record's data: find it
                conn, stored = self._bisect(refused.conn, ordinary, refused.error, quarantined)
            dead: Counter[str] = Counter()
            if quarantined:
                conn, row = self._execute(
                    conn, "inbox_quarantine", quarantine_params(quarantined), None
                )
                dead.update(row[0] if row and row[0] else {})
        except psycopg.OperationalError:
            if self.stopping:
                return None, following[0] if following else []
            raise
        for record in quarantined:
            log.warning(
                "record topic %r partition %d offset %d quarantined (stored dead): %s",
                record.topic,
                record.partition,
                record.offset,
                record.reason,
                extra={"topic": record.topic, "event": "consumer.quarantined"},
            )
        self.received += len(rows)
        self.stored += stored.total()
        self.quarantined += dead.total()
        self.observability.consumer_batch(
            rows.topical() if isinstance(rows, KafkaBatch) else rows, stored, dead
        )
        return conn, following[0] if following else []

    def _params(self, rows: Batch) -> dict[str, Any]:
        if isinstance(rows, KafkaBatch):
            return rows.params(self._channel)
        return insert_params(rows, self._channel)

    def _execute(
        self,
        conn: Connection | None,
        name: str,
        params: dict[str, Any],
        meanwhile: Callable[[], None] | None,
    ) -> tuple[Connection, Any]:
        """Run one statement (autocommit: atomic on its own), retrying through database
        outages; its first result row. `meanwhile()` runs while the database works on it.
        `_Refused` when PostgreSQL (or psycopg, binding the values) refuses the data."""
        retrying = retrying_database(lambda: self.stopping, "cannot store a batch in PostgreSQL")
        for attempt in retrying:
            with attempt:
                if conn is None or conn.closed or conn.broken:
                    conn = self._connect()
                try:
                    # In a pipeline the statement is sent at once, and committed when the
                    # pipeline ends, after `meanwhile`.
                    with conn.pipeline():
                        cursor = conn.execute(self._sql[name], params)
                        if meanwhile is not None:
                            meanwhile()
                    return conn, cursor.fetchone()
                except psycopg.OperationalError:
                    raise
                except (psycopg.Error, UnicodeError) as exc:
                    if conn.broken:
                        raise
                    raise _Refused(exc, conn) from exc
        raise AssertionError("unreachable: retrying raises when it stops")  # pragma: no cover

    def _bisect(
        self,
        conn: Connection | None,
        rows: Batch,
        error: BaseException,
        quarantined: list[Quarantined],
    ) -> tuple[Connection | None, Counter[str]]:
        """Store the records of a batch PostgreSQL refused (`error`): halves are inserted on
        their own, a refused half is split again, and a record refused alone is appended to
        `quarantined` with the refusal as its reason. Returns the rows stored per topic."""
        size = rows.ordinary if isinstance(rows, KafkaBatch) else len(rows)
        stored: Counter[str] = Counter()
        if size == 0:
            return conn, stored
        if size == 1:
            reason = f"PostgreSQL refused the record: {first_line(error)}"
            quarantined.append(
                rows.quarantine(0, reason)
                if isinstance(rows, KafkaBatch)
                else quarantined_row(rows[0], reason)
            )
            return conn, stored
        half = size // 2
        for start, stop in ((0, half), (half, size)):
            part = rows.part(start, stop) if isinstance(rows, KafkaBatch) else rows[start:stop]
            try:
                conn, row = self._execute(conn, "inbox_insert", self._params(part), None)
                stored.update(row[2] if row and row[2] else {})
            except _Refused as refused:
                conn, more = self._bisect(refused.conn, part, refused.error, quarantined)
                stored.update(more)
        return conn, stored
