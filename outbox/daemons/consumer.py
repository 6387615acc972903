"""The Consumer relay: the transport -> `consumer_queue`.

Contract: a batch of records is inserted into the inbox in one transaction (idempotent on the
message id), and only after that transaction committed are the Kafka offsets committed. A crash
in between redelivers the batch, and the unique message id stores it once. The daemon reads
through a `Subscriber` (outbox.ports): Kafka, the PostgreSQL log or the in-memory one, and
stores through an `InboxWriter` (outbox.ports): PostgreSQL's, or an in-memory one in tests.

No record can stop the Consumer: a record that cannot be an ordinary row (a header name
PostgreSQL cannot hold, a content type that is not storable text) is quarantined, stored dead
with its raw bytes and the reason. If PostgreSQL refuses a batch for its data all the same,
the batch is split in halves until the refused record is alone; the others are stored as
usual, that one is quarantined. Offsets are committed only after all of it is stored.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

from outbox.core.batches import InboxBatch, Quarantined
from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError
from outbox.core.numbers import check_fields
from outbox.core.retriable import refused_for_data
from outbox.core.text import first_line
from outbox.core.topics import validate_topic
from outbox.daemons.compat import refuse_moved, refuse_unwired
from outbox.daemons.failpoints import failpoint
from outbox.daemons.outages import Outage
from outbox.daemons.relay import new_relay_id
from outbox.daemons.routing import Router, Routing
from outbox.observability.health import Heartbeat
from outbox.observability.runtime import Observability, Observer, observed
from outbox.ports import (
    InboxWriter,
    InboxWriters,
    InboxWriterSession,
    SubscriberFactory,
    TransportProbe,
)

log = logging.getLogger("outbox.consumer")


@dataclass(frozen=True)
class ConsumerConfig:
    """The tuning of one Consumer relay; validated at construction. What it reads and where it
    stores is the composition root's (`outbox.runtime.Settings`)."""

    batch_size: int = 1000
    poll_timeout: float = 0.2
    connect_timeout: float = 10.0

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        refuse_moved(cls, args, kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_fields(
            self,
            {"batch_size": "poll_records", "poll_timeout": "seconds", "connect_timeout": "seconds"},
        )


@dataclass(frozen=True)
class Subscription:
    """What a Consumer reads: `topics`, as a member of consumer group `group`; `handled`: the
    topics of the Handlers registry it feeds (`outbox consumer MODULE:ATTR`), or None. Given,
    the consumer warns at start about a consumed topic no handler reads and a registered topic
    it does not consume."""

    group: str
    topics: Sequence[str]
    handled: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not self.group:
            raise ConfigurationError("the consumer needs a group (--group)")
        if not self.topics:
            raise ConfigurationError("at least one --topic is required")
        for topic in (*self.topics, *(self.handled or ())):
            validate_topic(topic)

    def warnings(self) -> list[str]:
        """What is wrong between the consumed topics and the registry's, one line each."""
        if self.handled is None:
            return []
        handled = set(self.handled)
        consumed = set(self.topics)
        return [
            f"topic {topic!r} is consumed but no handler of the registry reads it: its "
            "messages go dead at once"
            for topic in self.topics
            if topic not in handled
        ] + [
            f"topic {topic!r} has a handler but this consumer does not consume it: unless "
            "another consumer stores its messages, its handler waits forever"
            for topic in sorted(handled - consumed)
        ]


class _Refused(Exception):
    """The database refused a statement for its data (not for a lost connection); `session`
    is the session it ran on, still usable."""

    def __init__(self, error: BaseException, session: InboxWriterSession) -> None:
        super().__init__(str(error))
        self.error = error
        self.session = session


class _Stopped(Exception):
    """The consumer was stopped while it waited to retry a statement: nothing committed."""


class Consumer:
    """Stores the records of a transport in `consumer_queue` until asked to stop.

    `subscriber_factory` makes the transport's `Subscriber` of `subscription` (called once per
    `run`, in the running thread); `transport` says how to check that the transport is
    reachable, when it can be; `inbox` makes the store of a database: of `database`, or with
    `routing` of each database routed to; `observer` how it is observed. The composition root
    (`outbox.runtime.App`) chooses them.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        subscriber_factory: SubscriberFactory,
        transport: TransportProbe | None = None,
        *,
        subscription: Subscription | None = None,
        inbox: InboxWriters | None = None,
        database: Database | None = None,
        routing: Routing | None = None,
        observer: Observer | None = None,
    ) -> None:
        if routing is not None:
            database = routing.home(routing.databases)
        refuse_unwired(type(self), subscription=subscription, inbox=inbox, database=database)
        assert subscription is not None and inbox is not None and database is not None
        self.config = config
        self.subscription = subscription
        self.routing = routing
        self.inbox: InboxWriters = inbox
        #: The database stored in (with routing: the quarantine database).
        self.database = database
        self.writer: InboxWriter = self.inbox(
            database.url, database.schema, connect_timeout=config.connect_timeout
        )
        self._subscriber_factory = subscriber_factory
        self._transport = transport
        self._stop = threading.Event()
        #: Counters for tests and logs: records received, rows stored (not duplicates).
        self.received = 0
        self.stored = 0
        #: Records stored dead because they cannot be ordinary rows (not counted in `stored`).
        self.quarantined = 0
        #: Beaten every turn of the loop and every connection attempt (for /livez).
        self.heartbeat = Heartbeat()
        #: The inserts' run of failures that retrying can fix (for their logs and /readyz).
        self._outage = Outage("cannot store a batch in PostgreSQL", log)
        #: The reads' run of failures that retrying can fix (a transport's retriable error).
        self._reading = Outage("cannot read from the transport", log)
        self.observability = Observability(
            "consumer",
            observer or Observer(),
            tuning=config,
            heartbeat=self.heartbeat,
            relay_id=new_relay_id(),
            database=database,
            transport=transport,
            # Routing over several databases: its series labelled by database, all listed.
            databases=None if routing is None else functools.partial(_databases, routing),
        )
        self.observability.health.watch(self._outage.trouble)
        self.observability.health.watch(self._reading.trouble)

    def stop(self) -> None:
        """Ask the consumer to store and commit the batch in hand, then return from `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _connect(self) -> InboxWriterSession:
        self.heartbeat.beat()
        return self.writer.connect()

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or transport or an old
        schema (waiting for the database first if `--wait-for-database`). Routing over several
        databases, only the transport: a database that fails is that database's problem
        (outbox/daemons/routing.py)."""
        if self.routing is None:
            self.writer.check(
                wait=self.observability.config.wait_for_database,
                stopping=lambda: self.stopping,
                attempt=self.heartbeat.beat,
            )
        if self._transport is not None:
            self._transport.check(self.config.connect_timeout)

    @observed
    def run(self) -> None:
        """Check, subscribe, and store batches until `stop()`."""
        if self.routing is not None:
            self._route(self.routing)
            return
        self.check()
        self._announce()
        subscriber = self._subscriber_factory()
        session: InboxWriterSession | None = None
        batch = InboxBatch()

        def waiting() -> InboxBatch:
            """The records already there (no wait), taken while a batch is being stored."""
            if self.stopping:
                return InboxBatch()
            return subscriber.poll(self.config.batch_size, 0)

        try:
            while not self.stopping:
                self.heartbeat.beat()
                if not batch:
                    try:
                        batch = subscriber.poll(self.config.batch_size, self.config.poll_timeout)
                    except Exception as exc:
                        delay = self._reading.failed(exc)  # raises what retrying cannot fix
                        self._reading.pause(delay, self._stop, self.heartbeat.beat)
                        continue
                    self._reading.recovered()
                    if not batch:
                        continue
                # A full batch: while it is stored, the records waiting behind it are taken.
                # A short one: nothing is likely to wait yet, and the look would cost the log
                # transport a round trip per batch (as the Producer, outbox/daemons/producer.py).
                full = len(batch) >= self.config.batch_size
                session, following = self._store(
                    session, batch, meanwhile=waiting if full else None
                )
                if session is None:
                    break  # stopped while the database was unreachable: nothing committed
                failpoint("consumer.after_insert")
                subscriber.commit(batch)
                # Records polled but not stored are never committed: if the consumer stops
                # before storing them, they are delivered again.
                batch = following
        finally:
            subscriber.close()
            if session is not None:
                session.close()
            log.info(
                "consumer stopped: received=%d stored=%d quarantined=%d",
                self.received,
                self.stored,
                self.quarantined,
            )

    def _route(self, routing: Routing) -> None:
        """Several databases: check the transport, then route (outbox/daemons/routing.py). A
        database that fails is logged and retried, not fatal."""
        if self._transport is not None:
            self._transport.check(self.config.connect_timeout)
        self._announce()
        router = Router(self, routing, self._subscriber_factory, self.inbox)
        router.check()
        router.run()

    def _announce(self) -> None:
        """Say at start what is consumed, and what does not match the registry's topics."""
        subscription = self.subscription
        handled = subscription.handled
        source = "" if handled is None else " (checked against the registry)"
        if handled is not None and set(subscription.topics) == set(handled):
            source = " (the registered topics of the handlers)"
        log.info(
            "consumer group %s consumes %s%s",
            subscription.group,
            ", ".join(subscription.topics),
            source,
            extra={"event": "consumer.topics"},
        )
        for warning in subscription.warnings():
            log.warning(warning, extra={"event": "consumer.topic_mismatch"})

    def _store(
        self,
        session: InboxWriterSession | None,
        batch: InboxBatch,
        meanwhile: Callable[[], InboxBatch] | None = None,
    ) -> tuple[InboxWriterSession | None, InboxBatch]:
        """Insert the batch, retrying through database outages; (None, ...) if stopped
        meanwhile. While the database works on it, `meanwhile()` is called (once): its result
        is returned beside the session."""
        quarantined = list(batch.quarantined)
        following: list[InboxBatch] = []

        def fetch_following() -> None:
            if meanwhile is not None and not following:
                following.append(meanwhile())

        try:
            try:
                session, stored = self._execute(session, lambda s: s.insert(batch, fetch_following))
            except _Refused as refused:  # some record's data: find it
                session, stored = self._bisect(refused.session, batch, refused.error, quarantined)
            dead: Counter[str] = Counter()
            if quarantined:
                session, dead = self._execute(session, lambda s: s.quarantine(quarantined))
        except _Stopped:
            return None, following[0] if following else InboxBatch()
        for record in quarantined:
            log.warning(
                "record topic %r partition %d offset %d quarantined (stored dead): %s",
                record.topic,
                record.partition,
                record.offset,
                record.reason,
                extra={"topic": record.topic, "event": "consumer.quarantined"},
            )
        self.received += len(batch)
        self.stored += stored.total()
        self.quarantined += dead.total()
        self.observability.consumer_batch(
            batch.topical(), stored, dead, database=self.database.name
        )
        return session, following[0] if following else InboxBatch()

    def _execute(
        self,
        session: InboxWriterSession | None,
        statement: Callable[[InboxWriterSession], Counter[str]],
    ) -> tuple[InboxWriterSession, Counter[str]]:
        """Run one statement of the inbox (atomic on its own), retrying what retrying can fix
        (decision 15) with backoff; the rows it stored per topic. `_Refused` when the
        database (or its driver, binding the values) refuses the data; `_Stopped` when stopped
        while retrying; anything else retrying cannot fix is raised."""
        while True:
            try:
                if session is None or not session.usable:
                    if session is not None:
                        session.close()
                    session = self._connect()
                stored = statement(session)
            except Exception as exc:
                if session is not None and session.usable and refused_for_data(exc):
                    raise _Refused(exc, session) from exc
                delay = self._outage.failed(exc)  # raises what retrying cannot fix
                if self.stopping:
                    raise _Stopped from exc
                self._outage.pause(delay, self._stop, self.heartbeat.beat)
                if self.stopping:
                    raise _Stopped from exc
                continue
            self._outage.recovered()
            return session, stored

    def _bisect(
        self,
        session: InboxWriterSession | None,
        batch: InboxBatch,
        error: BaseException,
        quarantined: list[Quarantined],
    ) -> tuple[InboxWriterSession | None, Counter[str]]:
        """Store the records of a batch the database refused (`error`): halves are inserted on
        their own, a refused half is split again, and a record refused alone is appended to
        `quarantined` with the refusal as its reason. Returns the rows stored per topic."""
        size = batch.ordinary
        stored: Counter[str] = Counter()
        if size == 0:
            return session, stored
        if size == 1:
            reason = f"PostgreSQL refused the record: {first_line(error)}"
            quarantined.append(batch.quarantine(0, reason))
            return session, stored
        half = size // 2
        for start, stop in ((0, half), (half, size)):
            part = batch.part(start, stop)
            try:
                insert = functools.partial(_insert, batch=part)
                session, more = self._execute(session, insert)
                stored.update(more)
            except _Refused as refused:
                session, more = self._bisect(refused.session, part, refused.error, quarantined)
                stored.update(more)
        return session, stored


def _insert(session: InboxWriterSession, batch: InboxBatch) -> Counter[str]:
    return session.insert(batch)


def _databases(routing: Routing) -> Sequence[Database]:
    """The databases a routing consumer serves (for its start-up line)."""
    return routing.databases
