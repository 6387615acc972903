"""The daemons' connections to PostgreSQL: connecting, the schema check, riding out outages."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from tenacity import Retrying, retry_if_exception_type, wait_exponential

from outbox.core.errors import DatabaseUnavailable
from outbox.core.text import first_line
from outbox.observability.redact import redact_text
from outbox.postgres.migrate import check_schema

log = logging.getLogger("outbox.relay")

Connection = psycopg.Connection[tuple[Any, ...]]
#: What a lost or refused connection raises (the daemons retry on it).
DatabaseLost = psycopg.OperationalError


def connect(url: str, *, timeout: float, application_name: str) -> Connection:
    """An autocommit connection for a daemon's control loop."""
    return psycopg.connect(
        url,
        autocommit=True,
        row_factory=tuple_row,
        connect_timeout=max(1, int(timeout)),
        application_name=application_name,
    )


def check_database(open_connection: Callable[[], Connection], schema: str) -> None:
    """Connect once and check the schema version; one clear error for either failure (the
    connection error's text redacted)."""
    try:
        conn = open_connection()
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            redact_text(f"cannot connect to PostgreSQL: {first_line(exc)}")
        ) from None
    with conn:
        check_schema(conn, schema)


def retrying_database(stopping: Callable[[], bool], what: str) -> Retrying:
    """Retry on a lost or refused database connection, backing off up to 5 s, until it works
    or `stopping()`; then the last error is raised."""
    return Retrying(
        retry=retry_if_exception_type(DatabaseLost),
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
