"""The Producer relay: `producer_queue` -> Kafka.

Contract: a row is deleted only after its delivery report succeeded, so a crash at any point
re-sends at most the batch in hand (at-least-once; the inbox removes duplicates). Lanes, wake-ups
and reconnects are those of `LaneRelay`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import RowMaker

from outbox import tracing
from outbox.core.envelope import StoredMessage
from outbox.core.errors import ConfigurationError, InvalidHeaders, InvalidTopic
from outbox.core.numbers import check_fields
from outbox.core.retry import Backoff
from outbox.core.text import storable
from outbox.core.topics import validate_topic
from outbox.daemons.failpoints import failpoint
from outbox.daemons.lanes import Connection, LaneRelay, new_relay_id
from outbox.kafka.publisher import (
    KafkaPublisher,
    QueuedRow,
    check_reachable,
    producer_config,
    stored_headers,
)
from outbox.observability.runtime import Observability, ObservabilityConfig, observed
from outbox.ports import DeliveryFailure, Publisher
from outbox.postgres.queries import validate_schema

log = logging.getLogger("outbox.producer")

#: While a backlog keeps batches full, each fetch asks for twice the rows of the last one, up
#: to this many times `batch_size`: fewer round trips to PostgreSQL and Kafka per message. A
#: batch that comes back short (the backlog is drained) goes back to `batch_size`.
BUSY_BATCH_FACTOR = 8


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of one Producer relay process; validated at construction."""

    database_url: str
    kafka_bootstrap: str = ""
    schema: str = "outbox"
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    batch_size: int = 1000
    poll_interval: float = 1.0
    rebalance_interval: float = 2.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=30.0))
    connect_timeout: float = 10.0
    relay_id: str = field(default_factory=new_relay_id)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        check_fields(
            self,
            {
                "batch_size": "count",
                "poll_interval": "seconds",
                "rebalance_interval": "seconds",
                "connect_timeout": "seconds",
            },
        )


def _queued_rows(_cursor: Cursor[Any]) -> RowMaker[QueuedRow]:
    """psycopg row factory of `producer_fetch`: the row tuple becomes a QueuedRow as it is."""
    return QueuedRow._make


def _stored(row: QueuedRow) -> StoredMessage:
    """A fetched row as a `StoredMessage`, for publishers other than Kafka's and for tracing;
    `InvalidHeaders` if its stored headers are not outbox's form."""
    return StoredMessage(
        id=row.id,
        message_id=UUID(row.message_id),
        topic=row.topic,
        key=row.key,
        payload=row.payload,
        content_type=row.content_type,
        headers=stored_headers(row.headers) if row.headers is not None else {},
        created_at=datetime.fromisoformat(row.created_at),
        attempts=row.attempts,
    )


def _hopeless(row: QueuedRow, failure: DeliveryFailure) -> DeliveryFailure:
    """`failure`, made permanent if the row's topic is a name Kafka never accepts (librdkafka
    reports an unknown topic, which a retry could fix for a legal name: it may be created)."""
    if failure.permanent:
        return failure
    try:
        validate_topic(row.topic)
    except InvalidTopic as exc:
        return DeliveryFailure(error=storable(f"{failure.error}; {exc}"), permanent=True)
    return failure


def one_topic_per_key(rows: list[QueuedRow]) -> list[QueuedRow]:
    """`rows` less, for each key, its rows from the first one to another topic than the key's
    first row's: within one batch a key's rows go to one topic.

    Kafka keeps the order of one partition only, and a batch is produced at once: had a key's
    row to topic B gone out in the batch in which its earlier row to topic A failed, B's would
    have overtaken A's. The rows left out stay in the queue for the next batch. O(rows), and
    the rows are not copied unless a key changes topic.
    """
    topics: dict[bytes, str] = {}
    first_cut = -1
    for index, row in enumerate(rows):
        key = row.key
        if key is not None and topics.setdefault(key, row.topic) != row.topic:
            first_cut = index
            break
    if first_cut < 0:
        return rows  # the usual case: no key changes topic in the batch
    cut = {rows[first_cut].key}
    kept = rows[:first_cut]
    for row in rows[first_cut + 1 :]:
        key = row.key
        if key is not None:
            if key in cut:
                continue
            if topics.setdefault(key, row.topic) != row.topic:
                cut.add(key)
                continue
        kept.append(row)
    return kept


