"""How a daemon loop rides out what retrying can fix, and stops on what it cannot (decision 15).

Contract: a loop hands every exception of its retry path to `Outage.failed`. One that
`retriable()` says retrying cannot fix is re-raised, to stop the daemon with one line. A
retriable one is counted and logged through a `LimitedLog` (a first line at once, then at most
one line per interval, saying how often it repeated), and the loop waits an exponential,
capped, jittered backoff (`pause`) before it tries again. `recovered()` after the next success
logs one line and starts the backoff over. While failures keep coming, `trouble()` says why,
for `/readyz`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from outbox.core.retriable import retriable
from outbox.core.retry import Backoff
from outbox.core.text import first_line
from outbox.observability.logs import LimitedLog

#: The backoff between retries of a loop's work: 0.1 s, doubling, at most 5 s.
OUTAGE_BACKOFF = Backoff(initial=0.1, maximum=5.0, jitter=0.2)
#: A loop failing this many times in a row is not ready (`trouble`).
NOT_READY_AFTER = 3


class Outage:
    """One loop's run of consecutive failures that retrying can fix; `what` names the loop's
    work in its log lines ("handler worker", "cannot store a batch in PostgreSQL")."""

    def __init__(
        self,
        what: str,
        logger: logging.Logger,
        backoff: Backoff = OUTAGE_BACKOFF,
        *,
        retry_all: bool = False,
        log_interval: float | None = None,
    ) -> None:
        self.what = what
        self.backoff = backoff
        #: Retry whatever fails (a database of several: its failure is its own, not the
        #: process's), not only what `retriable()` says retrying can fix.
        self.retry_all = retry_all
        self.log = (
            LimitedLog(logger)
            if log_interval is None
            else LimitedLog(logger, interval=log_interval)
        )
        self._logger = logger
        self._lock = threading.Lock()
        self.failures = 0
        self.since: float | None = None
        self.error = ""

    def failed(self, exc: BaseException) -> float:
        """Count `exc` and return the seconds to wait before trying again; re-raise it if
        retrying cannot fix it. Call it inside the `except` block that caught `exc`."""
        if not self.retry_all and not retriable(exc):
            raise exc
        with self._lock:
            self.failures += 1
            if self.since is None:
                self.since = time.monotonic()
            self.error = f"{type(exc).__name__}: {first_line(exc)}"
            failures, error = self.failures, self.error
        delay = self.backoff.delay(failures)
        self.log("%s (retrying, failure %d in a row): %s", self.what, failures, error)
        return delay

    def pause(
        self, delay: float, stop: threading.Event, beat: Callable[[], None] | None = None
    ) -> None:
        """Wait `delay` seconds or until `stop` is set, beating `beat` (the loop is alive)."""
        deadline = time.monotonic() + delay
        while not stop.is_set():
            if beat is not None:
                beat()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            stop.wait(min(remaining, 0.2))

    def recovered(self) -> None:
        """The loop's work succeeded: say so once after failures, and start over."""
        if not self.failures:
            return
        with self._lock:
            failures, since = self.failures, self.since
            self.failures, self.since, self.error = 0, None, ""
        self.log.flush()
        self._logger.info(
            "%s: recovered after %d failed attempts in %.1fs",
            self.what,
            failures,
            time.monotonic() - (since or time.monotonic()),
        )

    def trouble(self) -> str | None:
        """Why the loop is not ready (failing `NOT_READY_AFTER` times in a row), or None."""
        with self._lock:
            if self.failures < NOT_READY_AFTER or self.since is None:
                return None
            return (
                f"{self.what}: {self.failures} failed attempts in "
                f"{time.monotonic() - self.since:.0f}s; last: {self.error}"
            )
