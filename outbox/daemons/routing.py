"""The Consumer over several databases: each record stored in its tenant's inbox.

Contract (docs/how-to/many-databases.md, "Routing records to tenants"):

- A record goes to the inbox of the database whose NAME is the value of its routing header
  (`Routing.header`, exact match). A record with no such header, one that comes twice, a value
  that is not UTF-8, or a NAME this consumer does not serve is quarantined, with that reason,
  in the quarantine database (`Routing.quarantine`, named explicitly: start-up refuses to
  guess one, which would put one tenant's inbox in charge of others' records); never dropped,
  never stored live in another tenant's inbox. A record quarantined for its own data
  (outbox/daemons/consumer.py) is stored dead in its tenant's inbox, as with one database.
- A database that fails (down, dropped, not migrated, a role without rights) holds back only
  its own records: they wait in memory and are retried with backoff (one log line per
  interval, per database); the other databases' records are stored as they come.
- A partition's offset is committed only up to its oldest record not yet stored, so a crash
  loses nothing; what is delivered again is absorbed by the inbox's dedup.
- Memory is bounded: beyond `Routing.held_bytes` of waiting records, the failing databases'
  new records are not kept (their partitions are not committed past them); the consumer keeps
  polling, and so keeps its group membership, and once nothing waits any more it joins the
  group again to read them anew from the committed offsets.
- The loop polls every turn (Kafka evicts a member that does not poll within
  max.poll.interval.ms) and never connects: connections are opened by a few connector threads
  (`CONNECTORS`), all databases' at once at start, so the consumer joins its group at once
  whatever the number of databases, and a database that is slow to answer or down holds back
  only its own records. A turn stores every working database's records.
- The databases file is re-read every `Routing.reread_interval` seconds, and at once when it
  changed and a record names a tenant not served (a tenant added and sent to at once is not
  quarantined as unknown): added databases are
  served, removed ones are closed (their waiting records become unknown tenants); a file that
  cannot be read or has a bad entry is logged once and the last good list kept.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from outbox.core.batches import InboxBatch, Positions, Quarantined
from outbox.core.databases import Database, check_distinct, file_stamp, read_file
from outbox.core.errors import ConfigurationError, DatabaseUnavailable, OutboxError
from outbox.core.headers import TENANT_HEADER, validate_tenant_header
from outbox.core.redact import redact_text, remember_secrets, secrets_of_url
from outbox.core.retriable import database_error, refused_for_data
from outbox.core.text import first_line, storable
from outbox.core.wire import from_raw_json
from outbox.daemons.budget import Budget, Holding
from outbox.daemons.outages import Outage
from outbox.observability.logs import LimitedLog
from outbox.ports import InboxWriter, InboxWriters, InboxWriterSession

if TYPE_CHECKING:
    import threading

    from outbox.observability.health import Heartbeat
    from outbox.observability.runtime import Observability
    from outbox.ports import Subscriber

log = logging.getLogger("outbox.consumer")

#: Records held for failing databases, at most (payload and key bytes, plus a row's share).
HELD_BYTES = 64 * 1024 * 1024
#: What a held record costs besides its payload and key (its columns as Python objects).
RECORD_OVERHEAD = 400
#: How a record's tenant that no database serves is described (its quarantine reason).
UNKNOWN_TENANT = "unknown tenant"


@dataclass(frozen=True)
class Routing:
    """How a Consumer serving several databases chooses each record's inbox."""

    #: The databases served: flags first, then the file's entries (names are tenants).
    databases: tuple[Database, ...]
    #: The header whose value is the NAME of the record's database.
    header: str = TENANT_HEADER
    #: The database (its NAME, one of `databases`) that stores the records no tenant can be
    #: chosen for. Required, or `dedicated`: None is refused (`--quarantine-database`), not
    #: guessed.
    quarantine: str | None = None
    #: The databases given by flags (kept when the file is re-read).
    fixed: tuple[Database, ...] = ()
    #: The databases file re-read while running, or None.
    databases_file: str | None = None
    #: The schema of the file's entries that name none (`--schema`).
    schema: str = "outbox"
    #: Seconds between two reads of the databases file.
    reread_interval: float = 5.0
    #: Seconds a record naming a tenant not served waits for the databases file to name it
    #: (a tenant added to the producer's file before the consumer's) before it is quarantined;
    #: without a databases file none waits.
    unknown_grace: float = 30.0
    #: Bytes of records held for failing databases before their new ones are read again later.
    held_bytes: int = HELD_BYTES
    #: Seconds a database's connection may stay unused before it is closed.
    idle_timeout: float = 60.0
    #: A quarantine database of its own (`--quarantine-database NAME=URL`) instead of one of
    #: `databases`: it stores only the records no tenant can be chosen for, and a record naming
    #: it as its tenant is one of those.
    dedicated: Database | None = None
    #: The process's connection budget (outbox/daemons/budget.py): each database's connection
    #: is taken from it, and an idle one given back when another database waits; None:
    #: unlimited.
    budget: Budget | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        validate_tenant_header(self.header)
        if not self.databases:
            raise ConfigurationError("routing needs at least one database")
        check_distinct(self.databases)
        if self.dedicated is not None:
            check_distinct([*self.databases, self.dedicated])
            if self.quarantine not in (None, self.dedicated.name):
                raise ConfigurationError(
                    f"the quarantine database is {self.dedicated.name!r}, a database of its "
                    f"own, not {self.quarantine!r}"
                )
        self.home(self.databases)

    def served(self, databases: Sequence[Database]) -> list[Database]:
        """What the router stores in: the tenants' `databases`, and a dedicated quarantine."""
        return [*databases, *([self.dedicated] if self.dedicated is not None else [])]

    def home(self, databases: Sequence[Database]) -> Database:
        """The quarantine database: the dedicated one, else the one named among `databases`;
        a ConfigurationError if it is not named or not there."""
        if self.dedicated is not None:
            return self.dedicated
        names = ", ".join(d.name for d in databases)
        if self.quarantine is None:
            raise ConfigurationError(
                "routing records by tenant needs --quarantine-database NAME, the database that "
                f"stores the records no tenant can be chosen for (one of {names}, or one of its "
                "own, NAME=URL): it is not guessed"
            )
        for database in databases:
            if database.name == self.quarantine:
                return database
        raise ConfigurationError(
            f"--quarantine-database {self.quarantine!r} is not one of the databases served "
            f"({names})"
        )

    def __repr__(self) -> str:  # no URLs: the start-up line shows this
        names = ",".join(d.name for d in self.databases)
        return (
            f"header={self.header} quarantine={self.home(self.databases).name} "
            f"databases={names} file={self.databases_file}"
        )


