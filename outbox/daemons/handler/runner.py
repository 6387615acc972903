"""The Handler runner: `consumer_queue` -> the service's decorated callbacks.

Contract: each message is handled in one database transaction that (1) locks its row, (2) runs
the callback with that transaction's connection or session, and (3) deletes the row and keeps its
message id in `consumer_processed` (decision 17). The callback's writes and "handled" commit
together or not at all, and the id stays for the dedup window, so a message is never handled
twice. A callback that
raises is rolled back, the error recorded, and the row retried with backoff until its handler's
`max_attempts`, then kept as dead. Messages of one key are handled in order: they share a lane,
a lane belongs to one worker of one process, and a key waits behind its failing message.

This module is the relay's side: the loop's hooks (a round of the workers over their own lanes,
the lease, retention) and the counts. The workers (worker.py, batches.py) fetch, claim and
handle their rows in their transactions, one statement taking the rows of a batch; every
statement is the inbox store's, reached through the ports of `outbox.ports` (`InboxDatabase`:
PostgreSQL's in outbox/postgres/relay_stores.py unless the wiring gives another).
"""

from __future__ import annotations

import logging
import threading
import time

from outbox.core.databases import Database
from outbox.core.handlers import Handlers
from outbox.core.inbox_rows import Pending
from outbox.core.lanes import LANES
from outbox.daemons.compat import refuse_unwired
from outbox.daemons.handler.config import HandlerConfig, check_async_support
from outbox.daemons.handler.failures import ConnectionLost, described
from outbox.daemons.handler.outcomes import Outcomes
from outbox.daemons.handler.slots import WorkerSlots
from outbox.daemons.handler.worker import Worker
from outbox.daemons.outages import Outage
from outbox.daemons.relay import LaneRelay, relay_target
from outbox.observability.runtime import Observability, Observer, observed
from outbox.ports import InboxSession, RelayStores

log = logging.getLogger("outbox.handler")

#: While a backlog keeps rounds full, each round takes up to twice the rows of the last one, up
#: to this many times `batch_size`: fewer rounds, and fewer waits for the slowest worker, per
#: message. A round that comes back short (the backlog is drained) goes back to `batch_size`.
BUSY_BATCH_FACTOR = 8

#: The last rows of consumer_queue whose topics the Handler compares with its registry at start.
RECENT_ROWS = 1000


