"""The loop both queue relays share: own lanes, fetch, process, and sleep without the NOTIFY trap.

A relay (the Producer on `producer_queue`, the Handler on `consumer_queue`) owns a fair share of
the lanes through PostgreSQL session advisory locks, which die with its connection; within a lane
rows are processed in id order, so several relays keep per-key order. While it has nothing to
do it sets its `relay_state.sleeping` flag, so writers NOTIFY only then, and polls on a
geometric schedule so a missed notification delays a row but never strands it.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.rows import tuple_row
from tenacity import Retrying, retry_if_exception_type, wait_exponential

from outbox.core.errors import ConfigurationError, DatabaseUnavailable
from outbox.core.lanes import LANES
from outbox.observability.health import Heartbeat
from outbox.observability.redact import redact_text
from outbox.postgres.migrate import check_schema
from outbox.postgres.queries import channel, queries, quote_ident

log = logging.getLogger("outbox.relay")

#: After going idle a relay polls again after these delays (seconds) before settling on the
#: poll interval; this bounds the delay of a row whose NOTIFY was skipped or lost.
IDLE_POLLS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
#: The shortest sleep of an idle relay (seconds), even for a retry due in less.
MIN_WAIT = 0.001

Connection = psycopg.Connection[tuple[Any, ...]]
Row = TypeVar("Row")


def new_relay_id() -> str:
    """host:pid:random, unique per relay process and start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text, for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(url: str, *, timeout: float, application_name: str) -> Connection:
    """An autocommit connection for a relay's control loop."""
    return psycopg.connect(
        url,
        autocommit=True,
        row_factory=tuple_row,
        connect_timeout=max(1, int(timeout)),
        application_name=application_name,
    )


def retrying_database(stopping: Callable[[], bool], what: str) -> Retrying:
    """Retry on a lost or refused database connection, backing off up to 5 s, until it works
    or `stopping()`; then the last error is raised."""
    return Retrying(
        retry=retry_if_exception_type(psycopg.OperationalError),
        wait=wait_exponential(multiplier=0.1, max=5),
        stop=lambda _state: stopping(),
        reraise=True,
        before_sleep=lambda state: log.warning(
            "%s (attempt %d): %s",
            what,
            state.attempt_number,
            state.outcome.exception() if state.outcome else "",
        ),
    )


