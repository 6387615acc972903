"""The Producer relay: `producer_queue` -> the transport (Kafka, the PostgreSQL log, memory).

Contract: a row is deleted only after its delivery report succeeded, so a crash at any point
re-sends at most the batch in hand (at-least-once; the inbox removes duplicates). Lanes, wake-ups
and reconnects are those of `LaneRelay`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from outbox import tracing
from outbox.core.batches import OutgoingRecord, stored_message
from outbox.core.databases import Database
from outbox.core.envelope import StoredMessage
from outbox.core.errors import InvalidHeaders, InvalidTopic
from outbox.core.lanes import LANES
from outbox.core.numbers import check_fields
from outbox.core.retriable import retriable
from outbox.core.retry import Backoff
from outbox.core.text import storable
from outbox.core.topics import validate_topic
from outbox.daemons.compat import refuse_moved, refuse_unwired
from outbox.daemons.failpoints import failpoint
from outbox.daemons.relay import LaneRelay, new_relay_id, relay_target
from outbox.daemons.turns import Turns
from outbox.observability.runtime import Observability, Observer, observed
from outbox.ports import (
    DeliveryFailure,
    FetchedRows,
    OutboxSession,
    Publisher,
    PublisherFactory,
    RelayStores,
    TransportProbe,
)

log = logging.getLogger("outbox.producer")

#: While a backlog keeps batches full, each fetch asks for twice the rows of the last one, up
#: to this many times `batch_size`: fewer round trips to PostgreSQL and Kafka per message. A
#: batch that comes back short (the backlog is drained) goes back to `batch_size`.
BUSY_BATCH_FACTOR = 8


@dataclass(frozen=True)
class ProducerConfig:
    """The tuning of one Producer relay; validated at construction. Where it relays from and
    to is the composition root's (`outbox.runtime.Settings`)."""

    batch_size: int = 1000
    poll_interval: float = 1.0
    rebalance_interval: float = 2.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=30.0))
    connect_timeout: float = 10.0
    relay_id: str = field(default_factory=new_relay_id)

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        refuse_moved(cls, args, kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_fields(
            self,
            {
                "batch_size": "count",
                "poll_interval": "seconds",
                "rebalance_interval": "seconds",
                "connect_timeout": "seconds",
            },
        )


def _hopeless(row: OutgoingRecord, failure: DeliveryFailure) -> DeliveryFailure:
    """`failure`, made permanent if the row's topic is a name Kafka never accepts (librdkafka
    reports an unknown topic, which a retry could fix for a legal name: it may be created)."""
    if failure.permanent:
        return failure
    try:
        validate_topic(row.topic)
    except InvalidTopic as exc:
        return DeliveryFailure(error=storable(f"{failure.error}; {exc}"), permanent=True)
    return failure


def one_topic_per_key(rows: list[OutgoingRecord]) -> list[OutgoingRecord]:
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


class SharedPublisher:
    """One transport publisher for the Producer relays of several databases in one process.

    The publishers are not made for concurrent calls (a Kafka publisher keeps one batch's
    delivery slots; the log's holds one connection), so `publish` calls take turns, first come
    first served. A failure of the publisher that retrying cannot fix is the process's: it goes
    to `on_fatal` (the supervisor stops), and is raised to the caller too. A failure of the
    caller's own `meanwhile` (its database) is only raised.
    """

    def __init__(self, publisher: Publisher, on_fatal: Callable[[BaseException], None]) -> None:
        self.publisher = publisher
        self._on_fatal = on_fatal
        #: The publisher's turns, first come first served.
        self.turns = Turns(1)

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        failed: list[BaseException] = []
        if meanwhile is not None:
            inner = meanwhile

            def meanwhile() -> None:
                try:
                    inner()
                except BaseException as exc:
                    failed.append(exc)
                    raise

        with self.turns.turn():
            try:
                return self.publisher.publish(records, meanwhile)
            except Exception as exc:
                if not failed and not retriable(exc):
                    self._on_fatal(exc)
                raise

    def close(self) -> None:
        self.publisher.close()


class Producer(LaneRelay[OutgoingRecord, OutboxSession]):
    """Relays committed rows of `producer_queue` to a transport until asked to stop.

    `publisher_factory` makes the transport's `Publisher` (called once per `run`, in the running
    thread); `transport` says how to check that the transport is reachable (at start and in
    the health checks), when it can be; `stores` how to reach the queue of `database`;
    `observer` how it is observed. The composition root (`outbox.runtime.App`) chooses them.
    """

    kind = "producer"

    def __init__(
        self,
        config: ProducerConfig,
        publisher_factory: PublisherFactory,
        transport: TransportProbe | None = None,
        *,
        stores: RelayStores | None = None,
        database: Database | None = None,
        observer: Observer | None = None,
    ) -> None:
        refuse_unwired(type(self), stores=stores, database=database)
        assert stores is not None and database is not None
        target = relay_target(database, self.kind, config.relay_id, config.connect_timeout)
        super().__init__(
            database=stores.outbox(target),
            poll_interval=config.poll_interval,
            rebalance_interval=config.rebalance_interval,
            relay_id=config.relay_id,
        )
        self.config = config
        self._publisher_factory = publisher_factory
        self._transport = transport
        self._publisher: Publisher | None = None
        #: The next batch, fetched while the previous one was on its way to the transport:
        #: (lanes, limit, rows) while its statement runs, then (lanes, rows) until `fetch`
        #: takes it.
        self._next: tuple[list[int], int, FetchedRows[OutgoingRecord]] | None = None
        #: Rows the next fetch asks for (see BUSY_BATCH_FACTOR).
        self._limit = config.batch_size
        self._fetched: tuple[list[int], list[OutgoingRecord]] | None = None
        #: When (`time.monotonic()`) to next move the scheduled rows of the lanes that fell due
        #: into the queue (`_promote`), and the lanes it was computed for.
        self._promote_at = 0.0
        self._promote_lanes: list[int] = []
        #: Scheduled messages moved into the queue when they fell due.
        self.promoted = 0
        #: Counters for tests and logs: rows relayed, failed deliveries, rows marked dead.
        self.relayed = 0
        self.failed = 0
        self.dead = 0
        self.observability = Observability(
            "producer",
            observer or Observer(),
            tuning=config,
            heartbeat=self.heartbeat,
            relay_id=config.relay_id,
            database=database,
            transport=transport,
            lanes=lambda: len(self.lanes),
        )
        self.observability.health.watch(self.outage.trouble)

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or transport or an old
        schema (waiting for the database first if `--wait-for-database`)."""
        self.check_database(self.observability.config.wait_for_database)
        if self._transport is not None:
            self._transport.check(self.config.connect_timeout)

    @observed
    def run(self) -> None:
        """Check, then relay until `stop()`."""
        self.check()
        self._publisher = self._publisher_factory()
        try:
            self.serve_forever()
        finally:
            self._publisher.close()
            self._log_stopped()

    def serve_database(self, publisher: Publisher) -> None:
        """Relay through `publisher` (shared, not closed here) until `stop()`, the database
        checked: what a supervisor of several databases runs in each database's thread."""
        self._publisher = publisher
        try:
            self.serve_forever()
        finally:
            self._log_stopped()

    def _log_stopped(self) -> None:
        log.info(
            "%sproducer stopped: relayed=%d failed=%d dead=%d",
            self.observability.where(),
            self.relayed,
            self.failed,
            self.dead,
        )

    def _serve(self, conn: OutboxSession) -> None:
        # A new connection: a batch fetched on the previous one may have been sent meanwhile
        # by the relay that held the lanes while this one was away.
        self._next = self._fetched = None
        self._promote_at = 0.0
        super()._serve(conn)

    def _promote(self, conn: OutboxSession, lanes: list[int]) -> int:
        """Move the scheduled messages of `lanes` that fell due into the queue, when one can
        have (decision 21): at the due time of the earliest the last look saw, at least every
        poll interval (a message scheduled since, due sooner, is seen then: its send does not
        wake the relay), at once after a full move or when the lanes changed. A message moved
        now is fetched by the next look."""
        now = time.monotonic()
        if now < self._promote_at and lanes == self._promote_lanes:
            return 0
        limit = self.config.batch_size
        moved, due = conn.promote(lanes, limit)
        if moved:
            failpoint("producer.after_promote")
        self.promoted += moved
        self._promote_lanes = lanes
        if moved >= limit:
            self._promote_at = now
        elif due is None:
            self._promote_at = now + self.poll_interval
        else:
            self._promote_at = now + min(self.poll_interval, max(due, 0.0))
        return moved

    def wake_in(self) -> float | None:
        return self._promote_at - time.monotonic() if self.lanes else None

    def fetch(self, conn: OutboxSession, lanes: list[int]) -> list[OutgoingRecord]:
        fetched, self._fetched = self._fetched, None
        if self._promote(conn, lanes):
            # A batch fetched during the previous one was read before these rows were moved:
            # fetch again, or they would wait for the next look (up to a poll interval when
            # nothing else falls due: benchmarks' delayed lateness, max 1 s).
            fetched = None
        if fetched is not None and fetched[0] == lanes:
            return one_topic_per_key(fetched[1])  # fetched during the previous batch
        limit = self._limit
        rows = conn.fetch(lanes, limit, []).fetchall()
        self._resize(len(rows), limit)
        return one_topic_per_key(rows)

    def shared_turns(self) -> list[Turns]:
        turns = super().shared_turns()
        if isinstance(self._publisher, SharedPublisher):
            turns.append(self._publisher.turns)
        return turns

    def peek(self, conn: OutboxSession) -> bool:
        if conn.fetch(list(range(LANES)), 1, []).fetchone() is not None:
            return True
        due = conn.promote(list(range(LANES)), 0)[1]  # moves nothing: the lanes are not ours
        return due is not None and due <= 0

    def _resize(self, fetched: int, limit: int) -> None:
        """The next fetch's size: doubled after a full batch, `batch_size` after a short one."""
        batch_size = self.config.batch_size
        if fetched >= limit and not self.contended():
            self._limit = min(2 * limit, BUSY_BATCH_FACTOR * batch_size)
        else:
            self._limit = batch_size

    def next_due(self, conn: OutboxSession, lanes: list[int]) -> float | None:
        return conn.next_due(lanes)

    def process(self, conn: OutboxSession, rows: Sequence[OutgoingRecord]) -> None:
        failpoint("producer.before_produce")
        started = time.monotonic()
        self._next = None
        rows = list(rows)
        # Only rows with user headers can carry a trace context, and only they can fail to
        # become a record before the transport sees them (headers written by hand, not in
        # outbox's form): such a row fails permanently, alone, and goes dead; the batch goes on.
        traced: list[tuple[int, StoredMessage]] = []
        unsendable: dict[int, DeliveryFailure] = {}
        for i, row in enumerate(rows):
            if row.headers is not None:
                try:
                    traced.append((i, stored_message(row)))
                except InvalidHeaders as exc:
                    unsendable[i] = DeliveryFailure(error=storable(str(exc)), permanent=True)
        sendable = rows
        if unsendable:
            sendable = [row for i, row in enumerate(rows) if i not in unsendable]
        # Pipeline mode: the next batch is fetched while this one is on its way to the
        # transport, and the rows are deleted (below, once acknowledged) in the same round trip.
        with conn.pipeline():
            with tracing.publish_spans([message for _, message in traced]) as spans:
                results = self._publish(conn, rows, sendable)
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
                conn.delete([row.id for row in rows])
                if self._next is None:
                    # A short batch (no fetch ran while it was on its way): the next fetch
                    # goes in the same round trip as the delete.
                    self._fetch_ahead(conn, exclude=[])
            else:
                delivered = [row.id for row, r in zip(rows, results, strict=True) if r is None]
                with conn.transaction():
                    if delivered:
                        conn.delete(delivered)
                    self._fail(conn, failed)
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
        self, conn: OutboxSession, rows: list[OutgoingRecord], sendable: Sequence[OutgoingRecord]
    ) -> list[DeliveryFailure | None]:
        """Publish `sendable` (the rows of `rows` that can be sent).

        A full batch (a backlog): the next batch is fetched while this one is handed to the
        transport and on its way; the fetch is sent first, so that PostgreSQL runs it while
        the relay produces (it excludes this batch's ids, so when it runs changes nothing it
        finds). A short one (the queue was drained): the next fetch goes with its delete, in
        one round trip; a fetch while it is on its way would mostly find nothing yet. (Taking
        in the rows committed while a short batch is on its way, by fetching every
        millisecond, was tried and measured: no earlier at Kafka, later end to end at
        500-1,000/s for the CPU it took; docs/performance.md.)
        """
        publisher = self._publisher
        assert publisher is not None
        if len(rows) >= self.config.batch_size:
            self._fetch_ahead(conn, [row.id for row in rows])
        return publisher.publish(sendable)

    def failures(self) -> int:
        return self.failed

    def _fetch_ahead(self, conn: OutboxSession, exclude: list[int]) -> None:
        """Start fetching the next batch (less the ids in `exclude`), for `_keep_next`."""
        if not self.stopping:
            lanes, limit = sorted(self.lanes), self._limit
            self._next = (lanes, limit, conn.fetch(lanes, limit, exclude))

    def _keep_next(self, failed: list[tuple[OutgoingRecord, DeliveryFailure]]) -> None:
        """Keep the batch fetched during this one for `fetch`, less the keys that now wait for a
        retry: it was fetched before this batch's failures were recorded."""
        if self._next is None:
            return
        lanes, limit, fetched = self._next
        self._next = None
        rows = fetched.fetchall()
        self._resize(len(rows), limit)
        waiting = {row.key for row, f in failed if not f.permanent and row.key is not None}
        if waiting:
            rows = [row for row in rows if row.key not in waiting]
        self._fetched = (lanes, rows)

    def _fail(
        self, conn: OutboxSession, failed: list[tuple[OutgoingRecord, DeliveryFailure]]
    ) -> None:
        delays: list[float | None] = []
        for message, failure in failed:
            if failure.permanent:
                delays.append(None)
                self.dead += 1
            else:
                delays.append(self.config.backoff.delay(message.attempts + 1))
        conn.fail(
            [m.id for m, _ in failed],
            # Errors come from outside outbox (the transport, a bad row): storable text only.
            [storable(f.error) for _, f in failed],
            delays,
        )
