"""Throughput sampled in the console's process: counters read every few seconds, kept a while.

Each sample is `outbox.console.reads.counters` of one database; a rate is the difference of two
successive samples of a cumulative counter (written, relayed) over the time between them (a
counter that went down, after a statistics reset, counts as 0), or the rows a sample counted
since the previous one (received, handled) over that time.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from outbox.console.reads import Counters

#: How long samples are kept (seconds): the chart covers this much.
WINDOW_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Rate:
    """Rows per second between two samples; `at` is the later sample's time (epoch seconds)."""

    at: float
    written: float
    relayed: float
    received: float
    handled: float


class Throughput:
    """The samples of one database and the rates between them; thread-safe."""

    def __init__(self, window: float = WINDOW_SECONDS) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._last: Counters | None = None
        self._rates: deque[Rate] = deque()

    @property
    def since(self) -> Counters | None:
        """The last sample (its `taken_at` is the `since` of the next read)."""
        with self._lock:
            return self._last

    def add(self, sample: Counters) -> None:
        """Add a sample read with `since` = the previous sample's time."""
        with self._lock:
            last, self._last = self._last, sample
            if last is None:
                return
            seconds = (sample.taken_at - last.taken_at).total_seconds()
            if seconds <= 0:
                return

            def per_second(now: int, before: int) -> float:
                return max(0, now - before) / seconds

            at = sample.taken_at.timestamp()
            self._rates.append(
                Rate(
                    at=at,
                    written=per_second(sample.written, last.written),
                    relayed=per_second(sample.relayed, last.relayed),
                    received=sample.received / seconds,
                    handled=sample.handled / seconds,
                )
            )
            while self._rates and self._rates[0].at < at - self._window:
                self._rates.popleft()

    def rates(self) -> list[Rate]:
        """The rates of the window, oldest first."""
        with self._lock:
            return list(self._rates)
