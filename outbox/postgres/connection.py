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
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from outbox.core.errors import DatabaseUnavailable
from outbox.core.redact import redact_text
from outbox.core.text import first_line
from outbox.postgres.migrate import check_schema

log = logging.getLogger("outbox.relay")

Connection = psycopg.Connection[tuple[Any, ...]]


def connect(
    url: str, *, timeout: float, application_name: str, autocommit: bool = True
) -> Connection:
    """A connection (autocommit unless asked otherwise); psycopg's error if it cannot."""
    return psycopg.connect(
        url,
        autocommit=autocommit,
        row_factory=tuple_row,
        connect_timeout=max(1, math.ceil(timeout)),
        application_name=application_name,
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
    deadline = time.monotonic() + wait
    delay = 0.2
    attempt = 0
    while True:
        attempt += 1
        try:
            conn = open_connection()
        except psycopg.Error as exc:
            error = unavailable(exc, what)
        else:
            try:
                with conn:
                    check(conn, schema)
                return
            except psycopg.OperationalError as exc:
                # Lost while checking the schema (PostgreSQL shutting down): the same outage as
                # a refused connection, the same one-line error, and waited for alike.
                error = unavailable(exc, what)
        left = deadline - time.monotonic()
        if left <= 0 or stopping():
            raise error from None
        log.warning(
            "%s (attempt %d; waiting up to %.0fs more, --wait-for-database)",
            error,
            attempt,
            left,
        )
        time.sleep(min(delay, left))
        delay = min(delay * 2, 5.0)
