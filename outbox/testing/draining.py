"""`drain()`: run the relay and the handler in this process until the queues are empty.

For tests of a service's handlers: send in a transaction, `drain(...)`, assert the effect. It
runs the real daemons (the `Producer`, the `Consumer` and the `HandlerRunner`, each in a thread
of this process) over a real Kafka broker, the log kept in PostgreSQL (`PostgresLog`, or a
`postgresql://` URL) or an `InMemoryTransport`, and stops them once

- `producer_queue` (of every sending database) has no row to send now,
- the transport holds nothing the Consumer has not stored (every message the Producer relayed
  to a handled topic is stored; with the in-memory transport and the PostgreSQL log: the
  group's lag on the handled topics is 0 as well),
- `consumer_queue` has no pending row that is due,

twice in a row with nothing happening in between. Rows waiting for a later retry are left
alone unless `wait_for_retries`; dead rows are reported, not raised.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from uuid import UUID

import psycopg

from outbox import transports
from outbox.core.batches import InboxBatch, OutgoingRecord
from outbox.core.databases import parse_entry
from outbox.core.errors import ConfigurationError
from outbox.core.handlers import Handlers
from outbox.pglog import DEFAULT_PARTITIONS
from outbox.pglog.log import DEFAULT_SCHEMA as DEFAULT_LOG_SCHEMA
from outbox.pglog.log import queries as log_queries
from outbox.ports import (
    DeliveryFailure,
    Publisher,
    PublisherFactory,
    Subscriber,
    SubscriberFactory,
)
from outbox.postgres.operations import error_summary
from outbox.postgres.queries import queries, validate_schema
from outbox.runtime import (
    App,
    ConsumerConfig,
    Databases,
    HandlerConfig,
    ProducerConfig,
    Settings,
)
from outbox.testing.memory import InMemoryTransport
from outbox.transports import TransportSettings

__all__ = ["DeadLetter", "DrainResult", "DrainTimeout", "PostgresLog", "drain"]

#: Pause between two looks at the queues.
CHECK_INTERVAL = 0.02


class DrainTimeout(AssertionError):
    """`drain` did not empty the queues in time; the message lists what remains."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead row, with the first line of its last error: in `producer_dead` (the outbox's dead
    rows, `outbox dead-letters --queue producer`) or `consumer_queue` (the inbox's)."""

    queue: Literal["producer_dead", "consumer_queue"]
    message_id: UUID
    topic: str
    error: str

    def __str__(self) -> str:
        return f"{self.queue}: message {self.message_id} topic {self.topic!r}: {self.error}"


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What one `drain` did, and the dead rows it found at the end."""

    #: Messages the Producer delivered to the transport.
    relayed: int
    #: New rows the Consumer stored in `consumer_queue` (redeliveries not counted).
    stored: int
    #: Callbacks that ran and committed.
    handled: int
    #: Failed callback attempts (retried later, or dead).
    failed: int
    #: Dead rows in the queues at the end (also those from before this drain).
    dead: tuple[DeadLetter, ...] = ()
    #: Rows left waiting for a retry that was not yet due (see `wait_for_retries`).
    retrying: int = 0
    #: Topics messages were relayed to that no handler of the registry reads (a misspelt
    #: topic, say): those messages are not stored by this drain's Consumer.
    unhandled_topics: tuple[str, ...] = ()


# -- the transport, wrapped to know what was relayed and what was stored -----------------------


@dataclass(frozen=True, slots=True)
class PostgresLog:
    """The log kept in PostgreSQL (`outbox.pglog`) as drain's transport: the log database's
    URL, its schema (migrated: `outbox migrate --log-url URL`, or `outbox.pglog.log.upgrade`)
    and the partitions of the topics the relay creates on first publish."""

    url: str
    schema: str = DEFAULT_LOG_SCHEMA
    partitions: int = DEFAULT_PARTITIONS

    def __repr__(self) -> str:  # the URL may hold a password
        return f"PostgresLog(schema={self.schema!r}, partitions={self.partitions})"


#: What `drain` accepts as its transport: a Kafka bootstrap address, the log, the in-memory
#: transport, or any registered transport with its options (`outbox.transports.settings_of`).
Transport = str | InMemoryTransport | PostgresLog | TransportSettings

#: How many records of the ledger's topics a group has not committed (0: none, or unknown).
_Unconsumed = Callable[[str, frozenset[str]], int]

_LOG_URL_PREFIXES = ("postgresql://", "postgres://")


def as_transport(transport: Transport) -> Transport:
    """A `postgresql://` URL string becomes `PostgresLog(url)`; anything else is unchanged."""
    if isinstance(transport, str) and transport.startswith(_LOG_URL_PREFIXES):
        return PostgresLog(transport)
    return transport


@dataclass
class _Ledger:
    """Ids (as text) of the messages relayed to the handled topics, and of those stored."""

    topics: frozenset[str]
    relayed: set[str] = field(default_factory=set)
    stored: set[str] = field(default_factory=set)
    polled: int = 0
    #: Topics relayed to that the handlers do not read.
    unhandled: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def outstanding(self) -> int:
        """Relayed messages not stored yet, and polled batches not committed yet."""
        with self.lock:
            return len(self.relayed - self.stored) + self.polled


class _LedgerPublisher:
    """A `Publisher` that notes the acknowledged messages of the handled topics."""

    def __init__(self, inner: Publisher, ledger: _Ledger) -> None:
        self._inner = inner
        self._ledger = ledger

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        results = self._inner.publish(records, meanwhile)
        ledger = self._ledger
        with ledger.lock:
            for m, r in zip(records, results, strict=True):
                if r is not None:
                    continue
                if m.topic in ledger.topics:
                    ledger.relayed.add(m.message_id)
                else:
                    ledger.unhandled.add(m.topic)
        return results

    def close(self) -> None:
        self._inner.close()


class _LedgerSubscriber:
    """A `Subscriber` that notes the messages whose storage was committed."""

    def __init__(self, inner: Subscriber, ledger: _Ledger) -> None:
        self._inner = inner
        self._ledger = ledger

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        batch = self._inner.poll(max_records, timeout)
        if batch:
            with self._ledger.lock:
                self._ledger.polled += 1
        return batch

    def commit(self, batch: InboxBatch) -> None:
        self._inner.commit(batch)
        with self._ledger.lock:
            self._ledger.stored.update(batch.message_ids)
            self._ledger.stored.update(q.message_id for q in batch.quarantined)
            self._ledger.polled -= 1

    def close(self) -> None:
        self._inner.close()


# -- looking at the queues ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Look:
    """What one look at the queues and the transport found still to do."""

    to_send: dict[str, int]
    unstored: int
    unconsumed: int
    due: int
    retrying: int
    samples: tuple[str, ...]
    dead: tuple[DeadLetter, ...]

    def idle(self, wait_for_retries: bool) -> bool:
        """Nothing left to do now (or, with `wait_for_retries`, ever)."""
        work = sum(self.to_send.values()) + self.unstored + self.unconsumed + self.due
        return work == 0 and (not wait_for_retries or self.retrying == 0)

    def describe(self) -> str:
        """What remains, one line each."""
        lines = [f"producer_queue of {db}: {n} rows to send" for db, n in self.to_send.items() if n]
        if self.unstored:
            lines.append(f"transport: {self.unstored} relayed messages not stored by the Consumer")
        if self.unconsumed:
            lines.append(f"transport: {self.unconsumed} records not committed by the group")
        if self.due:
            lines.append(f"consumer_queue: {self.due} pending rows due")
        if self.retrying:
            lines.append(f"{self.retrying} rows waiting for a retry")
        lines.extend(f"  {sample}" for sample in self.samples)
        lines.extend(f"dead: {d}" for d in self.dead)
        return "\n".join(lines) or "nothing (the daemons kept busy)"


class _Queues:
    """Autocommit connections that read the queues' state (never lock or change a row)."""

    def __init__(
        self,
        schema: str,
        producer_urls: Sequence[str],
        consumer_url: str,
        unordered_topics: list[str],
        log: PostgresLog | None = None,
    ) -> None:
        # The statements are postgres/sql/drain.sql's and pglog/sql/drain.sql's.
        self._sql = queries(schema)
        self._unordered = unordered_topics
        self._stack = ExitStack()
        self._log_sql = log_queries(log.schema) if log is not None else {}
        self._log = (
            self._stack.enter_context(psycopg.connect(log.url, autocommit=True))
            if log is not None
            else None
        )
        self._producers = [
            self._stack.enter_context(psycopg.connect(url, autocommit=True))
            for url in producer_urls
        ]
        self._consumer = self._stack.enter_context(psycopg.connect(consumer_url, autocommit=True))

    def close(self) -> None:
        self._stack.close()

    def look(self, ledger: _Ledger, lag: _Unconsumed, group: str) -> _Look:
        """Read producer_queues first, then the transport, then consumer_queue (causal order)."""
        to_send: dict[str, int] = {}
        retrying = 0
        samples: list[str] = []
        dead: list[DeadLetter] = []
        for conn in self._producers:
            row = conn.execute(self._sql["drain_producer_state"]).fetchone()
            assert row is not None
            to_send[conn.info.dbname] = int(row[0])
            retrying += int(row[1])
            dead.extend(self._dead(conn, "producer_dead"))
        unstored = ledger.outstanding()
        unconsumed = lag(group, ledger.topics)
        if self._log is not None:
            unconsumed += self._log_lag(group, ledger.topics)
        row = self._consumer.execute(
            self._sql["drain_consumer_state"], {"unordered": self._unordered}
        ).fetchone()
        assert row is not None
        due, retrying = int(row[0]), retrying + int(row[1])
        if due or row[1]:
            samples.extend(self._pending_samples())
        dead.extend(self._dead(self._consumer, "consumer_queue"))
        return _Look(to_send, unstored, unconsumed, due, retrying, tuple(samples), tuple(dead))

    def _log_lag(self, group: str, topics: frozenset[str]) -> int:
        assert self._log is not None
        row = self._log.execute(
            self._log_sql["log_drain_lag"], {"group": group, "topics": sorted(topics)}
        ).fetchone()
        return int(row[0]) if row else 0

    def _pending_samples(self, limit: int = 5) -> list[str]:
        rows = self._consumer.execute(
            self._sql["drain_pending_samples"], {"limit": limit}
        ).fetchall()
        return [
            f"consumer_queue: message {mid} topic {topic!r} attempts {attempts}"
            f" {'due' if due else 'waiting for a retry'}"
            + (f"; last error: {error_summary(error)}" if error else "")
            for mid, topic, attempts, due, error in rows
        ]

    def _dead(
        self, conn: psycopg.Connection[Any], table: Literal["producer_dead", "consumer_queue"]
    ) -> list[DeadLetter]:
        """The dead rows of `table` (every row of producer_dead is dead)."""
        statement = "drain_producer_dead" if table == "producer_dead" else "drain_consumer_dead"
        rows = conn.execute(self._sql[statement]).fetchall()
        return [DeadLetter(table, mid, topic, error_summary(error)) for mid, topic, error in rows]


# -- running the daemons -----------------------------------------------------------------------


class _Daemon(Protocol):
    def run(self) -> None: ...
    def stop(self) -> None: ...


class _Threads:
    """Daemons running in threads of this process; the first error of any is kept."""

    def __init__(self) -> None:
        self._running: list[tuple[_Daemon, threading.Thread]] = []
        self.errors: list[BaseException] = []

    def start(self, daemon: _Daemon, name: str) -> None:
        def target() -> None:
            try:
                daemon.run()
            except BaseException as exc:  # re-raised by drain in the caller's thread
                self.errors.append(exc)

        thread = threading.Thread(target=target, name=f"outbox-drain-{name}", daemon=True)
        thread.start()
        self._running.append((daemon, thread))

    def check(self) -> None:
        """Raise the first error of a daemon that died."""
        if self.errors:
            raise self.errors[0]

    def stop(self, timeout: float = 60.0) -> None:
        """Stop all (each finishes the batch in hand) and wait for them."""
        for daemon, _ in self._running:
            daemon.stop()
        for daemon, thread in self._running:
            thread.join(timeout)
            if thread.is_alive():
                raise DrainTimeout(f"{type(daemon).__name__} did not stop within {timeout:g}s")


@contextmanager
def _running(daemons: _Daemons) -> Iterator[_Threads]:
    """Run the daemons in threads; stop them on the way out, then raise a daemon's error."""
    threads = _Threads()
    try:
        for index, producer in enumerate(daemons.producers):
            threads.start(producer, f"producer-{index}")
        threads.start(daemons.consumer, "consumer")
        threads.start(daemons.runner, "handler")
        yield threads
    finally:
        threads.stop()
    threads.check()


# -- drain -------------------------------------------------------------------------------------


def _as_list(urls: str | Sequence[str] | None, default: str) -> list[str]:
    if urls is None:
        return [default]
    return [urls] if isinstance(urls, str) else list(urls)


def _settings(
    transport: Transport, group: str, producer_kafka_config: Mapping[str, str] | None
) -> tuple[TransportSettings, TransportSettings]:
    """The registry's settings of `transport`: the publishers', then the subscribers'."""
    if isinstance(transport, TransportSettings):
        return transport, transport
    if isinstance(transport, InMemoryTransport):
        found = transports.settings_of("memory", memory_transport=transport)
        return found, found
    if isinstance(transport, PostgresLog):
        found = transports.settings_of(
            "postgres",
            log_url=transport.url,
            log_schema=transport.schema,
            log_partitions=transport.partitions,
            log_rebalance_interval=0.2,
        )
        return found, found
    if not isinstance(transport, str) or not transport:
        raise ConfigurationError(
            "transport must be a Kafka bootstrap address (host:port), a PostgresLog (or a "
            "postgresql:// URL of the log database), an InMemoryTransport or the "
            f"TransportSettings of a registered transport, got {transport!r}"
        )
    return (
        transports.settings_of(
            "kafka", kafka_bootstrap=transport, kafka_config=producer_kafka_config or {}
        ),
        transports.settings_of("kafka", kafka_bootstrap=transport),
    )


def _factories(
    transport: Transport,
    ledger: _Ledger,
    group: str,
    producer_kafka_config: Mapping[str, str] | None,
    consumer_kafka_config: Mapping[str, str] | None,
) -> tuple[PublisherFactory, SubscriberFactory, _Unconsumed]:
    """Publisher and subscriber factories for the transport, both keeping `ledger`, made by
    the transport's registry entry; and how many records a group has not committed (read by
    the entry's lag reader; not on Kafka, whose commits the ledger tells)."""
    topics = sorted(ledger.topics)
    sending, receiving = _settings(transport, group, producer_kafka_config)
    if consumer_kafka_config and not isinstance(transport, TransportSettings):
        receiving = transports.settings_of(
            "kafka", kafka_bootstrap=transport, kafka_config=consumer_kafka_config
        )
    entry = transports.get(sending.name)
    options = transports.options(sending)
    entry.check(options, 0.0)  # one clear error: unreachable, or not migrated
    publishers, probe = entry.make_publishers(options)
    if probe is not None:
        probe.check(10.0)
    subscribers, _ = entry.make_subscribers(
        transports.options(receiving), group, topics, receiving.start
    )

    def unconsumed(group: str, topics: frozenset[str]) -> int:
        if isinstance(transport, str | PostgresLog):
            return 0  # the log's is read by _Queues; Kafka's commits follow the ledger
        reader = entry.lag_reader(options, 5.0)
        try:
            return sum(
                p.lag for g in reader.lag([group]) for p in g.partitions if p.topic in topics
            )
        finally:
            reader.close()

    return (
        lambda: _LedgerPublisher(publishers(), ledger),
        lambda: _LedgerSubscriber(subscribers(), ledger),
        unconsumed,
    )


def drain(
    handlers: Handlers,
    database_url: str,
    transport: Transport,
    *,
    producer_database_urls: str | Sequence[str] | None = None,
    schema: str = "outbox",
    group: str = "outbox-drain",
    timeout: float = 30.0,
    wait_for_retries: bool = False,
    producer_kafka_config: Mapping[str, str] | None = None,
    consumer_kafka_config: Mapping[str, str] | None = None,
) -> DrainResult:
    """Relay, consume and handle until the queues are empty; raise `DrainTimeout` if they do
    not get there within `timeout` seconds.

    `database_url` is the receiving service's database (its `consumer_queue`, where the
    `handlers` run); `producer_database_urls` the sending services' (default: the same one).
    `transport` is a Kafka bootstrap address, a `PostgresLog` (or the `postgresql://` URL of a
    migrated log database, schema `outbox_log`), an `InMemoryTransport`, or the
    `TransportSettings` of any registered transport (`outbox.transports.settings_of`). The
    Consumer reads
    the handlers' topics as consumer group `group`, from its committed offsets (the earliest
    record the first time). With `wait_for_retries`, rows waiting for a retry are waited for until
    they are handled or dead.
    """
    validate_schema(schema)
    if not isinstance(handlers, Handlers):
        raise ConfigurationError(
            f"drain needs an outbox.Handlers registry, got {type(handlers).__name__}"
        )
    if not len(handlers):
        raise ConfigurationError("drain needs a Handlers registry with at least one handler")
    transport = as_transport(transport)
    ledger = _Ledger(topics=frozenset(handlers.topics))
    publisher_factory, subscriber_factory, unconsumed = _factories(
        transport, ledger, group, producer_kafka_config, consumer_kafka_config
    )
    producer_urls = _as_list(producer_database_urls, database_url)
    # The real daemons, as the composition root builds them, over the ledger's factories.
    app = App(
        Settings(
            databases=Databases(fixed=(parse_entry(database_url, schema),), schema=schema),
            group=group,
            topics=tuple(handlers.topics),
            producer=ProducerConfig(poll_interval=0.1),
            consumer=ConsumerConfig(poll_timeout=0.05),
            handler=HandlerConfig(concurrency=1, poll_interval=0.1),
        ),
        handlers,
        publishers=publisher_factory,
        subscribers=subscriber_factory,
    )
    daemons = _Daemons(
        producers=[
            app.producer(parse_entry(url, schema, index=index))
            for index, url in enumerate(producer_urls)
        ],
        consumer=app.consumer(),
        runner=app.handler(),
    )
    log = transport if isinstance(transport, PostgresLog) else None
    queues = _Queues(schema, producer_urls, database_url, handlers.unordered_topics, log)
    try:
        with _running(daemons) as threads:
            look = _wait_idle(threads, queues, ledger, unconsumed, group, timeout, wait_for_retries)
    finally:
        queues.close()
    result = daemons.result(look)
    if ledger.unhandled:
        unhandled = tuple(sorted(ledger.unhandled))
        logging.getLogger("outbox.testing").warning(
            "drain relayed messages to %s, which no handler of the registry reads: they were "
            "not stored (a misspelt topic?)",
            ", ".join(repr(t) for t in unhandled),
        )
        result = dataclasses.replace(result, unhandled_topics=unhandled)
    return result


class _Relaying(_Daemon, Protocol):
    @property
    def relayed(self) -> int: ...


class _Storing(_Daemon, Protocol):
    @property
    def stored(self) -> int: ...


class _Handling(_Daemon, Protocol):
    @property
    def handled(self) -> int: ...
    @property
    def failed(self) -> int: ...


@dataclass
class _Daemons:
    """The real daemons a drain runs (built by `outbox.runtime.App`), and their counters."""

    producers: list[_Relaying]
    consumer: _Storing
    runner: _Handling

    def result(self, look: _Look) -> DrainResult:
        """The summary, from the daemons' counters and the last look at the queues."""
        return DrainResult(
            relayed=sum(p.relayed for p in self.producers),
            stored=self.consumer.stored,
            handled=self.runner.handled,
            failed=self.runner.failed,
            dead=look.dead,
            retrying=look.retrying,
        )


def _wait_idle(
    threads: _Threads,
    queues: _Queues,
    ledger: _Ledger,
    unconsumed: _Unconsumed,
    group: str,
    timeout: float,
    wait_for_retries: bool,
) -> _Look:
    """Look until two looks in a row find nothing to do; `DrainTimeout` past `timeout`.

    One idle look is not enough: a handler that commits between the look at producer_queue
    and the one at consumer_queue adds a message the first look missed; the second sees it.
    """
    deadline = time.monotonic() + timeout
    idle_before = False
    while True:
        threads.check()
        look = queues.look(ledger, unconsumed, group)
        idle = look.idle(wait_for_retries)
        if idle and idle_before:
            return look
        idle_before = idle
        if time.monotonic() > deadline:
            raise DrainTimeout(
                f"drain did not empty the queues within {timeout:g}s; remaining:\n"
                + look.describe()
            )
        time.sleep(CHECK_INTERVAL)
