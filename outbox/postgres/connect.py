"""Opening a connection for a command or a check: a failure is one redacted line."""

from __future__ import annotations

import math
from typing import Any

import psycopg

from outbox.core.errors import DatabaseUnavailable
from outbox.core.text import first_line


def connect_or_raise(
    url: str,
    *,
    what: str = "PostgreSQL",
    timeout: float = 10.0,
    application_name: str = "outbox",
    autocommit: bool = True,
) -> psycopg.Connection[Any]:
    """A connection to `url`, or `DatabaseUnavailable("cannot connect to WHAT: <first line>")`
    with every secret masked (psycopg's messages may quote the connection string)."""
    from outbox.observability.redact import redact_text

    try:
        return psycopg.connect(
            url,
            autocommit=autocommit,
            connect_timeout=max(1, math.ceil(timeout)),
            application_name=application_name,
        )
    except psycopg.Error as exc:
        raise DatabaseUnavailable(
            redact_text(f"cannot connect to {what}: {first_line(exc)}")
        ) from None
