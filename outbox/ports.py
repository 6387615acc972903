"""The small contracts the daemons are written against, and the only way they reach a transport.

Adapters: outbox/kafka/, outbox/pglog/ (a log in PostgreSQL) and outbox/testing/memory.py. The
daemons call exactly `Publisher.publish`, `Subscriber.poll`, `Subscriber.commit` and `close`,
with the core batch types of outbox/core/batches.py, and every transport passes the same
contract suite of those calls (tests/transport/). Which transport and which stores run is chosen
by the composition root (outbox/runtime/, from the registry of outbox/transports.py), which
passes the daemons factories, stores and probes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

from outbox.core.batches import InboxBatch, OutgoingRecord, Quarantined
from outbox.core.databases import Database
from outbox.core.inbox_rows import Claimed, ClaimedBatch, FailedAttempt, Pending
from outbox.core.lag import GroupLag


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """Why one message was not delivered; `permanent` means retrying cannot help."""

    error: str
    permanent: bool = False


class Publisher(Protocol):
    """Sends records to the transport and reports, per record, whether it was acknowledged.

    `publish` returns only when every record of the batch has a definite outcome: None for
    acknowledged (durably stored by the transport), or a `DeliveryFailure`. Results are in the
    order of the input. Records of one key reach the transport in the order given. A record
    whose stored headers are not outbox's form fails permanently, alone.
    """

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        """Send a batch; one result per record, in order. `meanwhile`, when given, is called
        once, after the batch was handed over and before its outcomes are awaited: the caller's
        chance to work while the batch is on its way (the relay fetches its next batch)."""
        ...

    def close(self) -> None:
        """Flush what is pending and release the connection."""
        ...


class Subscriber(Protocol):
    """Reads the topics it was created for as a member of one consumer group.

    `poll` returns records in partition order (a key's records in the order they were
    published) as an `InboxBatch`, decoded by outbox's wire codec. A group's position moves on
    only through `commit`: a new subscriber of the group starts after the last committed record
    of each partition, so records polled but never committed are delivered again. Several
    groups each receive every record.
    """

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        """Wait up to `timeout` seconds for a record, then return it and what else is already
        there, up to `max_records`; empty when nothing arrived."""
        ...

    def commit(self, batch: InboxBatch) -> None:
        """Record that `batch` is stored: the group resumes after its last record of each
        partition (`InboxBatch.next_offsets`).

        Asynchronous, and best effort: the offsets may reach the broker or the log later (the
        log sends them with the next `poll`'s fetch, and at `close`), and a lost commit
        (logged) only means a redelivery, which the inbox absorbs.
        """
        ...

    def close(self) -> None:
        """Leave the group and release the connection; uncommitted records stay for others."""
        ...


#: A probe's look at a queue (`DatabaseProbe.queue_stats`): waiting rows, the oldest one's age,
#: dead rows (the producer's; else None), and for the producer's queue the messages due later,
#: the overdue ones and how late the most overdue is (seconds).
QueueStats = tuple[int, float, int | None] | tuple[int, float, int | None, int, int, float]


@dataclass(frozen=True, slots=True)
class TransportProbe:
    """How a daemon checks that its transport is reachable: `check(timeout)` raises an
    `OutboxError` saying why not. `name` keys the dependency in health reports ("kafka"),
    `label` names it in their text ("Kafka")."""

    name: str
    label: str
    check: Callable[[float], None]


PublisherFactory = Callable[[], Publisher]
SubscriberFactory = Callable[[], Subscriber]


# -- a transport's entry in the registry (outbox/transports.py) -------------------------------

#: A transport's options object: a frozen dataclass its entry parses from flag values.
Options = TypeVar("Options")

#: Where a command's flags are added (`Transport.add_arguments`): a producer, a consumer,
#: `outbox run` (both), or a command that only reads the transport (status, console, asyncapi).
Role = Literal["producer", "consumer", "run", "reader"]


class ArgumentAdder(Protocol):
    """What `Transport.add_arguments` is given: an argparse parser (or argument group)."""

    def add_argument(self, *names: str, **options: Any) -> Any: ...


class ContractTransport(Protocol):
    """What the transport contract suite (tests/transport/) drives: topics, publishers and
    subscribers of one transport, and `settings` a process started by the test can be given
    (`outbox.transports.TransportSettings`, or None for a transport that lives in one
    process). `settle` is how long to keep polling after the expected records arrived."""

    name: str
    settle: float

    def topic(self, partitions: int = 3) -> str: ...

    def publisher(self) -> Publisher: ...

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber: ...

    def settings(self) -> Any: ...

    def close_all(self) -> None: ...


class FixtureSource(Protocol):
    """A pytest request: where a contract factory gets the servers it needs
    (`getfixturevalue("outbox_kafka_bootstrap")`, ...)."""

    def getfixturevalue(self, argname: str) -> Any: ...


@dataclass(frozen=True)
class TransportSettings:
    """The transport of a process: the registered transport's `name` (`--transport`), its
    `options` (that transport's options object, parsed from its flags by its entry; None: its
    defaults), where a new consumer group starts (`start`, `--start`; None: at the earliest
    record), and the endpoint flags (with their variables) of other transports that were
    given (`unused`: warned about at start, they are not used). Only the transport's entry
    reads its options."""

    name: str = "kafka"
    options: Any = None
    start: str | None = None
    unused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Transport(Generic[Options]):
    """A transport as the registry (outbox/transports.py) knows it, declared by its adapter
    (outbox/kafka/transport.py, outbox/pglog/transport.py, ...): its name, its flags and the
    options object they are parsed into, and how its parts are made from those options.

    Nothing outside the adapter reads an options object's fields: the CLI adds the flags
    (`add_arguments`) and parses them (`options_of`, from the parsed values by destination,
    a missing one taking its default); the composition root, `status`, the console, AsyncAPI
    and `drain` pass the options back to this entry's functions.

    `make_publishers` and `make_subscribers` return factories for the daemons, with the probe
    the daemon's readiness checks (None: the transport has none of its own; `probe` alone is
    that probe); `check` is the start-up check (waiting up to `wait` seconds for a database the
    transport lives in), raising an `OutboxError` with one line; `check_consumer` refuses,
    with a `ConfigurationError`, consumer options the transport cannot honour. `secrets` are
    the values of the options that are secret: they are masked wherever a line is printed
    (outbox.core.redact). `features` say what the transport can do: "processes" (its records
    are seen by other processes: it runs under the CLI's daemons and the contract cases that
    cross processes), "start" (a new group can start elsewhere than the earliest record,
    `--start`). `contract` makes the transport for the contract suite from a pytest request.
    """

    name: str
    label: str
    #: The flags of the transport, and its options parsed from their values.
    add_arguments: Callable[[ArgumentAdder, Role], None]
    options_of: Callable[[Mapping[str, Any]], Options]
    #: Where the transport is (the endpoint's flag, its destination and variable), as given
    #: ("" when not), and as logs and pages may show it (a URL's password masked).
    endpoint: Callable[[Options], str]
    endpoint_flag: str
    endpoint_dest: str
    endpoint_env: str
    shown: Callable[[str], str]
    #: (options, start): publishers; (options, group, topics, start): members of `group`
    #: reading `topics`, a new group starting at `start` (None: the earliest record).
    make_publishers: Callable[[Options], tuple[PublisherFactory, TransportProbe | None]]
    make_subscribers: Callable[
        [Options, str, Sequence[str], str | None],
        tuple[SubscriberFactory, TransportProbe | None],
    ]
    probe: Callable[[Options], TransportProbe | None]
    #: (options, timeout): reads the lag of consumer groups, each request within `timeout`.
    lag_reader: Callable[[Options, float], LagReader]
    #: The AsyncAPI `servers` of a service on this transport, and their security schemes.
    asyncapi_servers: Callable[[Options], tuple[dict[str, Any], dict[str, Any]]]
    check: Callable[[Options, float], None]
    check_consumer: Callable[[Options], None]
    #: What the operator tools say when the endpoint is not given: the console's lag note, and
    #: why `outbox status --max-lag` cannot be checked.
    lag_note: str
    max_lag_needs: str
    #: (options, kind, group): the settings in force a daemon of `kind` ("producer" or
    #: "consumer") shows in its start-up line, not masked (the line masks `secrets`).
    in_force: Callable[[Options, str, str], dict[str, Any]]
    secrets: Callable[[Options], Iterable[str]]
    features: frozenset[str] = frozenset()
    contract: Callable[[FixtureSource], ContractTransport] | None = None


# -- readiness: what a daemon's probes (outbox/observability/) ask of a database


class DatabaseProbe(Protocol):
    """How a daemon's probe thread sees one database: whether it answers, and how deep a
    queue is. Calls come from one thread, on a schedule, never per message; they may share one
    connection, which a failure drops (the next call opens another). `name` keys the
    dependency in health reports ("postgres"), `label` names it in their text ("PostgreSQL")."""

    name: str
    label: str

    def check(self, timeout: float) -> None:
        """Return if the database answers within `timeout` seconds; else raise an
        `OutboxError` saying why not, in one line."""
        ...

    def queue_stats(self, queue: str, timeout: float) -> QueueStats | None:
        """The rows of `queue` (`producer_queue`, `consumer_queue`) waiting, not dead and not
        processed; the age in seconds of the oldest (0 when none waits); for the producer's
        queue, the dead rows kept (None otherwise), and may add the messages due later, those
        of them overdue and the seconds the most overdue is late. None when the queue cannot
        be read yet; an `OutboxError` when the database cannot be reached."""
        ...

    def close(self) -> None:
        """Release the connection, if one is open."""
        ...


#: Makes the probe of one database (`outbox.postgres.probes.PostgresProbe`).
DatabaseProbes = Callable[[Database], DatabaseProbe]


class ActivityWatch(Protocol):
    """Which of many databases saw writes since the last look, seen through their servers'
    statistics with one connection and one query per server, not one per database: what wakes
    the parked relays of a process that serves many databases (outbox/daemons/supervisor.py).
    Calls come from one thread."""

    def changed(self, databases: Sequence[Database]) -> dict[str, bool]:
        """For each database (by NAME) this look could see: whether it saw writes since the
        previous look that saw it (False the first time). A database missing from the answer
        cannot be watched now (its server unreachable, its statistics off): its relay looks on
        its own schedule."""
        ...

    def close(self) -> None:
        """Release the connections."""
        ...


#: Makes the activity watch of a process (`outbox.postgres.activity.PostgresActivity`), given
#: the seconds a connection attempt may take.
ActivityWatches = Callable[[float], ActivityWatch]


# -- the relay side: queue stores and their sessions
#
# The relay loop (outbox/daemons/relay.py) and its two relays (the Producer, the Handler) reach
# their database only through these. The PostgreSQL adapters are outbox/postgres/relay_stores.py;
# a unit test may give an in-memory one. Every method is one statement (or none) on the
# session's connection: a port adds no round trip.

Row = TypeVar("Row")
Session_co = TypeVar("Session_co", bound="RelaySession", covariant=True)


@dataclass(frozen=True, slots=True)
class RelayTarget:
    """The database and queue one relay serves: `kind` is "producer" (`producer_queue`) or
    "handler" (`consumer_queue`); `application_name` names its connections to the server."""

    database_url: str
    schema: str
    kind: str
    relay_id: str
    connect_timeout: float
    application_name: str


class FetchedRows(Protocol[Row]):
    """The rows of a fetch that was started and may still be on its way (pipelined)."""

    def fetchall(self) -> list[Row]:
        """Every row, once they are in."""
        ...

    def fetchone(self) -> Row | None:
        """The first row, or None."""
        ...


class RelaySession(Protocol):
    """One relay's connection to its queue's database, each statement committed on its own.

    Lanes are owned one relay at a time: a lane `lock`ed here is held until `unlock`, or until
    the session is closed or lost (then it is free for another relay). While some relay of the
    queue has `set_sleeping(True)`, writers wake it (`notified`).
    """

    @property
    def closed(self) -> bool:
        """Whether the session is closed or lost."""
        ...

    def check_lock_class(self) -> None:
        """Raise ConfigurationError if another queue of the database would share this queue's
        lanes (their relays would take each other's lanes)."""
        ...

    def join(self) -> None:
        """Register the relay as live and start receiving its queue's wake-ups."""
        ...

    def leave(self, parked: bool = False) -> None:
        """Unregister the relay (its lanes go with the session); `parked`: it parks (idle,
        `--idle-disconnect`), listed as parked but counted by no relay sharing lanes."""
        ...

    def parked_seen(self) -> None:
        """A parked relay's look (on a short-lived session): it is still there."""
        ...

    def set_sleeping(self, sleeping: bool) -> None:
        """Announce (or end) the relay's nap: writers wake a queue only while a relay sleeps."""
        ...

    def live_relays(self) -> int:
        """The live relays of this queue (the dead ones forgotten first), at least 1."""
        ...

    def held(self) -> set[int]:
        """The lanes some relay of this queue holds now."""
        ...

    def lock(self, lane: int) -> bool:
        """Try to take `lane`; True if this session holds it now."""
        ...

    def lock_each(self, lanes: list[int]) -> list[int]:
        """Try to take each of `lanes` (none held by this session), in one round trip; those
        this session holds now, in the order given."""
        ...

    def unlock(self, lane: int) -> None:
        """Give `lane` up."""
        ...

    def notified(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a wake-up; True (taking every other wake-up already
        received with it) if one came."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> object: ...


class OutboxSession(RelaySession, Protocol):
    """The Producer's session on `producer_queue`: what it fetches and settles.

    Inside `pipeline()`, statements are sent without waiting for their results: a `fetch`
    started there is read (`FetchedRows`) after the pipeline ended or when needed; leaving it
    waits for every statement.
    """

    def fetch(
        self, lanes: list[int], limit: int, exclude: list[int]
    ) -> FetchedRows[OutgoingRecord]:
        """Start reading the next rows of `lanes` that may go out now, in id order, less the
        ids in `exclude`, at most `limit`."""
        ...

    def next_due(self, lanes: list[int]) -> float | None:
        """Seconds until a retrying row of `lanes` may be fetched, or None."""
        ...

    def promote(self, lanes: list[int], limit: int) -> tuple[int, float | None]:
        """Move up to `limit` messages of `lanes` whose due time came (sent with `deliver_at`
        or `delay`) among the rows `fetch` reads, in due-time order: how many, and the seconds
        until the next one of `lanes` falls due (None when none waits; negative: due)."""
        ...

    def delete(self, ids: Sequence[int]) -> None:
        """Forget delivered rows."""
        ...

    def fail(
        self, ids: Sequence[int], errors: Sequence[str], delays: Sequence[float | None]
    ) -> None:
        """Record failed deliveries: retried after its delay, dead where the delay is None.
        The errors are storable text."""
        ...

    def pipeline(self) -> AbstractContextManager[object]:
        """Send the statements of the block without waiting for each one's results."""
        ...

    def transaction(self) -> AbstractContextManager[object]:
        """Commit the statements of the block together, or none of them."""
        ...


class InboxSession(RelaySession, Protocol):
    """The Handler's control session on `consumer_queue`: fetch, retention, the lease."""

    def fetch(self, lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:
        """The next rows of `lanes` due for handling, in id order; a key waits behind its
        retrying row, except on the `unordered` topics."""
        ...

    def next_due(self, lanes: list[int]) -> float | None:
        """Seconds until a retrying row of `lanes` may be fetched (negative: due), or None."""
        ...

    def forget_processed(self, window: float, limit: int) -> int:
        """Forget up to `limit` rows processed more than `window` seconds ago; how many."""
        ...

    def recent_topics(self, limit: int) -> dict[str, int]:
        """The topics of the last `limit` rows stored, whatever their state: rows per topic."""
        ...

    def attempts(self, row_id: int) -> int:
        """The attempts a row has had (0 if it is gone)."""
        ...

    def terminate(self, backend_pid: int) -> None:
        """End the server session of a handler transaction that overran its lease: it rolls
        back, so nothing it wrote can commit."""
        ...

    def fail(self, failed: FailedAttempt) -> None:
        """Record a failed attempt (on its own)."""
        ...


class QueueDatabase(Protocol[Session_co]):
    """A relay's database: its sessions, and the start-up check."""

    def connect(self) -> Session_co:
        """A new session; the driver's error (retriable or not: outbox.core.retriable) if the
        database cannot be reached."""
        ...

    def check(self, wait: float, stopping: Callable[[], bool], attempt: Callable[[], None]) -> None:
        """Raise one clear error on an unreachable database (after waiting up to `wait` seconds
        for it, until `stopping()`; `attempt()` is called before each try) or a schema that
        is not migrated."""
        ...


class HandlerSession(Protocol):
    """A Handler worker's own connection, in the flavour of `Handlers(transaction=...)`.

    `transaction` yields the store's handle for the transaction (for `HandlerWork`) and what a
    callback receives (a connection or a session). After a callback, `check()` raises
    `outbox.core.errors.Misused` if it left the transaction unusable; `broken` tells a lost
    connection from a failed statement.
    """

    backend_pid: int

    @property
    def broken(self) -> bool: ...

    def transaction(
        self, *, pipelined: bool = False
    ) -> AbstractContextManager[tuple[Any, Any]]: ...

    def check(self) -> None: ...

    def flush(self, handle: Any) -> None:
        """Send a callback's pending ORM changes, so that their failure is its own."""
        ...

    def close(self) -> None: ...


class AsyncHandlerSession(Protocol):
    """The async twin of `HandlerSession`, for async callbacks (one row, one transaction)."""

    backend_pid: int

    @property
    def broken(self) -> bool: ...

    def transaction(self) -> AbstractAsyncContextManager[tuple[Any, Any]]: ...

    def check(self) -> None: ...

    async def close(self) -> None: ...


class HandlerWork(Protocol):
    """The inbox store's statements in a handler transaction (`tx`: what the session's
    `transaction` yields first)."""

    def claim_next(
        self, tx: Any, lanes: list[int], limit: int, unordered: list[str]
    ) -> ClaimedBatch:
        """Fetch and lock, in one statement, up to `limit` rows of `lanes` due for handling,
        in id order; a key waits behind its retrying row, except on the `unordered` topics."""
        ...

    def claim_many(self, tx: Any, ids: list[int]) -> dict[int, Claimed]:
        """Lock the rows of `ids` that are still pending and held by no other transaction."""
        ...

    def done_many(self, tx: Any, ids: list[int]) -> None:
        """Mark rows processed."""
        ...

    def fail(self, tx: Any, failed: FailedAttempt) -> None:
        """Record a failed attempt."""
        ...

    def claim_async(self, tx: Any, row_id: int) -> Awaitable[Claimed | None]:
        """Lock one pending row, or None if it is handled or held by another transaction."""
        ...

    def done_async(self, tx: Any, row_id: int) -> Awaitable[None]:
        """Mark one row processed."""
        ...

    def fail_async(self, tx: Any, failed: FailedAttempt) -> Awaitable[None]:
        """Record a failed attempt."""
        ...


class InboxDatabase(QueueDatabase[InboxSession], Protocol):
    """The Handler's database: its control sessions, its workers' sessions and their work."""

    @property
    def work(self) -> HandlerWork:
        """The inbox store's statements in a worker's transaction."""
        ...

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        """What the sessions' libraries raise for a database error (a failed statement or a
        lost connection)."""
        ...

    @property
    def disconnects(self) -> tuple[type[Exception], ...]:
        """What they raise for a lost connection alone."""
        ...

    def open_session(self, library: Literal["psycopg", "sqlalchemy"]) -> HandlerSession:
        """A worker's sync session (the driver's error if it cannot connect)."""
        ...

    def open_async_session(
        self, library: Literal["psycopg", "sqlalchemy"]
    ) -> Awaitable[AsyncHandlerSession]:
        """A worker's async session."""
        ...


OutboxDatabaseFactory = Callable[[RelayTarget], QueueDatabase[OutboxSession]]
InboxDatabaseFactory = Callable[[RelayTarget], InboxDatabase]


@dataclass(frozen=True, slots=True)
class RelayStores:
    """How the relays reach their queues: the composition root's choice (`outbox.runtime`:
    PostgreSQL's, or what a test gives)."""

    outbox: OutboxDatabaseFactory
    inbox: InboxDatabaseFactory


# -- the consumer side: inbox writer and lag


class InboxWriterSession(Protocol):
    """One open connection to an inbox, used by one thread at a time.

    Each statement is atomic on its own: what it stored is committed when it returns. A
    statement the database refuses for its data (`outbox.core.retriable.refused_for_data`)
    leaves the session usable; anything else may leave it unusable (`usable`).
    """

    @property
    def usable(self) -> bool:
        """Neither closed nor lost: another statement may run on it."""
        ...

    def insert(
        self, batch: InboxBatch, meanwhile: Callable[[], None] | None = None
    ) -> Counter[str]:
        """Store the ordinary records of `batch`, once per message id (a duplicate is not
        stored again), and wake a sleeping Handler; the rows stored per topic. `meanwhile`,
        when given, is called once, after the statement was sent and before its outcome is
        awaited (and before it commits)."""
        ...

    def quarantine(self, records: Sequence[Quarantined]) -> Counter[str]:
        """Store records that cannot be ordinary rows as dead rows with their reason, once per
        message id; the rows stored per topic."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class InboxWriter(Protocol):
    """One inbox (a database and its schema) as the Consumer stores batches in it."""

    def connect(self, *, checked: bool = False) -> InboxWriterSession:
        """A new session, or the driver's error if the database cannot be reached (retriable
        per `outbox.core.retriable`). `checked`: the schema's version is checked too
        (`SchemaNotMigrated`, `OutboxError`)."""
        ...

    def check(
        self,
        *,
        wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        attempt: Callable[[], None] = lambda: None,
    ) -> None:
        """Fail fast with one clear `OutboxError` on an unreachable database or a schema not
        migrated. With `wait` > 0 an unreachable database is waited for, with backoff, up to
        `wait` seconds or until `stopping()`; `attempt()` is called before each connection."""
        ...


class InboxWriters(Protocol):
    """Makes the `InboxWriter` of one database: the composition root chooses the store
    (PostgreSQL's, outbox.postgres.inbox's PostgresInboxWriter, or an in-memory one in tests)."""

    def __call__(self, url: str, schema: str, *, connect_timeout: float) -> InboxWriter: ...


class LagReader(Protocol):
    """Reads the lag of consumer groups from a transport (Kafka, the PostgreSQL log).

    `lag` returns one `GroupLag` per group: of the groups given, in their order and each once,
    or of every group the transport knows when `groups` is None. A group that cannot be read
    carries its `error` rather than failing the others; a transport that cannot be reached at
    all raises.
    """

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        """The lag of `groups` (every group when None)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
