"""One process, many databases: a relay per database, each in a thread of its own.

Contract:
- Each database is served by its own relay (`outbox.daemons.relay`: its lanes, leases, order
  per key and sleeping flag are that database's, exactly as with a process per database); the
  relays share the process's turns (`Turns`: a batch is processed in a turn, first come first
  served), its metrics and health servers and, for the Producer, one transport publisher.
- A relay idle for `idle_disconnect` seconds parks (see `LaneRelay.parked`): idle databases
  hold no connection. With an activity watch (`outbox.ports.ActivityWatch`), a thread asks it
  every `watch_interval` seconds which parked databases saw writes, with one query per
  server, and wakes their relays (`nudge`); a parked relay's own looks then grow further apart.
- A database's failure is its own: unreachable, not migrated, without privileges, dropped
  while served. It is logged (a first line at once, then at most one line a minute), retried
  with a backoff growing to `DATABASE_BACKOFF`'s maximum, and never holds the others back.
  Only a process-wide failure (`fail`: the transport's configuration, say) stops the process.
- `/readyz` says how each database fares; it fails only when no database is being served
  (or a process-wide check such as the transport's fails).
- The databases file, when given, is re-read every `FILE_INTERVAL` seconds when it changed: a
  database added starts, a database removed stops after the batch in hand. A file that cannot
  be read or parsed is logged once per change and the last good list kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from outbox.core.databases import Database, check_distinct, file_stamp, read_file
from outbox.core.errors import ConfigurationError
from outbox.core.redact import redact_text, remember_secrets, secrets_of_url
from outbox.core.retry import Backoff
from outbox.core.text import first_line
from outbox.daemons.budget import Budget, Holding
from outbox.daemons.outages import Outage
from outbox.daemons.turns import Turns
from outbox.observability.health import Heartbeat
from outbox.observability.logs import LimitedLog
from outbox.observability.runtime import Observability
from outbox.ports import ActivityWatch

log = logging.getLogger("outbox.supervisor")

#: The backoff between attempts at a database that failed in a way retrying may not fix (not
#: migrated, dropped, no privilege): it may be fixed while the process runs.
DATABASE_BACKOFF = Backoff(initial=1.0, maximum=60.0, jitter=0.2)
#: The backoff between a relay's reconnection attempts to one of several databases.
RECONNECT_BACKOFF = Backoff(initial=0.1, maximum=60.0, jitter=0.2)
#: At most one log line per this many seconds about one database's failures.
DATABASE_LOG_INTERVAL = 60.0
#: Seconds between looks at the databases file.
FILE_INTERVAL = 5.0
#: Default seconds without rows after which the relay of one of several databases parks.
IDLE_DISCONNECT = 60.0


class DatabaseRelay(Protocol):
    """What the supervisor needs of a relay (`LaneRelay` subclasses have it)."""

    observability: Observability
    heartbeat: Heartbeat
    outage: Outage
    turns: Turns | None
    idle_disconnect: float | None
    parked: bool
    watched: bool
    budget: Budget | None
    holding: Holding | None

    def check_database(self, wait: float = 0.0) -> None: ...
    def stop(self) -> None: ...
    def nudge(self) -> None: ...
    @property
    def stopping(self) -> bool: ...


R = TypeVar("R", bound=DatabaseRelay)


@dataclass
class Served(Generic[R]):
    """One database, its relay and the thread that runs it."""

    database: Database
    relay: R
    outage: Outage
    thread: threading.Thread | None = None
    state: str = "starting"
    since: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        """`name state`, with the last error while failing."""
        state = "parked" if self.state == "serving" and self.relay.parked else self.state
        trouble = self.relay.outage.trouble() if state == "serving" else None
        if trouble:
            return f"{self.database.name} reconnecting ({trouble})"
        if state == "failing" and self.outage.error:
            return f"{self.database.name} failing ({self.outage.error})"
        return f"{self.database.name} {state}"


class _AllBeats(Heartbeat):
    """The process's heartbeat: as old as its stalest relay's (or the supervisor's own)."""

    __slots__ = ("_others",)

    def __init__(self, others: Callable[[], Sequence[Heartbeat]]) -> None:
        super().__init__()
        self._others = others

    def age(self) -> float:
        return max([super().age(), *(beat.age() for beat in self._others())])


class Supervisor(Generic[R]):
    """Serves several databases with one relay each (see the module)."""

    def __init__(
        self,
        kind: str,
        databases: Sequence[Database],
        make: Callable[[Database], R],
        serve: Callable[[R], None],
        *,
        turns: Turns,
        idle_disconnect: float | None = IDLE_DISCONNECT,
        file: str | Path | None = None,
        fixed: Sequence[Database] = (),
        default_schema: str = "outbox",
        activity: ActivityWatch | None = None,
        watch_interval: float = 1.0,
        budget: Budget | None = None,
    ) -> None:
        self.kind = kind
        self._make = make
        self._serve = serve
        self.turns = turns
        self.idle_disconnect = idle_disconnect
        self.file = None if file is None else Path(file)
        #: The databases of the flags, which the file's re-reads keep.
        self.fixed = list(fixed)
        self.default_schema = default_schema
        self._initial = list(databases)
        #: The databases to serve: the initial ones, then the last good file's (and flags').
        self._listed = list(databases)
        self._served: dict[str, Served[R]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._file_seen: tuple[int, int, int] | None = self._file_key()
        self._file_log = LimitedLog(log, interval=DATABASE_LOG_INTERVAL)
        self.heartbeat: Heartbeat = _AllBeats(self._beats)
        self.observability: Observability | None = None
        self.activity = activity
        self.watch_interval = watch_interval
        self._watch_log = LimitedLog(log, interval=DATABASE_LOG_INTERVAL)
        #: The process's connection budget (outbox/daemons/budget.py), None: unlimited.
        self.budget = budget

    # -- wiring --------------------------------------------------------------------------------

    def observe(self, observability: Observability) -> None:
        """Report through `observability` (made with this supervisor's `heartbeat` and
        `databases`): each relay's metrics labelled with its database, /readyz per database."""
        self.observability = observability
        observability.health.watch(self.trouble)
        observability.health.report = self.report

    def databases(self) -> list[Database]:
        """The databases to serve (each served, or failing and retried)."""
        with self._lock:
            return list(self._listed)

    def parked(self) -> set[str]:
        """The NAMEs of the databases whose relays are parked now."""
        with self._lock:
            return {
                name
                for name, one in self._served.items()
                if one.state == "serving" and one.relay.parked
            }

    def relays(self) -> list[R]:
        """The relays running now (for tests and benchmarks)."""
        with self._lock:
            return [served.relay for served in self._served.values()]

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every relay to finish its batch in hand; `run` returns once they did."""
        self._stop.set()

    def fail(self, exc: BaseException) -> None:
        """A failure of the whole process (not of one database): stop, and `run` raises it."""
        if self._fatal is None:
            self._fatal = exc
        self._stop.set()

    def run(self) -> None:
        """Serve every database until `stop()` (or `fail`, whose error is raised)."""
        observability = self.observability
        assert observability is not None, "observe() first"
        with observability.serving():
            for database in self._initial:
                self._start(database)
            next_read = time.monotonic() + FILE_INTERVAL
            watcher = None
            if self.activity is not None:
                watcher = threading.Thread(
                    target=self._watch, name=f"outbox-{self.kind}-watch", daemon=True
                )
                watcher.start()
            try:
                while not self._stop.wait(0.2):
                    self.heartbeat.beat()
                    if self.file is not None and time.monotonic() >= next_read:
                        next_read = time.monotonic() + FILE_INTERVAL
                        self._reread()
            finally:
                with self._lock:
                    served = list(self._served.values())
                for one in served:
                    one.relay.stop()
                for one in served:
                    self._join(one)
                if watcher is not None:
                    watcher.join(5)
        if self._fatal is not None:
            raise self._fatal

    def _watch(self) -> None:
        """Wake the parked relays whose databases saw writes (see the module)."""
        activity = self.activity
        assert activity is not None
        try:
            while not self._stop.wait(self.watch_interval):
                with self._lock:
                    parked = [
                        one
                        for one in self._served.values()
                        if one.state == "serving" and one.relay.parked
                    ]
                if not parked:
                    continue
                try:
                    seen = activity.changed([one.database for one in parked])
                except Exception as exc:  # a bug of the watch: the relays look on their own
                    seen = {}
                    self._watch_log(
                        "the activity watch failed, parked databases are looked at on their "
                        "own schedule: %s",
                        redact_text(first_line(exc)),
                    )
                for one in parked:
                    one.relay.watched = one.database.name in seen
                    if seen.get(one.database.name):
                        one.relay.nudge()
        finally:
            activity.close()

    # -- one database --------------------------------------------------------------------------

    def _start(self, database: Database) -> None:
        remember_secrets(secrets_of_url(database.url))
        relay = self._make(database)
        relay.turns = self.turns
        relay.idle_disconnect = self.idle_disconnect
        if self.budget is not None:
            relay.budget = self.budget
            relay.holding = self.budget.holding(database.name, self.kind)
        relay.outage.what = f"{self.kind} of database {database.name} lost its connection"
        workers = getattr(relay, "workers_outage", None)
        if isinstance(workers, Outage):
            workers.what = f"handler workers of database {database.name} lost their connections"
        for outage in (relay.outage, getattr(relay, "workers_outage", None)):
            if isinstance(outage, Outage):
                # A database gone for good (dropped, say) must not log every few seconds for
                # as long as it is listed: one line a minute, attempts at most a minute apart.
                outage.backoff = RECONNECT_BACKOFF
                outage.log.interval = DATABASE_LOG_INTERVAL
        if self.observability is not None:
            self.observability.for_database(relay.observability, database.name)
        outage = Outage(
            f"{self.kind} cannot serve database {database.name}",
            log,
            DATABASE_BACKOFF,
            retry_all=True,
            log_interval=DATABASE_LOG_INTERVAL,
        )
        served = Served(database, relay, outage)
        served.thread = threading.Thread(
            target=self._main,
            args=(served,),
            name=f"outbox-{self.kind}-{database.name}",
            daemon=True,
        )
        with self._lock:
            self._served[database.name] = served
        served.thread.start()

    def _main(self, served: Served[R]) -> None:
        """Serve one database until its relay stops; its failures are its own (see module)."""
        relay = served.relay
        while not relay.stopping:
            try:
                with self._held(relay) as taken:
                    if not taken:
                        break  # stopping
                    relay.check_database()
                served.state = "serving"
                served.outage.recovered()
                self._serve(relay)
            except Exception as exc:
                if self._fatal is not None or relay.stopping:
                    return
                served.state = "failing"
                deadline = time.monotonic() + served.outage.failed(exc)
                while not relay.stopping and time.monotonic() < deadline:
                    relay.heartbeat.beat()
                    time.sleep(0.1)
        served.state = "stopped"

    def _held(self, relay: R) -> AbstractContextManager[bool]:
        """A connection of the budget for `relay`'s check (True at once without a budget)."""
        if self.budget is None or relay.holding is None:
            return nullcontext(True)
        return self.budget.held(
            relay.holding, stopping=lambda: relay.stopping, beat=relay.heartbeat.beat
        )

    def _join(self, served: Served[R]) -> None:
        thread = served.thread
        while thread is not None and thread.is_alive():
            thread.join(0.2)
            self.heartbeat.beat()

    def _retire(self, name: str) -> None:
        """Stop serving database `name` once its batch in hand is done."""
        with self._lock:
            served = self._served.get(name)
        if served is None:
            return
        served.relay.stop()
        self._join(served)
        with self._lock:
            self._served.pop(name, None)
        if self.budget is not None and served.relay.holding is not None:
            self.budget.forget(served.relay.holding)
        metrics = self.observability.metrics if self.observability is not None else None
        forget = getattr(metrics, "forget_database", None)
        if forget is not None:
            forget(name)

    # -- the databases file --------------------------------------------------------------------

    def _file_key(self) -> tuple[int, int, int] | None:
        return None if self.file is None else file_stamp(self.file)

    def _reread(self) -> None:
        """Apply the databases file if it changed; a bad one is logged once, the last good list
        kept."""
        assert self.file is not None
        key = self._file_key()
        if key == self._file_seen:
            return
        self._file_seen = key  # a bad file is read (and logged) once per change
        try:
            listed = check_distinct([*self.fixed, *read_file(self.file, self.default_schema)])
        except ConfigurationError as exc:
            self._file_log(
                "databases file not applied, still serving %d databases: %s",
                len(self.databases()),
                redact_text(first_line(exc)),
            )
            return
        self._apply(listed)

    def _apply(self, listed: Sequence[Database]) -> None:
        """Serve exactly `listed`: the databases no longer in it stop, the new ones start (a
        database whose URL or schema changed restarts)."""
        wanted = {database.name: database for database in listed}
        with self._lock:
            self._listed = list(listed)
            current = {name: served.database for name, served in self._served.items()}
        for name, database in current.items():
            if wanted.get(name) != database:
                log.info("database %s removed from the databases file: stopping", name)
                self._retire(name)
        for name, database in wanted.items():
            if current.get(name) != database:
                log.info("database %s added: serving it", database.describe())
                self._start(database)

    # -- health --------------------------------------------------------------------------------

    def _beats(self) -> list[Heartbeat]:
        with self._lock:
            return [served.relay.heartbeat for served in self._served.values()]

    def trouble(self) -> str | None:
        """Why the process is not ready: it serves no database right now."""
        with self._lock:
            served = list(self._served.values())
        for one in served:
            if one.state == "serving" and one.relay.outage.trouble() is None:
                return None
        if not served:
            return "no database to serve"
        return "no database is being served"

    def report(self) -> str:
        """How each database fares, for /readyz."""
        with self._lock:
            served = sorted(self._served.values(), key=lambda one: one.database.name)
        text = "databases: " + ", ".join(one.describe() for one in served)
        if self.budget is not None:
            text += "; " + self.budget.describe()
        return text
