"""What the operator commands of `outbox` share (outbox/cli/status.py, dead_letters.py,
log_admin.py): the connection to a migrated database, the error of a failed statement, and
printing (every line redacted, tables)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from outbox.cli.arguments import (
    ENV_DATABASE_URL,
)
from outbox.core.errors import ConfigurationError, InvalidTopic, OutboxError
from outbox.core.text import first_line
from outbox.core.topics import validate_topic
from outbox.postgres import operations as ops
from outbox.postgres.connection import connect_or_raise
from outbox.postgres.migrate import check_schema
from outbox.postgres.queries import validate_schema


class DatabaseCommandFailed(OutboxError):
    """PostgreSQL refused or dropped the statement of an operator command."""


def _topic(text: str) -> str:
    # Only a name Kafka accepts can be in a queue; the filter is a bound parameter anyway.
    try:
        return validate_topic(text)
    except InvalidTopic as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextmanager
def _connection(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to --database-url (`[NAME[/SCHEMA]=]URL`), migrated to this
    outbox's schema revision; `args.schema` becomes the entry's schema."""
    from outbox.core.databases import parse_entry

    if not args.database_url:
        raise ConfigurationError(f"--database-url is required (or set {ENV_DATABASE_URL})")
    database = parse_entry(args.database_url, args.schema)
    args.schema = database.schema
    with _connected(database.url, database.schema, args.command) as conn:
        yield conn


@contextmanager
def _connected(
    url: str, schema: str, command: str, *, timeout: float | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to `url` whose `schema` is migrated to this outbox's revision;
    with `timeout`, connecting and each statement give up after that many seconds."""
    schema = validate_schema(schema)
    conn = connect_or_raise(url, application_name="outbox-cli", timeout=timeout or 10.0)
    with conn:
        try:
            # A row named by id may be locked by a running handler: wait a while, not forever.
            ops.limit_lock_wait(conn, schema)
            if timeout is not None:
                ops.limit_statement_time(conn, schema, timeout)
            check_schema(conn, schema)
            yield conn
        except psycopg.errors.LockNotAvailable:
            raise DatabaseCommandFailed(
                f"{command}: a row is locked by a running daemon or another command "
                f"(waited {ops.LOCK_TIMEOUT_SECONDS} s); nothing was changed, try again"
            ) from None
        except psycopg.Error as exc:
            raise DatabaseCommandFailed(
                f"{command} failed in PostgreSQL: {first_line(exc)}"
            ) from None


def _print(output: str | list[str]) -> None:
    """Print a document or lines; a reader that went away (`| head`) is not an error."""
    text = output if isinstance(output, str) else "\n".join(output)
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _safe(text: str) -> str:
    """Text that cannot break a terminal line or send escape sequences."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Left-aligned columns two spaces apart, the header first."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [
        (indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))).rstrip()
        for row in (header, *rows)
    ]
