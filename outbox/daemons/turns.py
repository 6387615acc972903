"""Fair turns between the relays of several databases in one process.

Contract: at most `slots` holders at once, and a relay that asks for a turn while all are taken
gets one before any relay that asks after it (first come, first served). A relay takes a turn
per batch and asks again for the next, so a database with a backlog goes to the back of the
line after each batch: a quiet database waits at most `slots` batches of the others.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: How often a relay waiting for its turn beats its heartbeat (seconds).
BEAT_EVERY = 0.2


class Turns:
    """A FIFO (ticket) semaphore of `slots` turns."""

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"turns need at least 1 slot, got {slots}")
        self.slots = slots
        self._lock = threading.Lock()
        self._free = slots
        self._waiting: deque[threading.Event] = deque()
        #: Turns given so far, and how many of them had to wait (for tests and benchmarks).
        self.given = 0
        self.waited = 0

    def acquire(self, beat: Callable[[], None] | None = None) -> None:
        """Wait for a turn, behind every relay that asked before (beating `beat` meanwhile)."""
        with self._lock:
            self.given += 1
            if self._free and not self._waiting:
                self._free -= 1
                return
            self.waited += 1
            mine = threading.Event()
            self._waiting.append(mine)
        while not mine.wait(BEAT_EVERY):
            if beat is not None:
                beat()

    def release(self) -> None:
        """End a turn: hand it to the first relay waiting, if any."""
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()  # the slot passes on; it is never free between
            else:
                self._free += 1

    @contextmanager
    def turn(self, beat: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold a turn for the block."""
        self.acquire(beat)
        try:
            yield
        finally:
            self.release()

    def queued(self) -> int:
        """Relays waiting for a turn now."""
        with self._lock:
            return len(self._waiting)