class Settings(Protocol):
    """The Consumer settings the router reads (`ConsumerConfig`)."""

    @property
    def batch_size(self) -> int: ...
    @property
    def poll_timeout(self) -> float: ...
    @property
    def connect_timeout(self) -> float: ...


class Host(Protocol):
    """What the router needs of the Consumer it runs for: its settings, stop, heartbeat,
    counters, observability and the reads' outage."""

    received: int
    stored: int
    quarantined: int
    heartbeat: Heartbeat
    observability: Observability
    _reading: Outage
    _stop: threading.Event

    @property
    def config(self) -> Settings: ...
    @property
    def stopping(self) -> bool: ...


class _Failing(DatabaseUnavailable):
    """A database's failure, retried for that database alone (the others keep flowing)."""


@functools.cache
def _failing(name: str) -> type[_Failing]:
    """A `_Failing` named after the error it stands for, so that its log line says the
    error's own name (`SchemaNotMigrated: ...`)."""
    return type(name, (_Failing,), {})


def _shown(value: object) -> str:
    """A header value for an error and a log line: its repr, cut after 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


@dataclass(eq=False)
class _Piece:
    """Records of one batch for one database, not yet stored."""

    batch: InboxBatch
    #: Its oldest offset per (topic, partition).
    oldest: dict[tuple[str, int], int]
    size: int


def _piece(batch: InboxBatch) -> _Piece:
    oldest: dict[tuple[str, int], int] = {}
    for tp_offset in (
        *zip(batch.topics, batch.partitions, batch.offsets, strict=True),
        *((q.topic, q.partition, q.offset) for q in batch.quarantined),
    ):
        tp = (tp_offset[0], tp_offset[1])
        if tp_offset[2] < oldest.get(tp, tp_offset[2] + 1):
            oldest[tp] = tp_offset[2]
    size = sum(map(len, batch.payloads)) + sum(len(q.payload) for q in batch.quarantined)
    return _Piece(batch, oldest, size + RECORD_OVERHEAD * len(batch))


#: Threads that open the databases' connections for the loop (a connect may take
#: connect_timeout; the loop never waits for one).
CONNECTORS = 8
#: Seconds between two looks at a connection being opened for waiting records.
OPENING_LOOK = 0.02


@dataclass(eq=False)
class _Sink:
    """One database: its session, its waiting records and its run of failures."""

    database: Database
    writer: InboxWriter
    outage: Outage
    pending: list[_Piece] = field(default_factory=list)
    conn: InboxWriterSession | None = None
    #: Its connection being opened by a connector thread.
    connecting: Future[InboxWriterSession] | None = None
    next_try: float = 0.0
    last_used: float = 0.0
    #: Its records are not kept (beyond the memory bound) until they are read again.
    dropping: bool = False
    #: Under a connection budget: the process's, and what this database holds of it.
    budget: Budget | None = None
    holding: Holding | None = None

    @property
    def failing(self) -> bool:
        return self.outage.failures > 0

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None
                self.release()
        if self.connecting is not None:
            # Whatever the connector opens for it now is closed once opened.
            self.connecting.add_done_callback(self._close_opened)
            self.connecting = None

    def release(self) -> None:
        """Give its connection back to the budget."""
        if self.budget is not None and self.holding is not None:
            self.budget.release(self.holding)

    def _close_opened(self, future: Future[InboxWriterSession]) -> None:
        if not future.cancelled() and future.exception() is None:
            try:
                future.result().close()
            finally:
                self.release()


def _unknown(problem: str | None) -> bool:
    return problem is not None and problem.startswith(UNKNOWN_TENANT)


def _tenant_retriable(exc: BaseException) -> bool:
    """What a database's failure can be waited out (or fixed by its operator) without stopping
    the others: the database's errors, outbox's (not migrated, unreachable) and the network's."""
    return database_error(exc) or isinstance(exc, OutboxError | OSError)


