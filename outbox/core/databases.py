"""The databases a command serves: `NAME[/SCHEMA]=URL` entries, from flags or a file.

One process may serve many databases: a database per tenant, or services whose tables share one
database in schemas of their own. Each is named; the name is how logs, metrics, `outbox status`,
the console and the consumer's routing header refer to it. An entry is written

- `NAME=URL`: the database at URL, its tables in the command's `--schema`;
- `NAME/SCHEMA=URL`: its tables in SCHEMA;
- `URL` alone (a URL or libpq `key=value` settings): named after its database (`dbname`).

A databases file holds one entry per line; blank lines and lines starting with `#` are skipped.
Names are unique in a command, and so is each (database, schema) pair: two names for one queue
would relay it twice as two tenants.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from outbox.core.errors import ConfigurationError
from outbox.core.redact import parse_conninfo, redact_url

#: A database's name: what a routing header carries and a metrics label shows.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_ENTRY = re.compile(r"\s*([^=/\s]*)(?:/([^=]*))?\s*")


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


def validate_name(name: object) -> str:
    """Return `name` if it can name a database here (1-63 letters, digits, `_`, `.`, `-`,
    starting with a letter or digit), else raise."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigurationError(
            f"database name {name!r} is not valid: use 1-63 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class Database:
    """One database a command serves: its name, its libpq URL and the schema of its tables."""

    name: str
    url: str
    schema: str

    def describe(self) -> str:
        """`name (url with its password masked, schema)`, for logs and errors."""
        return f"{self.name} ({redact_url(self.url)}, schema {self.schema})"


def parse_entry(text: str, default_schema: str, *, index: int = 0, source: str = "") -> Database:
    """The `Database` of one `[NAME[/SCHEMA]=]URL` entry. `index` numbers an unnamed entry
    whose settings name no database; `source` ("line 3 of tenants.txt") goes into errors."""
    where = f" ({source})" if source else ""
    text = text.strip()
    whole = parse_conninfo(text)
    if whole is not None:
        name = whole.get("dbname") or f"database{index + 1}"
        if not NAME.fullmatch(name):
            name = f"database{index + 1}"
        return Database(name, text, validate_schema(default_schema))
    label, sep, url = text.partition("=")
    if not sep and "://" in text:
        # A URL libpq's parser refuses (a bad %-escape, say): unnamed, and left to the
        # connection to refuse with libpq's own words, as with a single --database-url.
        return Database(f"database{index + 1}", text, validate_schema(default_schema))
    found = _ENTRY.fullmatch(label)
    if not sep or found is None or not url.strip():
        shown = redact_url(text) if parse_conninfo(text) else "an unparseable string"
        raise ConfigurationError(
            f"a database must be given as URL, NAME=URL or NAME/SCHEMA=URL{where} (got {shown})"
        )
    try:
        name = validate_name(found.group(1))
        schema = found.group(2)
        return Database(
            name, url.strip(), validate_schema(default_schema if schema is None else schema)
        )
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc}{where}") from None


def file_stamp(path: str | Path) -> tuple[int, int, int] | None:
    """What changes when a databases file is written or replaced: its modification time, size
    and inode (None when it cannot be read). The daemons re-read the file when it changes."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def read_file(path: str | Path, default_schema: str) -> list[Database]:
    """The entries of a databases file, one per line (blank lines and `#` comments skipped)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the databases file {str(file)!r}: {exc.strerror}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"the databases file {str(file)!r} is not UTF-8 text") from None
    found: list[Database] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"line {number} of {file.name}"
        found.append(parse_entry(line, default_schema, index=len(found), source=where))
    return found


def check_distinct(databases: Iterable[Database]) -> list[Database]:
    """`databases` as a list, if no two share a name or a (database, schema): else raise."""
    listed = list(databases)
    names: dict[str, Database] = {}
    queues: dict[tuple[str, str], Database] = {}
    for database in listed:
        if database.name in names:
            raise ConfigurationError(f"database name {database.name!r} is given twice")
        names[database.name] = database
        queue = (database.url, database.schema)
        if queue in queues:
            raise ConfigurationError(
                f"databases {queues[queue].name!r} and {database.name!r} are the same database "
                f"and schema ({redact_url(database.url)}, schema {database.schema})"
            )
        queues[queue] = database
    return listed


def gather(
    entries: Sequence[str],
    default_schema: str,
    *,
    file: str | Path | None = None,
) -> list[Database]:
    """The databases of `entries` (each `[NAME[/SCHEMA]=]URL`) and then of `file`, checked
    distinct. Empty when neither gives one."""
    listed = [
        parse_entry(entry, default_schema, index=index) for index, entry in enumerate(entries)
    ]
    if file is not None:
        listed.extend(read_file(file, default_schema))
    return check_distinct(listed)


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def postgres_url_type(env: str) -> Callable[[str], str]:
    """The argparse `type=` of a PostgreSQL URL flag: a libpq URL or key=value settings; a
    SQLAlchemy URL's driver name (`postgresql+psycopg://`, as the README writes it for
    SQLAlchemy) is dropped; another scheme (`mysql://`) is a usage error naming the flag."""

    def postgres_url(text: str) -> str:
        url = text.strip()
        found = _SCHEME.match(url)
        if found is None:
            return url  # key=value settings, or empty (then required later)
        scheme = found.group(1)
        base = scheme.lower().partition("+")[0]
        if base not in ("postgresql", "postgres"):
            raise argparse.ArgumentTypeError(
                f"a URL of scheme {scheme!r} is not a PostgreSQL URL: expected "
                f"postgresql://user@host/database (from the flag, or from {env})"
            )
        return "postgresql" + url[len(scheme) :] if "+" in scheme else url

    postgres_url.__name__ = "PostgreSQL URL"
    return postgres_url