class HandlerRunner(LaneRelay[Pending, InboxSession]):
    """Runs the callbacks of a `Handlers` registry over `consumer_queue` until asked to stop;
    `stores` says how to reach the queue of `database`, `observer` how it is observed. The
    composition root (`outbox.runtime.App`) chooses them."""

    kind = "handler"

    def __init__(
        self,
        config: HandlerConfig,
        handlers: Handlers,
        *,
        stores: RelayStores | None = None,
        database: Database | None = None,
        observer: Observer | None = None,
    ) -> None:
        refuse_unwired(type(self), stores=stores, database=database)
        assert stores is not None and database is not None
        target = relay_target(database, self.kind, config.relay_id, config.connect_timeout)
        self.inbox = stores.inbox(target)
        super().__init__(
            database=self.inbox,
            poll_interval=config.poll_interval,
            rebalance_interval=config.rebalance_interval,
            relay_id=config.relay_id,
        )
        self.config = config
        self.handlers = handlers
        self._unordered = handlers.unordered_topics
        self._workers: list[Worker] = []
        #: Serving one of several databases under a connection budget: the worker sessions
        #: the process's databases share (outbox/daemons/handler/slots.py). Then this relay's
        #: workers are those it holds sessions for, taken for a round with rows and given back
        #: while another database waits for one.
        self.slots: WorkerSlots | None = None
        self._limit = config.batch_size
        #: The last round came back short: every worker's last claim took fewer rows than it
        #: asked for (its lanes were drained). At start: look before the first round.
        self._short = True
        self._next_retention = 0.0
        self.outcomes = Outcomes(handlers)
        #: The workers' run of failures that retrying can fix (their sessions' connections).
        self.workers_outage = Outage("handler workers lost their database connections", log)
        self.observability = Observability(
            "handler",
            observer or Observer(),
            tuning=config,
            heartbeat=self.heartbeat,
            relay_id=config.relay_id,
            database=database,
            lanes=lambda: len(self.lanes),
        )
        self.observability.health.watch(self.outage.trouble)
        self.observability.health.watch(self.workers_outage.trouble)

    # -- lifecycle -----------------------------------------------------------------------------

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or an old schema
        (waiting for the database first if `--wait-for-database`), or a registry that cannot
        run here."""
        self.check_database(self.observability.config.wait_for_database)
        check_async_support(self.handlers)

    @observed
    def run(self) -> None:
        """Check, then handle messages until `stop()`; SIGTERM lets in-flight work finish."""
        self.check()
        self.serve_database()

    def serve_database(self) -> None:
        """Handle messages until `stop()`, its database checked (what a supervisor of several
        databases runs in each database's thread)."""
        with self.held() as taken:
            if taken:
                self._warn_unhandled_topics()
        self._start_workers()
        try:
            self.serve_forever()
        finally:
            self._stop_workers()
            log.info(
                "%shandler stopped: handled=%d failed=%d dead=%d",
                self.observability.where(),
                self.outcomes.handled,
                self.outcomes.failed,
                self.outcomes.dead,
            )

    def concurrency(self) -> int:
        """The workers of this database: `concurrency`, fewer under a small connection budget
        (its relay's connection and its workers' sessions are taken from it together), or at
        most the process's shared worker sessions."""
        if self.slots is not None:
            return min(self.config.concurrency, self.slots.size)
        budget = self.budget
        if budget is None or budget.size is None:
            return self.config.concurrency
        return max(1, min(self.config.concurrency, budget.size - 1))

    def footprint(self) -> int:
        # With shared worker sessions, the workers' come from their reserve, not with the relay's.
        return 1 if self.slots is not None else 1 + self.concurrency()

    def _start_workers(self) -> None:
        if not self._workers and self.slots is None:
            self._workers = [self._worker(i) for i in range(self.concurrency())]

    def _stop_workers(self) -> None:
        """Let the workers finish their group and close their sessions; shared sessions
        (`slots`: one per worker of this relay) go back."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.jobs.put(None)
        for worker in workers:
            worker.thread.join(30)
        if self.slots is not None and self.holding is not None:
            self.slots.give(self.holding, len(workers))

    def park(self) -> None:
        """Parked: the workers and their sessions go too (they come back with the rows)."""
        self._stop_workers()

    def _serve(self, conn: InboxSession) -> None:
        try:
            super()._serve(conn)
        finally:
            # Parked, yielding, stopping or its connection lost: the shared worker sessions go
            # back for the other databases (this relay takes them again with its next rows).
            if self.slots is not None:
                self._stop_workers()

    def wait_slice(self) -> float:
        # Holding shared worker sessions while idle: notice a database waiting for one sooner
        # (its message waits for them meanwhile).
        return 0.05 if self.slots is not None and self._workers else super().wait_slice()

    def _should_yield(self) -> bool:
        # Between rounds (the relay's idle wait, or after a round): with no rows left, the
        # shared worker sessions go to a database that waits for one.
        if self.slots is not None and self._workers and self._short and self.slots.waiting():
            self._stop_workers()
        return super()._should_yield()

    def _warn_unhandled_topics(self) -> None:
        """A WARNING per topic among the last rows stored that no handler of the registry
        reads: a consumer stores a topic this service does not handle, and those rows go dead.
        (A registered topic nobody consumes cannot be told from a quiet one here: the consumer
        warns about that, given the registry.) A look that fails is only logged: the loop
        meets the same database at once and handles its failures."""
        try:
            with self.connect() as conn:
                recent = conn.recent_topics(RECENT_ROWS)
        except Exception as exc:
            log.debug("could not look at the topics stored in consumer_queue: %s", described(exc))
            return
        for topic, rows in recent.items():
            if self.handlers.get(topic) is None:
                log.warning(
                    "consumer_queue holds rows of topic %r (%d of the last %d stored), which no "
                    "handler of this registry reads: they go dead; a consumer reads a topic this "
                    "service does not handle",
                    topic,
                    rows,
                    RECENT_ROWS,
                    extra={"topic": topic, "event": "handler.unhandled_topic"},
                )

    # -- the relay hooks -----------------------------------------------------------------------

    def work(self, conn: InboxSession, lanes: list[int]) -> bool:
        """A round: each worker fetches and claims the rows of its own lanes, a transaction
        at a time, up to its share of the round's limit; whether any row was taken.

        A worker without a database session takes part only once a look of the runner (one
        `fetch` of up to `batch_size` rows, whose rows it does not hand on) showed a row in its
        lanes: a worker whose lanes never have rows never connects, as when the runner handed
        out rows. The runner looks after a round that came back short (an idle Handler's polls
        start no round and take no turn) and before every round while a worker is without a
        session; while rounds come back full, or after a notification to a runner that holds
        every lane (the rows committed are its own: the look would cost a woken message a round
        trip before its claim), and every worker has one, it goes straight to the round (issue
        35). Holding only some lanes, it still looks: a notification for another process's
        lanes would cost each of its workers an empty claiming transaction.

        With worker sessions shared by the process's databases: `_shared_round`."""
        if self.slots is not None:
            return self._shared_round(conn, lanes)
        self._start_workers()
        workers = len(self._workers)
        shares = self._shares(lanes)
        dormant = any(not self._workers[index].connected for index in shares)
        wanted: set[int] = set()
        woken_for_its_own = self.notified and len(lanes) == LANES
        if dormant or (self._short and not woken_for_its_own):
            rows = conn.fetch(lanes, self.config.batch_size, self._unordered)
            if self._short and not rows:
                return False
            wanted = {row.lane % workers for row in rows}
        with self._turn():
            taken = self._round(conn, shares, wanted)
        return taken > 0

    def _shared_round(self, conn: InboxSession, lanes: list[int]) -> bool:
        """A round with the process's shared worker sessions (`slots`): look first unless
        workers are held and rounds come back full (or a notification woke a runner holding
        every lane); with rows, take sessions for as many workers as lanes with rows (up to
        `concurrency`), waiting for one when holding none; hand each worker `lane % workers`.
        A worker's lanes may go to another worker in a later round: rounds follow each other,
        and a worker replaced past its lease can no longer commit, so each lane's rows are
        still handled in order by one worker at a time. After the round, all of this
        database's sessions go back while another database waits for one, or when it has no
        more rows and no session is free."""
        slots, holding = self.slots, self.holding
        assert slots is not None and holding is not None, "shared workers need a budget"
        wanted = self.concurrency()
        woken_for_its_own = self.notified and len(lanes) == LANES
        if not self._workers or (self._short and not woken_for_its_own):
            rows = conn.fetch(lanes, self.config.batch_size, self._unordered)
            if not rows:
                self._short = True
                return False
            wanted = min(wanted, len({row.lane for row in rows}))
        taken_now = slots.take(
            holding,
            len(self._workers),
            wanted,
            stopping=lambda: self.stopping,
            beat=self.heartbeat.beat,
        )
        for _ in range(taken_now):
            self._workers.append(self._worker(len(self._workers)))
        if not self._workers:
            return False  # stopping
        shares = self._shares(lanes)
        with self._turn():
            taken = self._round(conn, shares, set(shares))
        if slots.waiting() or (self._short and slots.in_use() == slots.size):
            # Another database waits, or will: every session is taken and this database has
            # no more rows. (With sessions to spare, they stay: its next rows need no connect.)
            self._stop_workers()
        return taken > 0

    def _shares(self, lanes: list[int]) -> dict[int, list[int]]:
        """The lanes of each worker that has some (by index): `lane % concurrency`."""
        workers = len(self._workers)
        shares: dict[int, list[int]] = {}
        for lane in lanes:
            shares.setdefault(lane % workers, []).append(lane)
        return shares

    def next_due(self, conn: InboxSession, lanes: list[int]) -> float | None:
        return conn.next_due(lanes)

    def failures(self) -> int:
        return self.outcomes.failed

    def fetched_all(self) -> bool:
        return self._short

    def peek(self, conn: InboxSession) -> bool:
        return bool(conn.fetch(list(range(LANES)), 1, self._unordered))

    def _round(self, conn: InboxSession, shares: dict[int, list[int]], wanted: set[int]) -> int:
        """Give each worker with a session, or `wanted` (by index), its lanes (`shares`) and
        an even share of the limit among the workers that have lanes, wait for them while
        enforcing the lease, and size the next round: twice this one's limit while rounds come
        back full (up to `BUSY_BATCH_FACTOR` times `batch_size`; not while another database
        waits for a turn), else `batch_size`. The rows taken."""
        limit = self._limit
        quota = -(-limit // max(1, len(shares)))  # shared by the workers that have lanes
        waits = []
        for index, mine in shares.items():
            worker = self._workers[index]
            if worker.connected or index in wanted:
                done = threading.Event()
                worker.jobs.put((mine, quota, done))
                waits.append((worker, done))
        taken = 0
        short = True
        lost: ConnectionLost | None = None
        while waits:
            self.heartbeat.beat()
            worker, done = waits[0]
            if done.wait(0.1) or worker.retired:
                waits.pop(0)
                if worker.error is not None:
                    error, worker.error = worker.error, None
                    raise error  # retrying cannot fix it: the daemon stops (decision 15)
                if worker.lost is not None:
                    lost, worker.lost = worker.lost, None
                taken += worker.taken
                short = short and worker.short and not worker.retired
                continue
            for other, _ in waits:
                self._enforce_lease(conn, other)
        self._short = short and lost is None
        batch_size = self.config.batch_size
        grow = not short and not self.contended()
        self._limit = min(2 * limit, BUSY_BATCH_FACTOR * batch_size) if grow else batch_size
        if taken:
            self.observability.handler_batch(taken, self.outcomes.take_tally())
        if lost is None:
            self.workers_outage.recovered()
        else:
            if self.slots is not None:
                # The shared sessions go to the other databases while this one is away.
                self._stop_workers()
            # Their rows stay for the next look, after a backoff (no busy loop, no log flood).
            self.workers_outage.pause(
                self.workers_outage.failed(lost.error), self._stop, self.heartbeat.beat
            )
        return taken

    def _enforce_lease(self, conn: InboxSession, worker: Worker) -> None:
        """Take a message back from a callback that overran its lease, and replace its worker."""
        row, claim, pid = worker.current, worker.current_claim, worker.backend_pid
        if row is None or worker.retired:
            return
        elapsed = time.monotonic() - worker.started
        if elapsed <= self.config.lease:
            return
        worker.retired = True
        claimed = claim if claim is not None and claim.id == row.id else None
        message_id = str(claimed.message_id) if claimed is not None else "(not yet claimed)"
        log.error(
            "message %s (row %d) topic %r: handler ran %.1fs, past its lease of %.1fs; "
            "terminating its transaction and retrying the message",
            message_id,
            row.id,
            row.topic,
            elapsed,
            self.config.lease,
            extra={"topic": row.topic, "message_id": message_id},
        )
        if pid is not None:
            # Its writes roll back and its row lock is released: it can never commit now.
            conn.terminate(pid)
        self.outcomes.expired(row)
        spec = self.handlers.get(row.topic)
        expired = TimeoutError(f"lease of {self.config.lease:g}s expired")
        failed = self.outcomes.failure(row, spec, claimed, expired, conn.attempts(row.id))
        conn.fail(failed)
        self._workers[worker.index] = self._worker(worker.index)

    def housekeeping(self, conn: InboxSession, *, busy: bool) -> None:
        """Forget handled message ids older than the dedup window, in bounded batches.

        Runs every `retention_interval`, also while a backlog keeps the handler busy (then one
        batch at a time, so that handling is not held up), so the table cannot grow without
        bound under sustained load.
        """
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + self.config.retention_interval
        window, limit = self.config.dedup_window, self.config.retention_batch
        total = 0
        while True:
            forgotten = conn.forget_processed(window, limit)
            total += forgotten
            more = forgotten >= limit
            if busy and more:
                # One batch now and another after the next handled batch, until caught up:
                # forgetting keeps pace with handling without holding it up.
                self._next_retention = now
                break
            if not more or self.stopping:
                break
        if total:
            log.info("forgot %d processed messages older than the dedup window", total)

    # -- the workers and the counts ------------------------------------------------------------

    def _worker(self, index: int) -> Worker:
        return Worker(
            index, self.config, self.handlers, self.inbox, self.outcomes, lambda: self.stopping
        )

    @property
    def handled(self) -> int:
        """Callbacks committed so far."""
        return self.outcomes.handled

    @property
    def failed(self) -> int:
        """Failed attempts so far."""
        return self.outcomes.failed

    @property
    def dead(self) -> int:
        """Messages given up on so far."""
        return self.outcomes.dead

    @property
    def lease_expired(self) -> int:
        """Callbacks that overran their lease so far."""
        return self.outcomes.lease_expired