def store_once(
    conn: InboxWriterSession, batch: InboxBatch, quarantined: list[Quarantined]
) -> tuple[Counter[str], Counter[str]]:
    """Store `batch` with `conn`, trying once: its ordinary records, then `quarantined` (its
    quarantined ones, to which a record PostgreSQL refuses is added, found by bisection as in
    `Consumer._bisect`). Rows stored and stored dead, per topic; any other failure is raised."""
    stored: Counter[str] = Counter()
    if batch.ordinary:
        try:
            stored = conn.insert(batch)
        except Exception as exc:
            if not conn.usable or not refused_for_data(exc):
                raise
            stored = _split(conn, batch, exc, quarantined)
    dead: Counter[str] = Counter()
    if quarantined:
        dead = conn.quarantine(quarantined)
    return stored, dead


def _split(
    conn: InboxWriterSession,
    batch: InboxBatch,
    error: BaseException,
    quarantined: list[Quarantined],
) -> Counter[str]:
    """The ordinary records of a batch PostgreSQL refused (`error`), stored by halves; a record
    refused alone is appended to `quarantined` with the refusal as its reason."""
    size = batch.ordinary
    if size == 1:
        reason = f"PostgreSQL refused the record: {first_line(error)}"
        quarantined.append(batch.quarantine(0, reason))
        return Counter()
    stored: Counter[str] = Counter()
    half = size // 2
    for start, stop in ((0, half), (half, size)):
        part = batch.part(start, stop)
        try:
            stored.update(conn.insert(part))
        except Exception as exc:
            if not conn.usable or not refused_for_data(exc):
                raise
            stored.update(_split(conn, part, exc, quarantined))
    return stored


