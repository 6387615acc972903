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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from outbox.core.batches import InboxBatch, Quarantined
from outbox.core.databases import Database, validate_schema
from outbox.core.errors import ConfigurationError
from outbox.core.numbers import check_fields
from outbox.core.redact import parse_conninfo
from outbox.core.retriable import refused_for_data
from outbox.core.text import first_line
from outbox.core.topics import validate_topic
from outbox.daemons.failpoints import failpoint
from outbox.daemons.outages import Outage
from outbox.daemons.relay import new_relay_id
from outbox.daemons.routing import Router, Routing
from outbox.observability.health import Heartbeat
from outbox.observability.runtime import Observability, ObservabilityConfig, observed
from outbox.ports import (
    InboxWriter,
    InboxWriters,
    InboxWriterSession,
    SubscriberFactory,
    TransportProbe,
    default_inbox_writers,
)

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
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    #: The topics of the Handlers registry this consumer feeds (`outbox consumer MODULE:ATTR`),
    #: or None: given, the consumer warns at start about a consumed topic no handler reads and
    #: a registered topic it does not consume.
    handled_topics: Sequence[str] | None = None
    #: The database's NAME in metrics and logs (default: its database name).
    database: str = ""
    #: Several databases, each record stored in its tenant's (outbox/daemons/routing.py), or
    #: None: every record in `database_url`'s inbox. With it, `database_url` is the quarantine
    #: database's.
    routing: Routing | None = None

    def __post_init__(self) -> None:
        if self.routing is not None:
            home = self.routing.home(self.routing.databases)
            object.__setattr__(self, "database_url", home.url)
            object.__setattr__(self, "database", home.name)
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        if not self.database:
            params = parse_conninfo(self.database_url) or {}
            object.__setattr__(self, "database", params.get("dbname") or "database")
        validate_schema(self.schema)
        if not self.topics:
            raise ConfigurationError("at least one --topic is required")
        for topic in (*self.topics, *(self.handled_topics or ())):
            validate_topic(topic)
        check_fields(
            self,
            {"batch_size": "poll_records", "poll_timeout": "seconds", "connect_timeout": "seconds"},
        )

    def topic_warnings(self) -> list[str]:
        """What is wrong between the consumed topics and the registry's, one line each."""
        if self.handled_topics is None:
            return []
        handled = set(self.handled_topics)
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


#: The inbox store when the wiring gives none: PostgreSQL's, loaded by name when first needed
#: (outbox.transports and the CLI pass it; this keeps `Consumer(config, subscribers)` working
#: without the daemons depending on the adapter).
def default_inbox() -> InboxWriters:
    """The inbox writers of the wiring's default (PostgreSQL's, set by outbox/__init__.py)."""
    return default_inbox_writers()


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

    `subscriber_factory` makes the transport's `Subscriber` (called once per `run`, in the
    running thread); `transport` says how to check that the transport is reachable, when it
    can be; `inbox` makes the store of each database (default: PostgreSQL's). The wiring
    (outbox.transports, the CLI) chooses them.
    """

    def __init__(
        self,
        config: ConsumerConfig,
        subscriber_factory: SubscriberFactory,
        transport: TransportProbe | None = None,
        *,
        inbox: InboxWriters | None = None,
    ) -> None:
        self.config = config
        self.inbox: InboxWriters = inbox if inbox is not None else default_inbox()
        #: The inbox of `config.database_url` (with routing: the quarantine database's).
        self.writer: InboxWriter = self.inbox(
            config.database_url, config.schema, connect_timeout=config.connect_timeout
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
            config,
            heartbeat=self.heartbeat,
            relay_id=new_relay_id(),
            transport=transport,
            # Routing over several databases: its series labelled by database, all listed.
            databases=None
            if config.routing is None
            else functools.partial(_databases, config.routing),
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
        schema (waiting for the database first if `--wait-for-database`)."""
        self.writer.check(
            wait=self.config.observability.wait_for_database,
            stopping=lambda: self.stopping,
            attempt=self.heartbeat.beat,
        )
        if self._transport is not None:
            self._transport.check(self.config.connect_timeout)

    @observed
    def run(self) -> None:
        """Check, subscribe, and store batches until `stop()`."""
        if self.config.routing is not None:
            self._route(self.config.routing)
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
        config = self.config
        source = "" if config.handled_topics is None else " (checked against the registry)"
        if config.handled_topics is not None and set(config.topics) == set(config.handled_topics):
            source = " (the registered topics of the handlers)"
        log.info(
            "consumer group %s consumes %s%s",
            config.group,
            ", ".join(config.topics),
            source,
            extra={"event": "consumer.topics"},
        )
        for warning in config.topic_warnings():
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
            batch.topical(), stored, dead, database=self.config.database
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
