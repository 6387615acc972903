"""The one loader of named SQL statements (`.sql` files in a package), for one schema."""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources

from psycopg import sql as psql

from outbox.core.databases import validate_schema as validate_schema
from outbox.core.errors import ConfigurationError

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def quote_ident(name: str) -> str:
    """Double-quote an identifier (after validation, as a second line of defence)."""
    return '"' + name.replace('"', '""') + '"'


@cache
def named_statements(package: str, folder: str = "sql") -> dict[str, str]:
    """Every named statement (`-- name: NAME` heading its body) of every `*.sql` file in
    `folder` of `package`, with `{schema}` still in it; a name may appear only once."""
    statements: dict[str, str] = {}
    directory = resources.files(package).joinpath(folder)
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME.split(entry.read_text())
        # parts: [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in statements:
                raise RuntimeError(f"SQL statement {name!r} is defined twice ({entry.name})")
            statements[name] = body.strip()
    return statements


@cache
def statements_for(schema: str, package: str, folder: str = "sql") -> dict[str, str]:
    """The named statements of `package`'s `folder` with `{schema}` replaced by the quoted,
    validated schema name: the one loader of outbox's SQL (outbox/postgres/sql/) and the
    log's (outbox/pglog/sql/)."""
    quoted = quote_ident(validate_schema(schema))
    return {
        name: body.replace("{schema}", quoted)
        for name, body in named_statements(package, folder).items()
    }


def queries(schema: str) -> dict[str, str]:
    """All statements of outbox/postgres/sql/ for `schema`."""
    return statements_for(schema, "outbox.postgres")


def compose(name: str, **identifiers: str) -> psql.Composed:
    """The named statement `name` of outbox/postgres/sql/ (one without `{schema}`) with each
    `{placeholder}` replaced by the quoted identifier given for it: for the statements that
    take a database's name, which PostgreSQL does not accept as a parameter."""
    return psql.SQL(named_statements("outbox.postgres")[name]).format(
        **{key: psql.Identifier(value) for key, value in identifiers.items()}
    )


#: PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1): `pg_notify` refuses a longer
#: channel name, and `LISTEN` truncates one, so the two would never meet.
MAX_IDENTIFIER_BYTES = 63


def channel(schema: str, queue: str) -> str:
    """The LISTEN/NOTIFY channel of one queue table in one schema: `schema.queue`, or, where
    that is longer than PostgreSQL's 63-byte limit, the schema's head, the queue and a digest
    of the whole name (`outbox_...abc.producer_queue.3f9c1e07a2b4`), so that every schema that
    passes validation has a channel that fits and no two schemas share one."""
    name = f"{validate_schema(schema)}.{queue}"
    if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    tail = f".{queue}.{digest}"
    head = schema[: MAX_IDENTIFIER_BYTES - len(tail.encode())]
    if not head:
        raise ConfigurationError(f"queue name {queue!r} is too long for a NOTIFY channel")
    return head + tail
