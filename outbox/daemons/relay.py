"""The relay loop of both queue relays: own lanes, fetch, process, sleep without the NOTIFY trap.

A relay (the Producer on `producer_queue`, the Handler on `consumer_queue`) owns a fair share of
the lanes through PostgreSQL session advisory locks, which die with its connection; within a lane
rows are processed in id order, so several relays keep per-key order. When it has nothing to
do it sets its `relay_state.sleeping` flag, so writers NOTIFY only then, and polls on a
geometric schedule so a missed notification delays a row but never strands it. A woken relay
keeps the flag until it has found rows at every look for `AWAKE_AFTER` (decision 12).

Serving one of several databases (`outbox.daemons.supervisor`), a relay processes each batch in
a turn (`turns`), and after `idle_disconnect` seconds without rows it parks: it leaves its
lanes, closes its connection and looks for rows on a short-lived one, first after
`poll_interval`, then at intervals growing by `PARKED_GROWTH` up to `PARKED_SLOWDOWN` times it
while the database stays quiet, jittered so that the looks of many parked databases spread out
(no LISTEN while parked: a row waits up to that interval; hundreds of parked databases cost a
few connections a second, not one per database per poll interval).

The loop reaches its database only through the ports of `outbox.ports` (`QueueDatabase`, whose
sessions are `RelaySession`s): PostgreSQL's (outbox/postgres/relay_stores.py: advisory locks,
`relay_state`, LISTEN/NOTIFY) unless the wiring gives others, such as a unit test's in memory.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, TypeVar

from outbox.core.databases import Database
from outbox.core.ids import process_id
from outbox.core.lanes import LANES
from outbox.core.naps import AWAKE_AFTER
from outbox.daemons.budget import Budget, Holding
from outbox.daemons.outages import Outage
from outbox.daemons.turns import Turns
from outbox.observability.health import Heartbeat
from outbox.ports import QueueDatabase, RelaySession, RelayTarget

__all__ = ["LaneRelay", "new_relay_id", "relay_target"]

log = logging.getLogger("outbox.relay")

#: After going idle a relay polls again after these delays (seconds) before settling on the
#: poll interval; this bounds the delay of a row whose NOTIFY was skipped or lost.
IDLE_POLLS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
#: The shortest sleep of an idle relay (seconds), even for a retry due in less.
MIN_WAIT = 0.001
#: A parked relay's looks: each interval this much longer than the one before ...
PARKED_GROWTH = 1.5
#: ... up to this many times `poll_interval` (a quiet database's first row waits at most that),
PARKED_SLOWDOWN = 10.0
#: ... or this many while the process's activity watch sees the database (`watched`): the watch
#: wakes the relay when the database sees writes, these looks only catch what it missed.
PARKED_WATCHED_SLOWDOWN = 30.0
#: Each parked wait is drawn within ±this fraction of its interval.
PARKED_JITTER = 0.2
#: Seconds between a parked relay's "still there" (its row is forgotten after 10 minutes unseen).
PARKED_SEEN = 60.0
#: Seconds a relay stopping while parked waits for a connection of the budget to unregister.
LEAVE_WAIT = 2.0
#: The longest wait between a parked relay's own looks, whatever its poll interval: they say it
#: is still there.
PARKED_LONGEST = 240.0

Row = TypeVar("Row")
#: The relay's session on its queue (`outbox.ports`: OutboxSession, InboxSession).
S = TypeVar("S", bound=RelaySession)


def new_relay_id() -> str:
    """host:pid:random, unique per relay process and start."""
    return process_id()


def relay_target(
    database: Database, kind: str, relay_id: str, connect_timeout: float
) -> RelayTarget:
    """What a relay of `kind` ("producer", "handler") asks its store for: its queue in
    `database`, its connections named `outbox-KIND`."""
    return RelayTarget(
        database_url=database.url,
        schema=database.schema,
        kind=kind,
        relay_id=relay_id,
        connect_timeout=connect_timeout,
        application_name=f"outbox-{kind}",
    )


class LaneRelay(Generic[Row, S]):
    """Base of the relays: subclasses say how to fetch a batch and how to process it; every
    statement runs on a session (`S`) of `database`, the port the wiring chose."""

    #: The relay_state.queue value of this kind of relay.
    kind: str

    def __init__(
        self,
        *,
        database: QueueDatabase[S],
        poll_interval: float,
        rebalance_interval: float,
        relay_id: str,
    ) -> None:
        self.database = database
        self.poll_interval = poll_interval
        self.rebalance_interval = rebalance_interval
        self.relay_id = relay_id
        self._stop = threading.Event()
        self.lanes: set[int] = set()
        self._next_rebalance = 0.0
        #: `next_due` is asked before the next idle wait (see `_idle_timeout`) while this is set
        #: (lanes were taken since it was last asked, or a retry was waiting then) or while
        #: `failures()` differs from `_failures_seen`.
        self._due_unknown = True
        self._failures_seen = 0
        #: Beaten every turn of the loop and every connection attempt (for /livez).
        self.heartbeat = Heartbeat()
        #: The main loop's run of failures that retrying can fix (for its logs and /readyz).
        self.outage = Outage(f"{self.kind} lost the database connection", log)
        #: Serving one of several databases: the process's turns (a batch is processed in a
        #: turn) and the seconds without rows after which the relay parks (None: never).
        self.turns: Turns | None = None
        self.idle_disconnect: float | None = None
        #: Whether the relay is parked: no connection, looking for rows now and then.
        self.parked = False
        #: The interval before a parked relay's next look (see `PARKED_GROWTH`).
        self.parked_interval = poll_interval
        #: Whether the process's activity watch sees this relay's database (see `nudge`).
        self.watched = False
        #: Set by `stop` and `nudge`: ends a parked relay's wait.
        self._wake = threading.Event()
        #: The activity watch saw writes to this parked relay's database since its last look.
        self._nudged = False
        #: Back from parking on the watch's word alone: parks again at once if its first looks
        #: find nothing (the writes were to other tables).
        self._on_trial = False
        #: Whether the look about to be made follows a notification (rows were committed and
        #: notified since the last one), not a timed poll; `work` may read it.
        self.notified = False
        self._parked_seen = time.monotonic()
        self._waits_seen = 0
        #: Serving one of several databases under a connection budget: the process's budget
        #: and what this relay holds of it (outbox/daemons/budget.py).
        self.budget: Budget | None = None
        self.holding: Holding | None = None
        #: The relay gave its connections back to a database waiting for some (not parked:
        #: it had rows, it asks again at once, behind the others).
        self.yielded = False

    # -- for subclasses ------------------------------------------------------------------------

    def fetch(self, conn: S, lanes: list[int]) -> Sequence[Row]:
        """The next rows to process from `lanes`, in id order; empty when there is nothing."""
        raise NotImplementedError

    def process(self, conn: S, rows: Sequence[Row]) -> None:
        """Process one batch completely (a stop request waits for it)."""
        raise NotImplementedError

    def work(self, conn: S, lanes: list[int]) -> bool:
        """Process the next rows of `lanes` (in a turn when serving one of several databases);
        whether there were any. By default `fetch` and then `process` them."""
        rows = self.fetch(conn, lanes)
        if rows:
            with self._turn():
                self.process(conn, rows)
        return bool(rows)

    def next_due(self, conn: S, lanes: list[int]) -> float | None:
        """Seconds until the earliest scheduled retry in `lanes`, or None."""
        return None

    def failures(self) -> int:
        """A count that grows whenever this relay records a failed attempt (a row that may
        wait for a retry in its lanes). Only the lanes' owner records those, so an idle relay
        asks `next_due` again only after this grew or it took lanes."""
        return 0

    def wake_in(self) -> float | None:
        """Seconds until the relay wants to look again whatever else it waits for (a message
        of its lanes that falls due then), or None."""
        return None

    def fetched_all(self) -> bool:
        """Whether the last `fetch` took every row it could see (it came back short), so that
        a look right after processing them could only find rows committed since. Only then,
        with the sleeping flag kept (every such commit notifies) and no retry waiting, is that
        look skipped (see `_serve`)."""
        return False

    def housekeeping(self, conn: S, *, busy: bool) -> None:
        """Periodic work between batches (retention, for example); keep it short when `busy`."""

    def peek(self, conn: S) -> bool:
        """Whether any lane of the queue has a row to process now (a parked relay's look)."""
        return bool(self.fetch(conn, list(range(LANES))))

    def park(self) -> None:
        """The relay parked: release what it holds besides its connection (workers' sessions)."""

    def footprint(self) -> int:
        """The connections the relay holds while connected (its own; the handler's workers'
        sessions too), taken from the budget together."""
        return 1

    def held(self, count: int = 1) -> AbstractContextManager[bool]:
        """Hold `count` connections of the process's budget for the block (waiting for them);
        False when the relay stops meanwhile. Without a budget: always True, at once."""
        if self.budget is None or self.holding is None:
            return nullcontext(True)
        return self.budget.held(
            self.holding, count, stopping=lambda: self.stopping, beat=self.heartbeat.beat
        )

    def _should_yield(self) -> bool:
        budget, holding = self.budget, self.holding
        return budget is not None and holding is not None and budget.should_yield(holding)

    def _idle(self, since: float | None) -> None:
        """Tell the budget since when the relay found no rows (None: it is busy)."""
        holding = self.holding
        if holding is not None:
            holding.idle_since = since
            holding.busy = since is None

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the relay to finish the batch in hand and return from `serve_forever`."""
        self._stop.set()
        self._wake.set()

    def nudge(self) -> None:
        """Its database saw writes (the process's activity watch): a parked relay takes its
        lanes back now, without a separate look first (one connect, not two, for the rows that
        most likely came), and parks again at once if they were writes to other tables."""
        self._nudged = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def connect(self) -> S:
        """A new session on the relay's database (the driver's error if it cannot)."""
        self.heartbeat.beat()
        return self.database.connect()

    def check_database(self, wait: float = 0.0) -> None:
        """One clear error on an unreachable database (after waiting up to `wait` seconds
        for it) or a wrong schema."""
        self.database.check(wait, lambda: self.stopping, self.heartbeat.beat)

    def serve_forever(self) -> None:
        """Run until `stop()`. What retrying can fix (a lost connection, a server saying
        "later") is retried with backoff on a new connection, logged at most every few
        seconds; anything else is raised (decision 15)."""
        while not self.stopping:
            try:
                if self.parked:
                    wait = self.parked_interval * random.uniform(
                        1 - PARKED_JITTER, 1 + PARKED_JITTER
                    )
                    self.outage.pause(wait, self._wake, self.heartbeat.beat)
                    self._wake.clear()
                    nudged, self._nudged = self._nudged, False
                    if self.stopping or not (nudged or self._rows_waiting()):
                        slowdown = PARKED_WATCHED_SLOWDOWN if self.watched else PARKED_SLOWDOWN
                        self.parked_interval = min(
                            self.parked_interval * PARKED_GROWTH,
                            self.poll_interval * slowdown,
                            PARKED_LONGEST,
                        )
                        continue
                    self.parked = False
                    self._on_trial = nudged
                    log.debug("%s found rows: back to its lanes", self.kind)
                with self.held(self.footprint()) as taken:
                    if not taken:
                        continue  # stopping
                    self.yielded = False
                    conn = self.connect()
                    with conn:
                        self._serve(conn)
                    if self.parked or self.yielded:
                        self.park()
            except Exception as exc:
                self.lanes.clear()
                delay = self.outage.failed(exc)  # raises what retrying cannot fix
                self.outage.pause(delay, self._stop, self.heartbeat.beat)
        if self.parked:
            self._leave_parked()

    def _rows_waiting(self) -> bool:
        """A parked relay's look, on a connection of its own that it closes (within the
        process's connection budget); every `PARKED_SEEN` seconds it also says it is still there
        (its parked row is kept)."""
        with self.held() as taken:
            if not taken:
                return False  # stopping
            with self.connect() as conn:
                if time.monotonic() - self._parked_seen >= PARKED_SEEN:
                    conn.parked_seen()
                    self._parked_seen = time.monotonic()
                waiting = self.peek(conn)
        self.outage.recovered()
        return waiting

    def _leave_parked(self) -> None:
        """A relay stopped while parked: its parked row goes (best effort, within the process's
        connection budget, waiting at most `LEAVE_WAIT` for a connection of it: one left behind
        is forgotten once it is not seen for a while)."""
        try:
            if self.budget is None or self.holding is None:
                with self.connect() as conn:
                    conn.leave()
                return
            deadline = time.monotonic() + LEAVE_WAIT
            with self.budget.held(
                self.holding, stopping=lambda: time.monotonic() > deadline
            ) as taken:
                if taken:
                    with self.connect() as conn:
                        conn.leave()
        except Exception as exc:
            log.debug("%s could not unregister its parked row: %s", self.kind, exc)

    def shared_turns(self) -> list[Turns]:
        """The turns this relay shares with the relays of other databases."""
        return [] if self.turns is None else [self.turns]

    def contended(self) -> bool:
        """Whether a relay (of any database of the process) waited for a turn since the last
        call: then a busy relay's batches do not grow past `batch_size`, so that a quiet
        database waits for a batch of that size at most, not for one of several times it."""
        waits = sum(turns.waited for turns in self.shared_turns())
        contended, self._waits_seen = waits != self._waits_seen, waits
        return contended

    def _turn(self) -> AbstractContextManager[None]:
        """The turn a batch is processed in (none when the relay serves its database alone)."""
        return nullcontext() if self.turns is None else self.turns.turn(self.heartbeat.beat)

    # -- the loop ------------------------------------------------------------------------------

    def check_lock_class(self, conn: S) -> None:
        """Raise ConfigurationError if another queue table of this database has this relay's
        lock class: their relays would take each other's lanes for their own."""
        conn.check_lock_class()

    def _serve(self, conn: S) -> None:
        conn.join()
        self.lanes.clear()
        self._next_rebalance = 0.0
        sleeping = False
        idle_step = 0
        busy_since: float | None = None  # since when every look found rows
        idle_since = time.monotonic()  # since when no look found rows
        try:
            while not self.stopping:
                self.heartbeat.beat()
                self._rebalance(conn)
                looked = time.monotonic()
                found = self.work(conn, sorted(self.lanes)) if self.lanes else False
                self.outage.recovered()
                if found:
                    self._on_trial = False
                    if busy_since is None:
                        busy_since = looked
                    idle_since = time.monotonic()
                    self._idle(None)
                    if self._should_yield():
                        # Another database waits for connections and this one held them
                        # longest: give them back after this batch, ask again behind it.
                        self.yielded = True
                        log.debug("%s gives its connections to a waiting database", self.kind)
                        return
                    if sleeping and time.monotonic() - busy_since >= AWAKE_AFTER:
                        # Sustained load (outbox/core/naps.py): writers stop notifying. After
                        # the rows, not before: the flag only spares writers a NOTIFY, and a
                        # round trip before them would delay every message woken for.
                        conn.set_sleeping(False)
                        sleeping = False
                    self.housekeeping(conn, busy=True)
                    self.notified = False
                    if sleeping and self._nothing_left() and not self._notified(conn, 0):
                        # The look would find nothing: every row committed since the fetch
                        # notified (the flag is set) and no notification came, none was held
                        # back for a retry, and the fetch came back short. Wait as after an
                        # empty look. (A notification that came means rows: look, and count
                        # the time as busy, so that sustained load still ends the nap.)
                        busy_since = None
                        self._wait(conn, self._idle_timeout(conn, idle_step))
                        idle_step += 1
                    continue
                busy_since = None
                self._idle(idle_since)
                self.notified = False
                if not sleeping:
                    # Announce the nap, then look once more: a row committed before the flag
                    # was visible to its writer would otherwise wait for the next poll. Only
                    # here can a writer have missed the flag (it reads it when it sends), so
                    # the idle schedule starts again here, not at every wake-up.
                    conn.set_sleeping(True)
                    sleeping = True
                    idle_step = 0
                    self.housekeeping(conn, busy=False)
                    continue
                # Back on the watch's word and nothing found: the writes were to other tables.
                trial_over = self._on_trial
                idle_for = time.monotonic() - idle_since
                why = (
                    "woken by writes to its database, found no rows"
                    if trial_over
                    else f"idle for {idle_for:.0f}s"
                    if self.idle_disconnect is not None and idle_for >= self.idle_disconnect
                    else "gives its connection to a waiting database"
                    if self._should_yield()
                    else None
                )
                if why is not None:
                    self.parked = True  # serve_forever looks for rows without a connection
                    self._on_trial = False
                    if not trial_over:  # (a trial keeps the parked relay's grown interval)
                        self.parked_interval = self.poll_interval
                    self._parked_seen = time.monotonic()
                    log.debug("%s %s: parked", self.kind, why)
                    return
                self._wait(conn, self._idle_timeout(conn, idle_step))
                idle_step += 1
        finally:
            if not conn.closed:
                conn.leave(self.parked)  # a parked relay stays listed, as parked
            if self.parked:
                self.lanes.clear()

    def _nothing_left(self) -> bool:
        """After a batch: no row of the owned lanes can be due that the fetch did not take (see
        `fetched_all`), no retry can wait (a key held back for one is freed when it succeeds),
        and no rebalance is due (it may take lanes)."""
        return (
            self.fetched_all()
            and not self._retry_may_wait()
            and time.monotonic() < self._next_rebalance
        )

    def _retry_may_wait(self) -> bool:
        """Whether a retry can be waiting in the owned lanes: one was when `next_due` was last
        asked, lanes were taken since, or a failure was recorded since (decision 12)."""
        return self._due_unknown or self.failures() != self._failures_seen

    def _idle_timeout(self, conn: S, step: int) -> float:
        """How long to sleep after a fetch found nothing: the idle schedule's next step, or less
        if a retry falls due sooner. Never 0: a retry that is due already, although the fetch
        just found nothing, is waited for on the schedule, which grows (no busy loop)."""
        timeout = IDLE_POLLS[step] if step < len(IDLE_POLLS) else self.poll_interval
        timeout = min(timeout, self.poll_interval)
        if self.lanes and self._retry_may_wait():
            # Asked only when a retry can be waiting (decision 12): asking before every idle
            # wait cost a statement per wake-up.
            self._failures_seen = self.failures()
            due = self.next_due(conn, sorted(self.lanes))
            self._due_unknown = due is not None
            if due is not None and due > 0:
                timeout = min(timeout, max(due, MIN_WAIT))
        wake = self.wake_in()
        if wake is not None:
            timeout = min(timeout, max(wake, MIN_WAIT))
        return timeout

    def _wait(self, conn: S, timeout: float) -> None:
        """Sleep until a NOTIFY, `timeout` or stop, whichever comes first."""
        deadline = time.monotonic() + timeout
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # Short slices keep SIGTERM prompt; a notification ends the wait at once, and so
            # does another database waiting for this relay's connections (it parks then).
            if self._notified(conn, min(remaining, self.wait_slice())) or self._should_yield():
                return

    def wait_slice(self) -> float:
        """How often an idle wait looks at `stopping` and `_should_yield` (seconds)."""
        return 0.2

    def _notified(self, conn: S, timeout: float) -> bool:
        """`conn.notified(timeout)`, remembered in `notified` for the next look."""
        self.notified = conn.notified(timeout)
        return self.notified

    def _rebalance(self, conn: S) -> None:
        """Hold a fair share of the lanes: ceil(LANES / live relays of this kind)."""
        now = time.monotonic()
        if now < self._next_rebalance:
            return
        self._next_rebalance = now + self.rebalance_interval
        target = math.ceil(LANES / conn.live_relays())
        if len(self.lanes) > target:
            for lane in sorted(self.lanes)[target:]:
                conn.unlock(lane)
                self.lanes.discard(lane)
        elif len(self.lanes) < target:
            held = conn.held()
            free = [lane for lane in range(LANES) if lane not in held]
            random.shuffle(free)
            # As many as it lacks in one statement, then more if others took some meanwhile:
            # a relay taking its 64 lanes after a connect costs one round trip, not 64.
            while free and len(self.lanes) < target:
                lacking = target - len(self.lanes)
                wanted, free = free[:lacking], free[lacking:]
                for lane in conn.lock_each(wanted):
                    self.lanes.add(lane)
                    self._due_unknown = True
