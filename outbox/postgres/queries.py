"""Loads the named statements of `sql/queries.sql` for one schema."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from outbox.core.errors import ConfigurationError

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def validate_schema(schema: object) -> str:
    """Return `schema` if it is a safe lower-case SQL identifier, else raise."""
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
        raise ConfigurationError(
            f"schema {schema!r} is not valid: use 1-63 lower-case letters, digits and "
            "underscores, starting with a letter or underscore"
        )
    if schema.startswith("pg_") or schema == "information_schema":
        raise ConfigurationError(
            f"schema {schema!r} is PostgreSQL's own (names starting with pg_ are reserved): "
            "choose another"
        )
    return schema


def quote_ident(name: str) -> str:
    """Double-quote an identifier (after validation, as a second line of defence)."""
    return '"' + name.replace('"', '""') + '"'


@cache
def _raw() -> dict[str, str]:
    """Every named statement of every `sql/*.sql` file; a name may appear only once."""
    statements: dict[str, str] = {}
    folder = resources.files("outbox.postgres").joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
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
def queries(schema: str) -> dict[str, str]:
    """All statements with `{schema}` replaced by the quoted, validated schema name."""
    quoted = quote_ident(validate_schema(schema))
    return {name: body.replace("{schema}", quoted) for name, body in _raw().items()}


def channel(schema: str, queue: str) -> str:
    """The LISTEN/NOTIFY channel of one queue table in one schema."""
    return f"{validate_schema(schema)}.{queue}"
