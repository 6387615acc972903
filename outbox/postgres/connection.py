"""Connections to PostgreSQL: connecting, the schema check, waiting for the database at start.

One way to connect (`connect`), for the daemons' loops, which retry what retrying can fix
(`outbox.core.retriable`, `outbox.daemons.outages`); and one way to connect or fail with a
clear error (`connect_or_raise`, `check_database`), for commands and start-up checks:
`DatabaseUnavailable` with one line, every secret masked (psycopg's messages may quote the
connection string).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import psycopg
import tenacity
from psycopg.rows import tuple_row

from outbox.core.errors import DatabaseUnavailable
from outbox.core.redact import redact_text
from outbox.core.text import first_line
from outbox.postgres.migrate import check_schema

log = logging.getLogger("outbox.relay")

Connection = psycopg.Connection[tuple[Any, ...]]


def connect(
    url: str,
    *,
    timeout: float,
    application_name: str,
    autocommit: bool = True,
    dbname: str | None = None,
) -> Connection:
    """A connection (autocommit unless asked otherwise), to database `dbname` instead of the
    URL's when given; psycopg's error if it cannot."""
    extra: dict[str, Any] = {} if dbname is None else {"dbname": dbname}
    return psycopg.connect(
        url,
        autocommit=autocommit,
        row_factory=tuple_row,
        connect_timeout=max(1, math.ceil(timeout)),
        application_name=application_name,
        **extra,
    )


def notified(conn: psycopg.Connection[Any], timeout: float) -> bool:
    """Wait up to `timeout` seconds for a notification on `conn` (a LISTENing session); when one
    comes, take every other one already received too, and return True.

    A notification only says "look again": the ones that came with it, or while the caller was
    busy, are for rows its next look sees, and left queued each would end a later wait with an
    empty look. (Never nest notifies() calls: the generator holds the connection lock while it
    is suspended.)
    """
    for _ in conn.notifies(timeout=timeout, stop_after=1):
        break
    else:
        return False
    for _ in conn.notifies(timeout=0):
        pass
    return True


def unavailable(exc: psycopg.Error, what: str = "PostgreSQL") -> DatabaseUnavailable:
    """The one error for a failed connection: `cannot connect to WHAT: <first line>`, redacted."""
    return DatabaseUnavailable(redact_text(f"cannot connect to {what}: {first_line(exc)}"))


def connect_or_raise(
    url: str,
    *,
    what: str = "PostgreSQL",
    timeout: float = 10.0,
    application_name: str = "outbox",
    autocommit: bool = True,
) -> Connection:
    """A connection to `url`, or `DatabaseUnavailable` (see `unavailable`)."""
    try:
        return connect(
            url, timeout=timeout, application_name=application_name, autocommit=autocommit
        )
    except psycopg.Error as exc:
        raise unavailable(exc, what) from None


def check_database(
    open_connection: Callable[[], Connection],
    schema: str,
    *,
    wait: float = 0.0,
    stopping: Callable[[], bool] = lambda: False,
    what: str = "PostgreSQL",
    check: Callable[[Connection, str], None] = check_schema,
) -> None:
    """Connect and check the schema version (`check`); one clear error for either failure
    (see `unavailable`; `what` names the database in it).

    With `wait` > 0, a refused connection (PostgreSQL down or still starting) is retried with
    backoff, a WARNING each time, for up to `wait` seconds or until `stopping()`; a wrong
    schema version is never waited for.
    """

    def attempt() -> None:
        try:
            conn = open_connection()
        except psycopg.Error as exc:
            raise unavailable(exc, what) from None
        try:
            with conn:
                check(conn, schema)
        except psycopg.OperationalError as exc:
            # Lost while checking the schema (PostgreSQL shutting down): the same outage as a
            # refused connection, the same one-line error, and waited for alike.
            raise unavailable(exc, what) from None

    def warn(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        log.warning(
            "%s (attempt %d; waiting up to %.0fs more, --wait-for-database)",
            error,
            state.attempt_number,
            max(0.0, wait - (state.seconds_since_start or 0.0)),
        )

    backoff = tenacity.wait_exponential(multiplier=0.2, max=5.0)  # 0.2 s, 0.4 s, ... 5 s
    retrying = tenacity.Retrying(
        # Only an unreachable database is waited for; a wrong schema version never is.
        retry=tenacity.retry_if_exception_type(DatabaseUnavailable),
        # Give up after `wait` (the last wait is cut to end there), or when the daemon stops.
        stop=tenacity.stop_after_delay(wait) | _StopWhen(stopping),
        wait=lambda state: min(backoff(state), max(0.0, wait - (state.seconds_since_start or 0))),
        before_sleep=warn,
        reraise=True,
    )
    retrying(attempt)


class _StopWhen(tenacity.stop.stop_base):
    """Stop retrying as soon as `stopping()` (SIGTERM during a wait for the database)."""

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self.stopping = stopping

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.stopping()