def check_database(
    open_connection: Callable[[], Connection],
    schema: str,
    *,
    wait: float = 0.0,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Connect and check the schema version; one clear error for either failure.

    With `wait` > 0, a refused connection (PostgreSQL down or still starting) is retried with
    backoff, a WARNING each time, for up to `wait` seconds or until `stopping()`; a wrong
    schema version is never waited for.
    """
    deadline = time.monotonic() + wait
    delay = 0.2
    attempt = 0
    while True:
        attempt += 1
        try:
            conn = open_connection()
            break
        except psycopg.Error as exc:
            error = redact_text(f"cannot connect to PostgreSQL: {first_line(exc)}")
            left = deadline - time.monotonic()
            if left <= 0 or stopping():
                raise DatabaseUnavailable(error) from None
            log.warning(
                "%s (attempt %d; waiting up to %.0fs more, --wait-for-database)",
                error,
                attempt,
                left,
            )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
    with conn:
        check_schema(conn, schema)


def lock_class(schema: str, table: str) -> int:
    """The first key of the advisory locks of a queue table's lanes (the lane is the second)."""
    return zlib.crc32(f"{schema}.{table}".encode()) & 0x7FFFFFFF


class LaneRelay(Generic[Row]):
    """Base of the relays: subclasses say how to fetch a batch and how to process it."""

    #: Which table the relay drains: "producer_queue" or "consumer_queue".
    table: str
    #: The relay_state.queue value of this kind of relay.
    kind: str
    #: Planner settings for the relay's own session (see `_serve`).
    planner_settings: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        database_url: str,
        schema: str,
        poll_interval: float,
        rebalance_interval: float,
        connect_timeout: float,
        relay_id: str,
    ) -> None:
        self.database_url = database_url
        self.schema = schema
        self.poll_interval = poll_interval
        self.rebalance_interval = rebalance_interval
        self.connect_timeout = connect_timeout
        self.relay_id = relay_id
        self.sql = queries(schema)
        self.channel = channel(schema, self.table)
        self._lock_class = lock_class(schema, self.table)
        self._stop = threading.Event()
        self.lanes: set[int] = set()
        self._next_rebalance = 0.0
        #: Beaten every turn of the loop and every connection attempt (for /livez).
        self.heartbeat = Heartbeat()

    # -- for subclasses ------------------------------------------------------------------------

    def fetch(self, conn: Connection, lanes: list[int]) -> Sequence[Row]:
        """The next rows to process from `lanes`, in id order; empty when there is nothing."""
        raise NotImplementedError

    def process(self, conn: Connection, rows: Sequence[Row]) -> None:
        """Process one batch completely (a stop request waits for it)."""
        raise NotImplementedError

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        """Seconds until the earliest scheduled retry in `lanes`, or None."""
        return None

    def housekeeping(self, conn: Connection, *, busy: bool) -> None:
        """Periodic work between batches (retention, for example); keep it short when `busy`."""

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the relay to finish the batch in hand and return from `serve_forever`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def connect(self) -> Connection:
        self.heartbeat.beat()
        return connect(
            self.database_url,
            timeout=self.connect_timeout,
            application_name=f"outbox-{self.kind}",
        )

    def check_database(self, wait: float = 0.0) -> None:
        """One clear error on an unreachable database (after waiting up to `wait` seconds
        for it) or a wrong schema."""
        check_database(self.connect, self.schema, wait=wait, stopping=lambda: self.stopping)

    def serve_forever(self) -> None:
        """Run until `stop()`; reconnect with backoff whenever the database connection drops."""
        while not self.stopping:
            try:
                conn = self._connect_retrying()
            except psycopg.OperationalError:
                break  # raised only once stopping
            try:
                with conn:
                    self._serve(conn)
            except psycopg.OperationalError as exc:
                log.warning("%s lost the database connection (%s); reconnecting", self.kind, exc)
                self.lanes.clear()

    def _connect_retrying(self) -> Connection:
        for attempt in retrying_database(lambda: self.stopping, "cannot reach PostgreSQL"):
            with attempt:
                return self.connect()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the loop ------------------------------------------------------------------------------

    def check_lock_class(self, conn: Connection) -> None:
        """Raise ConfigurationError if another queue table of this database has this relay's
        lock class: their relays would take each other's lanes for their own."""
        for schema, table in conn.execute(self.sql["relay_queue_tables"]):
            if (schema, table) != (self.schema, self.table) and (
                lock_class(schema, table) == self._lock_class
            ):
                raise ConfigurationError(
                    f"the lanes of {self.schema}.{self.table} and {schema}.{table} would share "
                    f"the advisory lock class {self._lock_class} (a crc32 collision): rename "
                    "one of the schemas"
                )

    def _serve(self, conn: Connection) -> None:
        relay = {"relay_id": self.relay_id, "queue": self.kind}
        self.check_lock_class(conn)
        conn.execute(self.sql["relay_forget_dead"])
        conn.execute(self.sql["relay_register"], relay)
        conn.execute(f"LISTEN {quote_ident(self.channel)}")
        # A queue table's statistics are wrong most of the time: autovacuum last saw it empty,
        # or saw a burst that has since drained. A relay that trusts them sorts the whole
        # backlog on every fetch, or scans the table once per id of a batch; a relay that
        # says which plans it wants does neither. Only this session is affected.
        for setting in self.planner_settings:
            conn.execute(f"SET {setting}")
        self.lanes.clear()
        self._next_rebalance = 0.0
        sleeping = False
        idle_step = 0
        try:
            while not self.stopping:
                self.heartbeat.beat()
                self._rebalance(conn)
                rows = self.fetch(conn, sorted(self.lanes)) if self.lanes else []
                if rows:
                    if sleeping:
                        conn.execute(self.sql["relay_set_sleeping"], {**relay, "sleeping": False})
                        sleeping = False
                    idle_step = 0
                    self.process(conn, rows)
                    self.housekeeping(conn, busy=True)
                    continue
                if not sleeping:
                    # Announce the nap, then look once more: a row committed before the flag
                    # was visible to its writer would otherwise wait for the next poll.
                    conn.execute(self.sql["relay_set_sleeping"], {**relay, "sleeping": True})
                    sleeping = True
                    self.housekeeping(conn, busy=False)
                    continue
                self._wait(conn, self._idle_timeout(conn, idle_step))
                idle_step += 1
        finally:
            if not conn.closed:
                conn.execute(self.sql["relay_unregister"], relay)

    def _idle_timeout(self, conn: Connection, step: int) -> float:
        """How long to sleep after a fetch found nothing: the idle schedule's next step, or less
        if a retry falls due sooner. Never 0: a retry that is due already, although the fetch
        just found nothing, is waited for on the schedule, which grows (no busy loop)."""
        timeout = IDLE_POLLS[step] if step < len(IDLE_POLLS) else self.poll_interval
        timeout = min(timeout, self.poll_interval)
        if self.lanes:
            due = self.next_due(conn, sorted(self.lanes))
            if due is not None and due > 0:
                timeout = min(timeout, max(due, MIN_WAIT))
        return timeout

    def _wait(self, conn: Connection, timeout: float) -> None:
        """Sleep until a NOTIFY, `timeout` or stop, whichever comes first."""
        deadline = time.monotonic() + timeout
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # Short slices keep SIGTERM prompt; a notification ends the wait at once. (Do not
            # nest notifies() calls: the generator holds the connection lock while suspended.)
            for _ in conn.notifies(timeout=min(remaining, 0.2), stop_after=1):
                return

    def _rebalance(self, conn: Connection) -> None:
        """Hold a fair share of the lanes: ceil(LANES / live relays of this kind)."""
        now = time.monotonic()
        if now < self._next_rebalance:
            return
        self._next_rebalance = now + self.rebalance_interval
        conn.execute(self.sql["relay_forget_dead"])
        row = conn.execute(self.sql["relay_count"], {"queue": self.kind}).fetchone()
        relays = max(1, int(row[0]) if row else 1)
        target = math.ceil(LANES / relays)
        lock = {"lock_class": self._lock_class}
        if len(self.lanes) > target:
            for lane in sorted(self.lanes)[target:]:
                conn.execute(self.sql["relay_lane_unlock"], {**lock, "lane": lane})
                self.lanes.discard(lane)
        elif len(self.lanes) < target:
            held = {r[0] for r in conn.execute(self.sql["relay_lanes_held"], lock)}
            free = [lane for lane in range(LANES) if lane not in held]
            random.shuffle(free)
            for lane in free:
                if len(self.lanes) >= target:
                    break
                got = conn.execute(self.sql["relay_lane_lock"], {**lock, "lane": lane}).fetchone()
                if got and got[0]:
                    self.lanes.add(lane)
