"""Handler worker sessions shared by the databases of one process (issue 36).

Contract (docs/how-to/many-databases.md, "A connection budget"):

- Under a connection budget (`--max-connections`), a handler serving several databases runs at
  most `size` worker sessions at once across all of them, not `--concurrency` per database: a
  database's relay holds one connection of the budget, and takes worker sessions here only for
  a round that has rows to handle.
- The `size` connections are reserved in the budget when the handler starts (a holding called
  `(handler workers)`), so a relay never waits for a worker's session while other relays hold
  the connections it would need: no deadlock. A session in use is counted against the database
  it serves (moved from the reserve to that database's holding, and back).
- A relay holding no worker session waits for one, first come first served; holding some, it
  takes more only when they are free and nobody waits. A relay gives all of its sessions back
  after a round while another waits, after a round that left it no rows when none is free, and
  idle, when another comes to wait (within 0.05 s, from its idle wait): databases with rows
  take turns for the workers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from outbox.daemons.budget import Budget, Holding, wait_in_line

__all__ = ["RESERVE", "WorkerSlots"]

#: The name the reserve of worker sessions is listed under (no database can be called so).
RESERVE = "(handler workers)"


class WorkerSlots:
    """At most `size` handler worker sessions at once for the databases of a process."""

    def __init__(self, budget: Budget, size: int) -> None:
        if size < 1:
            raise ValueError(f"handler workers need at least 1 session, got {size}")
        self.budget = budget
        self.size = budget.fits(size)
        self.reserve = budget.holding(RESERVE, "handler")
        self.reserve.permanent = True
        # Taken before any relay runs: the budget is empty then, so this does not wait.
        if not budget.try_acquire(self.reserve, self.size):
            budget.acquire(self.reserve, self.size)
        self._cond = threading.Condition()
        self._free = self.size
        self._waiting: deque[object] = deque()
        #: The most sessions in use at once so far (for tests and benchmarks).
        self.peak = 0

    def take(
        self,
        holding: Holding,
        held: int,
        wanted: int,
        *,
        stopping: Callable[[], bool] = lambda: False,
        beat: Callable[[], None] | None = None,
    ) -> int:
        """More sessions for a relay (`holding`) that holds `held` and wants `wanted` in all:
        those free now if nobody waits; holding none, it waits for one, behind those who asked
        first (0 if `stopping()` became true meanwhile). How many it took."""
        more = wanted - held
        if more <= 0:
            return 0
        with self._cond:
            if held == 0:
                if not wait_in_line(
                    self._cond,
                    self._waiting,
                    object(),
                    lambda: self._free > 0,
                    stopping=stopping,
                    beat=beat,
                ):
                    return 0
                # Others waiting behind: one each, they are served in turn.
                count = 1 if self._waiting else min(more, self._free)
            elif self._waiting:
                return 0
            else:
                count = min(more, self._free)
            self._free -= count
            self.peak = max(self.peak, self.size - self._free)
            self.budget.transfer(self.reserve, holding, count)
            return count

    def give(self, holding: Holding, count: int) -> None:
        """`count` sessions of `holding`'s relay are closed: back to the reserve."""
        if count <= 0:
            return
        with self._cond:
            self._free += count
            self.budget.transfer(holding, self.reserve, count)
            self._cond.notify_all()

    def waiting(self) -> bool:
        """Whether a relay waits for a worker session now."""
        with self._cond:
            return bool(self._waiting)

    def in_use(self) -> int:
        with self._cond:
            return self.size - self._free