class Router:
    """The routing loop of a `Consumer` whose config has `routing` (see the module)."""

    def __init__(
        self,
        consumer: Host,
        routing: Routing,
        subscriber_factory: Callable[[], Subscriber],
        inbox: InboxWriters,
    ) -> None:
        self.consumer = consumer
        self.config = consumer.config
        self.routing = routing
        self._inbox = inbox
        self._subscriber_factory = subscriber_factory
        self.sinks: dict[str, _Sink] = {}
        self.home = ""
        #: The NAME of a dedicated quarantine database (no tenant's), or None.
        self._dedicated: str | None = None
        self.held = 0
        #: Per partition: the offset after the last record polled, the oldest record not kept
        #: (beyond the memory bound), and the offset last committed.
        self._seen: dict[tuple[str, int], int] = {}
        self._floor: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._next_read = time.monotonic() + routing.reread_interval
        self._bad_file: str | None = None
        self._file_stamp = file_stamp(routing.databases_file) if routing.databases_file else None
        #: Pieces of records whose tenant is not served yet, one tenant each, in arrival order,
        #: with the time they are quarantined if it still is not (see `unknown_grace`).
        self._unknown: list[tuple[_Piece, str, float]] = []
        self._unknown_log = LimitedLog(log)
        self._connectors = ThreadPoolExecutor(CONNECTORS, thread_name_prefix="outbox-connect")
        self._routing_log = LimitedLog(log)
        self._overflow_log = LimitedLog(log)
        self._apply(routing.served(routing.databases))

    # -- the databases --------------------------------------------------------------------

    def _apply(self, databases: list[Database]) -> None:
        """Serve `databases` (checked: distinct, quarantine database among them); the waiting
        records of a database no longer served are routed again (unknown tenants now)."""
        names = {d.name for d in databases}
        removed = [self.sinks.pop(n) for n in list(self.sinks) if n not in names]
        for database in databases:
            current = self.sinks.pop(database.name, None)
            if current is not None and current.database == database:
                self.sinks[database.name] = current  # kept, in the order of the list
                continue
            if current is not None:
                current.close()
            remember_secrets(secrets_of_url(database.url))
            budget = self.routing.budget
            if current is not None and budget is not None and current.holding is not None:
                budget.forget(current.holding)
            self.sinks[database.name] = _Sink(
                database,
                self._inbox(
                    database.url, database.schema, connect_timeout=self.config.connect_timeout
                ),
                Outage(f"cannot store records in database {database.name!r}", log),
                pending=current.pending if current is not None else [],
                budget=budget,
                holding=None if budget is None else budget.holding(database.name, "consumer"),
            )
            if current is None and self.home:
                log.info("database %r is now served", database.name)
        self.home = self.routing.home(databases).name
        self._dedicated = self.routing.dedicated.name if self.routing.dedicated else None
        for sink in removed:
            sink.close()
            if sink.budget is not None and sink.holding is not None:
                sink.budget.forget(sink.holding)
            log.info("database %r is no longer served", sink.database.name)
            for piece in sink.pending:
                self.held -= piece.size
                self._route(piece.batch, waited=True)  # removed on purpose: no wait

    def _release_unknown(self) -> None:
        """Route the waiting records of tenants now served, and quarantine those whose wait
        ran out, in arrival order (a tenant's are one after another in the list, so its keys
        keep their order)."""
        if not self._unknown:
            return
        now = time.monotonic()
        waiting = self._unknown
        self._unknown = []
        for piece, problem, until in waiting:
            served = self._tenant(piece.batch.raw_headers[0])[0] is not None
            behind = any(p == problem for _, p, _ in self._unknown)  # its tenant's earlier
            if behind or (not served and now < until):
                self._unknown.append((piece, problem, until))
                continue
            self.held -= piece.size
            self._route(piece.batch, waited=True)

    def _reread(self) -> bool:
        """Re-read the databases file when it changed or it is time (see the module); true when
        the databases served changed."""
        routing = self.routing
        if routing.databases_file is None:
            return False
        stamp = file_stamp(routing.databases_file)
        if stamp == self._file_stamp and time.monotonic() < self._next_read:
            return False
        self._file_stamp = stamp
        self._next_read = time.monotonic() + routing.reread_interval
        try:
            listed = check_distinct(
                [*routing.fixed, *read_file(routing.databases_file, routing.schema)]
            )
            if not listed:
                raise ConfigurationError("it lists no database")
            check_distinct(routing.served(listed))  # no tenant named as a dedicated quarantine
            routing.home(listed)
        except ConfigurationError as exc:
            problem = redact_text(str(exc))
            if problem != self._bad_file:
                self._bad_file = problem
                log.warning(
                    "databases file %s not applied, the last good list is kept: %s",
                    routing.databases_file,
                    problem,
                    extra={"event": "consumer.databases_file"},
                )
            return False
        self._bad_file = None
        served = routing.served(listed)
        if [self.sinks[n].database for n in self.sinks] != served:
            self._apply(served)
            self._release_unknown()
            return True
        return False

    # -- routing --------------------------------------------------------------------------

    def _tenant(self, headers: Any) -> tuple[str | None, str | None]:
        """(database NAME, None) of a record's headers as received, or (None, why not)."""
        wanted = self.routing.header
        values = [value for name, value in headers if name == wanted]
        if not values:
            return None, f"no tenant header ({wanted!r})"
        if len(values) > 1:
            return None, f"tenant header {wanted!r} comes {len(values)} times"
        value = values[0]
        if isinstance(value, bytes | bytearray):
            try:
                value = bytes(value).decode()
            except UnicodeDecodeError:
                return None, f"tenant header {wanted!r} is not UTF-8 text: {_shown(bytes(value))}"
        if value is None or value not in self.sinks or value == self._dedicated:
            return None, f"{UNKNOWN_TENANT} {_shown(value)}"
        return value, None

    def _quarantined_tenant(self, record: Quarantined) -> tuple[str | None, str | None]:
        """`_tenant` of a record quarantined for its data (its headers as stored JSON)."""
        try:
            pairs = [
                (name.decode("utf-8", "surrogateescape"), value)
                for name, value in from_raw_json(record.raw_headers)
            ]
        except (ValueError, TypeError):
            return None, "headers unreadable"
        return self._tenant(pairs)

    def _route(self, batch: InboxBatch, *, waited: bool = False) -> None:
        """Split `batch` into one piece per database and hold each; beyond the memory bound a
        failing database's piece is not kept (its partitions are read again later). Records
        of a tenant not served wait for the databases file to name it (`unknown_grace`),
        unless they `waited` already."""
        chosen: dict[str, list[int]] = {}
        quarantined: dict[str, list[Quarantined]] = {}
        unknown: dict[str, list[int]] = {}
        tenants = [self._tenant(headers) for headers in batch.raw_headers]
        if (
            not waited
            and any(name is None and _unknown(p) for name, p in tenants)
            and self._reread()
        ):
            # A tenant added to the databases file while this batch was on its way: the file is
            # read when it changes, so its first records are stored, not quarantined.
            tenants = [self._tenant(headers) for headers in batch.raw_headers]
        wait = (
            not waited
            and self.routing.databases_file is not None
            and self.routing.unknown_grace > 0
            and self.held < self.routing.held_bytes
        )
        home = self.home
        for index, (name, problem) in enumerate(tenants):
            if name is None:
                if wait and _unknown(problem):
                    unknown.setdefault(problem or "", []).append(index)
                    continue
                reason = storable(problem or "no tenant")
                quarantined.setdefault(home, []).append(batch.quarantine(index, reason))
            else:
                chosen.setdefault(name, []).append(index)
        until = time.monotonic() + self.routing.unknown_grace
        for problem, indexes in unknown.items():
            piece = _piece(batch.pick(indexes))
            self._unknown.append((piece, problem, until))
            self.held += piece.size
            self._unknown_log(
                "records of an %s wait up to %.0fs for the databases file to name it, then are "
                "quarantined",
                problem,
                self.routing.unknown_grace,
                extra={"event": "consumer.unknown_tenant"},
            )
        for record in batch.quarantined:
            name, problem = self._quarantined_tenant(record)
            if name is None:
                if problem and not record.reason.startswith(problem):
                    record = record._replace(reason=storable(f"{problem}; {record.reason}"))
                name = home
            quarantined.setdefault(name, []).append(record)
        for name in {*chosen, *quarantined}:
            part = batch.pick(chosen.get(name, []))
            part.quarantined = quarantined.get(name, [])
            self._hold(self.sinks[name], _piece(part))

    def _hold(self, sink: _Sink, piece: _Piece) -> None:
        """Keep `piece` until its database stores it; beyond the memory bound, a failing
        database's piece is not kept, and from then on none of its pieces until the records not
        kept are read again (a later record of a key stored before an earlier one would break
        the key's order)."""
        # A failing database keeps its oldest records at least: retrying them tells when it
        # works again.
        over = self.held + piece.size > self.routing.held_bytes
        waiting = sink.failing or sink.connecting is not None  # either may last
        if sink.dropping or (waiting and sink.pending and over):
            sink.dropping = True
            for tp, offset in piece.oldest.items():
                self._floor[tp] = min(self._floor.get(tp, offset), offset)
            self._overflow_log(
                "%d MB of records wait for failing databases: the new records of database %r "
                "are not kept but read again once it works (offsets stay behind them)",
                self.held // (1024 * 1024),
                sink.database.name,
                extra={"event": "consumer.overflow", "database": sink.database.name},
            )
            return
        sink.pending.append(piece)
        self.held += piece.size

    # -- storing --------------------------------------------------------------------------

    def _store_due(self) -> None:
        """Store the waiting records of every database that is due: the working ones first, then
        those whose backoff ran out (their connections are opened off the loop)."""
        now = time.monotonic()
        due = [s for s in self.sinks.values() if s.pending and s.next_try <= now]
        for sink in sorted(due, key=lambda s: (s.failing, s.next_try)):
            if self.consumer.stopping:
                return
            self._attempt(sink)

    def _attempt(self, sink: _Sink) -> None:
        """Store a database's waiting records (once its connection is open); on failure,
        schedule its next try."""
        try:
            conn = self._connection(sink)
            if conn is None:
                return  # being opened: a later turn stores them
            while sink.pending:
                piece = sink.pending[0]
                self.consumer.heartbeat.beat()
                quarantined = list(piece.batch.quarantined)
                stored, dead = store_once(conn, piece.batch, quarantined)
                sink.pending.pop(0)
                self.held -= piece.size
                self._report(sink, piece.batch, stored, dead)
                for record in quarantined:
                    self._routing_log(
                        "record topic %r partition %d offset %d quarantined (stored dead in "
                        "database %r): %s",
                        record.topic,
                        record.partition,
                        record.offset,
                        sink.database.name,
                        record.reason,
                        extra={"event": "consumer.quarantined", "topic": record.topic},
                    )
            sink.last_used = time.monotonic()
        except Exception as exc:
            self._failed(sink, exc)
            return
        sink.outage.recovered()

    @staticmethod
    def _failed(sink: _Sink, exc: Exception) -> None:
        """A database failed: close its connection and schedule its next try (logged through
        its `Outage`); raise what is not the database's (a bug)."""
        if not _tenant_retriable(exc):
            raise exc
        sink.close()
        failure = _failing(type(exc).__name__)(redact_text(first_line(exc)))
        sink.next_try = time.monotonic() + sink.outage.failed(failure)

    def _connection(self, sink: _Sink) -> InboxWriterSession | None:
        """The database's open session; None while a connector opens it (started here when
        none is). A failed opening raises its error here, in the loop."""
        conn = sink.conn
        if conn is not None and conn.usable:
            return conn
        if sink.connecting is None:
            sink.close()
            sink.connecting = self._connectors.submit(self._open, sink)
            return None
        if not sink.connecting.done():
            return None
        opening, sink.connecting = sink.connecting, None
        sink.conn = opening.result()  # raises the connect's error
        return sink.conn

    def _open(self, sink: _Sink) -> InboxWriterSession:
        """A connector's work: the database's connection, taken from the budget first (waiting
        for one, off the loop)."""
        budget, holding = sink.budget, sink.holding
        if budget is not None and holding is not None:
            if not budget.acquire(holding, stopping=lambda: self.consumer.stopping):
                raise DatabaseUnavailable("the consumer is stopping")
            try:
                return sink.writer.connect(checked=True)
            except BaseException:
                budget.release(holding)
                raise
        return sink.writer.connect(checked=True)

    def _opened(self) -> None:
        """Take the connections the connectors opened since the last turn; a failed one is
        logged and its database tried again later (with backoff)."""
        for sink in self.sinks.values():
            if sink.connecting is not None and sink.connecting.done():
                try:
                    self._connection(sink)
                    sink.last_used = time.monotonic()
                except Exception as exc:
                    self._failed(sink, exc)
                else:
                    sink.outage.recovered()

    def _report(
        self, sink: _Sink, batch: InboxBatch, stored: Counter[str], dead: Counter[str]
    ) -> None:
        consumer = self.consumer
        consumer.received += len(batch)
        consumer.stored += stored.total()
        consumer.quarantined += dead.total()
        consumer.observability.consumer_batch(
            batch.topical(), stored, dead, database=sink.database.name, routing=True
        )

    def _recovered(self) -> bool:
        """Whether a database whose records were not kept works again and has stored what it
        kept (or none is left: no longer served): then its records are read again, whatever
        the others' state."""
        dropping = [s for s in self.sinks.values() if s.dropping]
        return not dropping or any(not (s.pending or s.failing) for s in dropping)

    def _read_again(self, subscriber: Subscriber) -> Subscriber:
        """Join the group again, to read from the committed offsets (below every record not
        stored): the records not kept, and those still waiting, which are forgotten here."""
        log.info(
            "reading again from the committed offsets the records not kept while databases failed",
            extra={"event": "consumer.read_again"},
        )
        subscriber.close()
        for sink in self.sinks.values():
            sink.pending.clear()
            sink.dropping = False
        self._unknown.clear()
        self.held = 0
        self._seen.clear()
        self._floor.clear()
        return self._subscriber_factory()

    def _close_idle(self) -> None:
        """Close the connections unused for `idle_timeout`, and, while another database waits
        for a connection of the budget, the one idle longest if it is this consumer's."""
        limit = time.monotonic() - self.routing.idle_timeout
        for sink in self.sinks.values():
            if sink.conn is not None and not sink.pending and sink.last_used < limit:
                sink.close()
        budget = self.routing.budget
        if budget is None or not budget.waiting():
            return
        open_ = [s for s in self.sinks.values() if s.conn is not None and s.holding is not None]
        for sink in open_:
            assert sink.holding is not None
            sink.holding.busy = bool(sink.pending)
            sink.holding.idle_since = None if sink.pending else sink.last_used
        for sink in open_:
            assert sink.holding is not None
            if not sink.pending and budget.should_yield(sink.holding):
                sink.close()
                return

    # -- offsets --------------------------------------------------------------------------

    def _positions(self) -> dict[tuple[str, int], int]:
        """Per partition polled: where the group may resume (nothing unstored below it)."""
        positions = dict(self._seen)
        for tp, offset in self._floor.items():
            positions[tp] = min(positions.get(tp, offset), offset)
        pieces = [p for s in self.sinks.values() for p in s.pending]
        pieces += [piece for piece, _, _ in self._unknown]
        for piece in pieces:
            for tp, offset in piece.oldest.items():
                positions[tp] = min(positions.get(tp, offset), offset)
        return positions

    def _commit(self, subscriber: Subscriber) -> None:
        moved = {
            tp: offset
            for tp, offset in self._positions().items()
            if offset > self._committed.get(tp, -1)
        }
        if moved:
            subscriber.commit(Positions(moved))
            self._committed.update(moved)

    # -- the loop -------------------------------------------------------------------------

    def check(self) -> None:
        """Start connecting to every database at once (the connectors open them while the
        consumer joins its group): one that fails is logged (and retried when it has records to
        store), not fatal."""
        if self.routing.budget is not None and self.routing.budget.size is not None:
            return  # under a budget: connected when records come (taken then, given back)
        for sink in self.sinks.values():
            self._connection(sink)

    def run(self) -> None:
        """Poll, route, store and commit until the consumer is stopped."""
        consumer = self.consumer
        config = self.config
        subscriber = self._subscriber_factory()
        try:
            while not consumer.stopping:
                consumer.heartbeat.beat()
                self._reread()
                self._release_unknown()
                self._opened()
                timeout = config.poll_timeout
                waiting = [s.next_try for s in self.sinks.values() if s.pending]
                waiting += [until for _, _, until in self._unknown]
                if waiting:
                    timeout = max(0.0, min(timeout, min(waiting) - time.monotonic()))
                if any(s.pending and s.connecting is not None for s in self.sinks.values()):
                    timeout = min(timeout, OPENING_LOOK)
                try:
                    batch = subscriber.poll(config.batch_size, timeout)
                except Exception as exc:
                    delay = consumer._reading.failed(exc)  # raises what retrying cannot fix
                    consumer._reading.pause(delay, consumer._stop, consumer.heartbeat.beat)
                    continue
                consumer._reading.recovered()
                if batch:
                    for t, p, o in (
                        *zip(batch.topics, batch.partitions, batch.offsets, strict=True),
                        *((q.topic, q.partition, q.offset) for q in batch.quarantined),
                    ):
                        if o >= self._seen.get((t, p), 0):
                            self._seen[t, p] = o + 1
                    self._route(batch)
                self._store_due()
                self._commit(subscriber)
                if consumer.stopping:
                    break
                if self._floor and self._recovered():
                    subscriber = self._read_again(subscriber)
                self._close_idle()
        finally:
            subscriber.close()
            for sink in self.sinks.values():
                sink.close()
            self._connectors.shutdown(wait=False, cancel_futures=True)
            unstored = sum(len(p.batch) for s in self.sinks.values() for p in s.pending)
            log.info(
                "consumer stopped: received=%d stored=%d quarantined=%d%s",
                consumer.received,
                consumer.stored,
                consumer.quarantined,
                f" ({unstored} records not stored are delivered again)" if unstored else "",
            )
