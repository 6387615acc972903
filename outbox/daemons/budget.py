"""A process's connection budget: the connections it holds to its databases, at most `size`.

Contract (docs/how-to/many-databases.md, "A connection budget"):

- Every connection a daemon serving several databases opens to one of them is taken from the
  process's budget first and given back when it closes: a relay's connection (with, for the
  handler, the sessions of its workers, reserved together so that no relay can wait for a
  worker's session while holding its own: no deadlock), a parked relay's short look, a start-up
  check, the consumer's connection per database. Never more than `size` at once.
- Short of connections, a database waits for one (first come, first served), it does not fail.
  While some wait, the holders idle longest, one per waiter, are asked to give their
  connections back (`should_yield`: a relay parks, the consumer closes that database's
  connection); when none is idle, those that have held their connections longest give them back
  after their batch in hand, once they held them `FAIR_HOLD` seconds, and wait behind the
  others: busy databases take turns.
- `holders()` says who holds what, for /readyz and the `outbox_connections` metric.
- A handler serving several databases reserves its shared worker sessions at start
  (outbox/daemons/handler/slots.py): a permanent holding, never asked to yield, listed apart
  (`reserved()`); a session in use is moved onto the database it serves (`transfer`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["FAIR_HOLD", "Budget", "Holding", "wait_in_line"]

#: Seconds a busy holder keeps its connections while another database waits for some.
FAIR_HOLD = 2.0
#: How often a holder waiting for connections beats its heartbeat (seconds).
BEAT_EVERY = 0.2


def wait_in_line(
    cond: threading.Condition,
    line: deque[Any],
    entry: object,
    ready: Callable[[], bool],
    *,
    stopping: Callable[[], bool] = lambda: False,
    beat: Callable[[], None] | None = None,
) -> bool:
    """With `cond` held: queue `entry` at the end of `line` and wait until it is first and
    `ready()` (beating `beat` every `BEAT_EVERY` seconds meanwhile); False if `stopping()`
    became true first. `entry` leaves the line either way, and the others are woken."""
    line.append(entry)
    try:
        while not (line[0] is entry and ready()):
            if stopping():
                return False
            cond.wait(BEAT_EVERY)
            if beat is not None:
                beat()
        return True
    finally:
        line.remove(entry)
        cond.notify_all()


class Holding:
    """What one holder (a database's relay, say) holds of the budget."""

    __slots__ = ("busy", "count", "database", "idle_since", "kind", "permanent", "since")

    def __init__(self, database: str, kind: str) -> None:
        self.database = database
        self.kind = kind
        self.count = 0
        #: When the holder took its connections (monotonic).
        self.since = 0.0
        #: Since when the holder found no work (None: it is busy or holds nothing).
        self.idle_since: float | None = None
        self.busy = False
        #: Held for the process's life (the handler's shared worker sessions, reserved at
        #: start): never asked to give its connections back.
        self.permanent = False


class Budget:
    """At most `size` connections for the process (see the module); None: unlimited."""

    def __init__(self, size: int | None) -> None:
        if size is not None and size < 1:
            raise ValueError(f"a connection budget needs at least 1 connection, got {size}")
        self.size = size
        self._cond = threading.Condition()
        self._used = 0
        self._holdings: list[Holding] = []
        self._waiting: deque[tuple[Holding, int]] = deque()
        #: The most connections held at once so far (for tests and benchmarks).
        self.peak = 0

    def holding(self, database: str, kind: str) -> Holding:
        """A new holder's record (it holds nothing yet)."""
        holding = Holding(database, kind)
        with self._cond:
            self._holdings.append(holding)
        return holding

    def forget(self, holding: Holding) -> None:
        """The holder is gone (it released what it held)."""
        with self._cond:
            if holding in self._holdings:
                self._holdings.remove(holding)

    def fits(self, count: int) -> int:
        """`count` capped to the budget (a handler's workers, say)."""
        return count if self.size is None else max(1, min(count, self.size))

    def acquire(
        self,
        holding: Holding,
        count: int = 1,
        *,
        stopping: Callable[[], bool] = lambda: False,
        beat: Callable[[], None] | None = None,
    ) -> bool:
        """Take `count` connections for `holding`, waiting behind those who asked first;
        False if `stopping()` became true meanwhile (nothing taken)."""
        count = self.fits(count)
        entry = (holding, count)
        with self._cond:
            if not wait_in_line(
                self._cond,
                self._waiting,
                entry,
                lambda: self._free() >= count,
                stopping=stopping,
                beat=beat,
            ):
                return False
            self._take(holding, count)
            return True

    def try_acquire(self, holding: Holding, count: int = 1) -> bool:
        """Take `count` connections now if they are free and nobody waits."""
        count = self.fits(count)
        with self._cond:
            if self._waiting or self._free() < count:
                return False
            self._take(holding, count)
            return True

    def release(self, holding: Holding, count: int | None = None) -> None:
        """Give back `count` of `holding`'s connections (default: all)."""
        with self._cond:
            given = holding.count if count is None else min(count, holding.count)
            holding.count -= given
            self._used -= given
            if holding.count == 0:
                holding.idle_since = None
                holding.busy = False
            self._cond.notify_all()

    def transfer(self, giver: Holding, taker: Holding, count: int) -> None:
        """Move `count` connections from `giver` to `taker` (a worker session reserved for
        the process's handler workers now serving `taker`'s database, or back): the process
        holds as many as before, each counted against the database it serves."""
        with self._cond:
            count = min(count, giver.count)
            giver.count -= count
            if taker.count == 0:
                taker.since = time.monotonic()
            taker.count += count

    @contextmanager
    def held(
        self,
        holding: Holding,
        count: int = 1,
        *,
        stopping: Callable[[], bool] = lambda: False,
        beat: Callable[[], None] | None = None,
    ) -> Iterator[bool]:
        """Hold `count` connections for the block (False: stopping, none held)."""
        taken = self.acquire(holding, count, stopping=stopping, beat=beat)
        try:
            yield taken
        finally:
            if taken:
                self.release(holding, self.fits(count))

    def _free(self) -> int:
        return 1 << 30 if self.size is None else self.size - self._used

    def _take(self, holding: Holding, count: int) -> None:
        if holding.count == 0:
            holding.since = time.monotonic()
        holding.count += count
        self._used += count
        self.peak = max(self.peak, self._used)

    # -- sharing -------------------------------------------------------------------------------

    def waiting(self) -> int:
        """How many holders wait for connections now."""
        with self._cond:
            return len(self._waiting)

    def should_yield(self, holding: Holding) -> bool:
        """Whether `holding` should give its connections back now: holders wait and it is among
        the holders idle longest, one per waiter, or, none being idle, among the busy ones
        holding longest, past `FAIR_HOLD`."""
        with self._cond:
            if not self._waiting or holding.count == 0:
                return False
            waiters = {id(one) for one, _ in self._waiting}
            held = [
                one
                for one in self._holdings
                if one.count and id(one) not in waiters and not one.permanent
            ]
            idle = [one for one in held if one.idle_since is not None and not one.busy]
            wanted = len(self._waiting)
            if idle:
                idle.sort(key=lambda one: one.idle_since or 0.0)
                return any(one is holding for one in idle[:wanted])
            now = time.monotonic()
            ready = sorted(
                (one for one in held if now - one.since >= FAIR_HOLD), key=lambda one: one.since
            )
            return any(one is holding for one in ready[:wanted])

    def holders(self) -> dict[str, int]:
        """Connections held now per database (summed over its holders)."""
        with self._cond:
            counts: dict[str, int] = {}
            for one in self._holdings:
                if one.count and not one.permanent:
                    counts[one.database] = counts.get(one.database, 0) + one.count
            return counts

    def used(self) -> int:
        with self._cond:
            return self._used

    def describe(self) -> str:
        """`connections: USED of SIZE (NAME N, ...), R reserved for handler workers, W waiting`,
        for /readyz."""
        holders = self.holders()
        size = "unlimited" if self.size is None else str(self.size)
        shown = ", ".join(f"{name} {count}" for name, count in sorted(holders.items()))
        text = f"connections: {sum(holders.values())} of {size}"
        if shown:
            text += f" ({shown})"
        reserved = self.reserved()
        if reserved:
            text += f", {reserved} reserved for handler workers"
        waiting = self.waiting()
        if waiting:
            text += f", {waiting} waiting"
        return text

    def reserved(self) -> int:
        """Connections held for the process's life and not serving a database now (the
        handler's shared worker sessions not in use: outbox/daemons/handler/slots.py)."""
        with self._cond:
            return sum(one.count for one in self._holdings if one.permanent)