class Producer(LaneRelay[QueuedRow]):
    """Relays committed rows of `producer_queue` to Kafka until asked to stop."""

    table = "producer_queue"
    kind = "producer"
    #: Whatever `producer_queue`'s statistics say (docs/decisions/0007): read it in id order
    #: through the primary key, so the fetch stops after `limit` rows instead of sorting the
    #: backlog; and plan each execution with its arrays as constants, which PostgreSQL hashes
    #: or looks up, instead of a generic plan made for an empty table that compares every row
    #: with every id of a batch. Not `enable_seqscan = off`: it made the relay's catalog
    #: queries (dead relays, lane locks) take 100 ms and delayed messages by as much.
    planner_settings = ("enable_sort = off", "plan_cache_mode = force_custom_plan")

    def __init__(
        self,
        config: ProducerConfig,
        publisher_factory: Callable[[], Publisher] | None = None,
    ) -> None:
        super().__init__(
            database_url=config.database_url,
            schema=config.schema,
            poll_interval=config.poll_interval,
            rebalance_interval=config.rebalance_interval,
            connect_timeout=config.connect_timeout,
            relay_id=config.relay_id,
        )
        self.config = config
        self._publisher_factory = publisher_factory
        self._publisher: Publisher | None = None
        #: The next batch, fetched while the previous one was on its way to Kafka: (lanes,
        #: limit, cursor) while its statement runs, then (lanes, rows) until `fetch` takes it.
        self._next: tuple[list[int], int, Cursor[QueuedRow]] | None = None
        #: Rows the next fetch asks for (see BUSY_BATCH_FACTOR).
        self._limit = config.batch_size
        self._fetched: tuple[list[int], list[QueuedRow]] | None = None
        #: Counters for tests and logs: rows relayed, failed deliveries, rows marked dead.
        self.relayed = 0
        self.failed = 0
        self.dead = 0
        self.observability = Observability(
            "producer",
            config,
            heartbeat=self.heartbeat,
            relay_id=config.relay_id,
            kafka=None
            if publisher_factory is not None
            else lambda: producer_config(config.kafka_bootstrap, config.kafka_config),
            lanes=lambda: len(self.lanes),
        )

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or broker or old schema
        (waiting for the database first if `--wait-for-database`)."""
        self.check_database(self.config.observability.wait_for_database)
        if self._publisher_factory is None:
            check_reachable(
                producer_config(self.config.kafka_bootstrap, self.config.kafka_config),
                timeout=self.config.connect_timeout,
            )

    @observed
    def run(self) -> None:
        """Check, then relay until `stop()`."""
        self.check()
        if self._publisher_factory is None:
            config = producer_config(self.config.kafka_bootstrap, self.config.kafka_config)
            self._publisher = KafkaPublisher(config)
        else:
            self._publisher = self._publisher_factory()
        try:
            self.serve_forever()
        finally:
            self._publisher.close()
            log.info(
                "producer stopped: relayed=%d failed=%d dead=%d",
                self.relayed,
                self.failed,
                self.dead,
            )

    def _serve(self, conn: Connection) -> None:
        # A new connection: a batch fetched on the previous one may have been sent meanwhile
        # by the relay that held the lanes while this one was away.
        self._next = self._fetched = None
        super()._serve(conn)

    def fetch(self, conn: Connection, lanes: list[int]) -> list[QueuedRow]:
        fetched, self._fetched = self._fetched, None
        if fetched is not None and fetched[0] == lanes:
            return one_topic_per_key(fetched[1])  # fetched during the previous batch
        limit = self._limit
        rows = self._fetch(conn, lanes, limit, exclude=[]).fetchall()
        self._resize(len(rows), limit)
        return one_topic_per_key(rows)

    def _fetch(
        self, conn: Connection, lanes: list[int], limit: int, exclude: list[int]
    ) -> Cursor[QueuedRow]:
        """Run `producer_fetch` (in a pipeline: without waiting for its rows)."""
        # Binary results: bytea arrives as it is, without hex decoding.
        cursor = conn.cursor(row_factory=_queued_rows, binary=True)
        params = {"lanes": lanes, "limit": limit, "exclude": exclude}
        return cursor.execute(self.sql["producer_fetch"], params)

    def _resize(self, fetched: int, limit: int) -> None:
        """The next fetch's size: doubled after a full batch, `batch_size` after a short one."""
        batch_size = self.config.batch_size
        if fetched >= limit:
            self._limit = min(2 * limit, BUSY_BATCH_FACTOR * batch_size)
        else:
            self._limit = batch_size

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        row = conn.execute(self.sql["producer_next_retry"], {"lanes": lanes}).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def process(self, conn: Connection, rows: Sequence[QueuedRow]) -> None:
        failpoint("producer.before_produce")
        started = time.monotonic()
        self._next = None
        # Only rows with user headers can carry a trace context, and only they can fail to
        # become a record before Kafka sees them (headers written by hand, not in outbox's
        # form): such a row fails permanently, alone, and goes dead; the batch goes on.
        traced: list[tuple[int, StoredMessage]] = []
        unsendable: dict[int, DeliveryFailure] = {}
        for i, row in enumerate(rows):
            if row.headers is not None:
                try:
                    traced.append((i, _stored(row)))
                except InvalidHeaders as exc:
                    unsendable[i] = DeliveryFailure(error=storable(str(exc)), permanent=True)
        sendable = rows
        if unsendable:
            sendable = [row for i, row in enumerate(rows) if i not in unsendable]
        # Pipeline mode: the next batch is fetched while this one is on its way to Kafka, and
        # the rows are deleted (below, once acknowledged) in the same round trip.
        with conn.pipeline():
            with tracing.publish_spans([message for _, message in traced]) as spans:
                results = self._publish(conn, sendable, exclude=[row.id for row in rows])
                if unsendable:
                    published = iter(results)
                    results = [unsendable.get(i) or next(published) for i in range(len(rows))]
                spans.outcomes([results[i] for i, _ in traced])
            failpoint("producer.after_produce")
            delivery_seconds = time.monotonic() - started
            failed = [
                (row, _hopeless(row, r))
                for row, r in zip(rows, results, strict=True)
                if r is not None
            ]
            if not failed:
                # One statement, atomic on its own (the connection is in autocommit).
                conn.execute(self.sql["producer_delete"], {"ids": [row.id for row in rows]})
            else:
                delivered = [row.id for row, r in zip(rows, results, strict=True) if r is None]
                with conn.transaction():
                    if delivered:
                        conn.execute(self.sql["producer_delete"], {"ids": delivered})
                    conn.execute(self.sql["producer_fail"], self._failure_params(failed))
        # Leaving the pipeline waited for every statement above.
        self._keep_next(failed)
        self.relayed += len(rows) - len(failed)
        self.failed += len(failed)
        if failed:
            message, failure = failed[0]
            log.warning(
                "%d of %d deliveries failed; first: message %s topic %s: %s",
                len(failed),
                len(rows),
                message.message_id,
                message.topic,
                failure.error,
                extra={"message_id": str(message.message_id), "topic": message.topic},
            )
        self.observability.producer_batch(rows, results, delivery_seconds)

    def _publish(
        self, conn: Connection, rows: Sequence[QueuedRow], exclude: list[int]
    ) -> list[DeliveryFailure | None]:
        """Publish a batch: Kafka's publisher takes the rows as they are (and the next batch,
        less the ids in `exclude`, is fetched while they are on their way), other publishers
        take messages."""
        publisher = self._publisher
        assert publisher is not None
        if not isinstance(publisher, KafkaPublisher):
            return publisher.publish([_stored(row) for row in rows])
        publisher.produce_rows(rows)
        if not self.stopping:
            lanes, limit = sorted(self.lanes), self._limit
            cursor = self._fetch(conn, lanes, limit, exclude=exclude)
            self._next = (lanes, limit, cursor)
        return publisher.wait()

    def _keep_next(self, failed: list[tuple[QueuedRow, DeliveryFailure]]) -> None:
        """Keep the batch fetched during this one for `fetch`, less the keys that now wait for a
        retry: it was fetched before this batch's failures were recorded."""
        if self._next is None:
            return
        lanes, limit, cursor = self._next
        self._next = None
        rows = cursor.fetchall()
        self._resize(len(rows), limit)
        waiting = {row.key for row, f in failed if not f.permanent and row.key is not None}
        if waiting:
            rows = [row for row in rows if row.key not in waiting]
        self._fetched = (lanes, rows)

    def _failure_params(self, failed: list[tuple[QueuedRow, DeliveryFailure]]) -> dict[str, Any]:
        delays: list[float | None] = []
        for message, failure in failed:
            if failure.permanent:
                delays.append(None)
                self.dead += 1
            else:
                delays.append(self.config.backoff.delay(message.attempts + 1))
        return {
            "ids": [m.id for m, _ in failed],
            # Errors come from outside outbox (librdkafka, a bad row): storable text only.
            "errors": [storable(f.error) for _, f in failed],
            "delays": delays,
        }
