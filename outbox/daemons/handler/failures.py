"""What a failed attempt records, and the exceptions a worker's transactions pass among them.

Contract: the recorded error is always storable, whatever the exception's text (NUL, lone
surrogates, a __str__ that raises), so recording a failure cannot fail. A payload that cannot
be decoded, or does not validate against its handler's payload type (`Undecodable`), or whose
callback raised `PermanentFailure`, is dead at once, after one attempt; any other failure is
retried with its handler's backoff until `max_attempts`, then dead (a `RetryLater` not sooner
than it asks, up to the backoff's maximum). A failure is any exception a callback raises
(BaseException too: SystemExit, KeyboardInterrupt), a transaction it left unusable (`Misused`,
found by the session's `check()`) or a connection lost while it ran, if the database answers
a new connection at once (else an outage, `ConnectionLost`, nothing counted). A failure of the
worker's own work that retrying cannot fix is no attempt either: it stops the daemon
(`raise_lost`).
"""

from __future__ import annotations

import traceback
from typing import NamedTuple, NoReturn

from outbox.core.errors import Misused, PermanentFailure, RetryLater
from outbox.core.handlers import HandlerSpec
from outbox.core.inbox_rows import Claimed, FailedAttempt, Pending, Undecodable
from outbox.core.retriable import retriable
from outbox.core.text import first_line, storable

__all__ = [
    "ConnectionLost",
    "Failure",
    "Misused",
    "RollBack",
    "Undecodable",
    "described",
    "error_text",
    "failed_attempt",
    "raise_lost",
    "unregistered",
]


class RollBack(Exception):
    """Raised inside a batch transaction to roll it back after a callback failed."""


class ConnectionLost(Exception):
    """The worker's database connection broke, or the server said "later" (`error`, what
    retrying can fix: `outbox.core.retriable`); the row stays for a later attempt, after a
    backoff."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {first_line(error)}")
        self.error = error


def raise_lost(exc: BaseException) -> NoReturn:
    """Raise what a failure of the worker's own database work (not a callback's) becomes:
    `ConnectionLost` if retrying can fix it, else `exc` itself, which stops the daemon (a
    missing extra, a missing privilege: decision 15)."""
    if retriable(exc):
        raise ConnectionLost(exc) from exc
    raise exc


class Failure(NamedTuple):
    """Where a handler transaction failed. `size` 1 names the failing row; more is a batch
    handler that raised for rows [position, position + size), each to be handled alone."""

    position: int
    row: Pending
    spec: HandlerSpec | None
    claimed: Claimed | None
    error: BaseException
    size: int = 1


def described(exc: BaseException) -> str:
    """An exception for a log line: its class name and the first line of its text
    (`KeyError: 'via'`, not `'via'`); the name alone when the text is empty."""
    text = first_line(exc)
    name = type(exc).__name__
    return name if text == name else f"{name}: {text}"


def error_text(exc: BaseException) -> str:
    """The traceback of `exc` as storable text; never raises."""
    try:
        return storable("".join(traceback.format_exception(exc)))
    except Exception:  # traceback copes with a raising __str__; this is the last resort
        return described(exc)


def failed_attempt(
    row: Pending, spec: HandlerSpec | None, exc: BaseException, attempts: int
) -> FailedAttempt:
    """What attempt `attempts + 1` of `row`, failed with `exc`, records."""
    attempt = attempts + 1
    max_attempts = spec.max_attempts if spec is not None else 1
    dead = attempt >= max_attempts or isinstance(exc, Undecodable | PermanentFailure)
    delay = 0.0 if dead or spec is None else spec.backoff.delay(attempt)
    if not dead and spec is not None and isinstance(exc, RetryLater) and exc.after is not None:
        # Not sooner than the callback asked (Retry-After), nor later than the backoff's cap.
        delay = max(delay, min(exc.after, spec.backoff.maximum))
    return FailedAttempt(id=row.id, error=error_text(exc), dead=dead, delay=delay)


def unregistered(row: Pending, registered: list[str]) -> FailedAttempt:
    """A row of a topic no handler is registered for: dead at once."""
    return FailedAttempt(
        id=row.id,
        error=storable(
            f"no handler registered for topic {row.topic!r} (registered: {', '.join(registered)})"
        ),
        dead=True,
        delay=0.0,
    )
