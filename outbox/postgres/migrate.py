"""Applies outbox's Alembic migrations and checks the version a database is at."""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from outbox.core.errors import SchemaNotMigrated, SchemaTooNew
from outbox.postgres.queries import queries, validate_schema


def migrations_dir() -> Path:
    """The Alembic script directory: inside the wheel, or `migrations/` of a source checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("outbox migrations not found (expected outbox/_migrations)")


def sqlalchemy_url(url: str) -> str:
    """A libpq-style URL as SQLAlchemy wants it, with the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _config(url: str, schema: str, **attributes: Any) -> Config:
    cfg = Config(output_buffer=attributes.pop("output_buffer", None))
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["schema"] = validate_schema(schema)
    cfg.attributes["url"] = sqlalchemy_url(url)
    cfg.attributes.update(attributes)
    return cfg


def upgrade(database_url: str, schema: str = "outbox", revision: str = "head") -> None:
    """Bring the schema up to `revision` (default: the newest)."""
    command.upgrade(_config(database_url, schema), revision)


def downgrade(database_url: str, schema: str = "outbox", revision: str = "base") -> None:
    """Take the schema down to `revision` (default: remove every outbox table)."""
    command.downgrade(_config(database_url, schema), revision)


def upgrade_sql(schema: str = "outbox", revision: str = "head") -> str:
    """The SQL `upgrade` would run on an empty database, for a DBA to review and apply."""
    buffer = io.StringIO()
    cfg = _config("postgresql+psycopg://", schema, output_buffer=buffer)
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


@cache
def known_revisions() -> frozenset[str]:
    """Every revision this version of outbox ships."""
    script = ScriptDirectory(str(migrations_dir()))
    return frozenset(rev.revision for rev in script.walk_revisions())


@cache
def head_revision() -> str:
    """The newest revision this version of outbox ships."""
    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    assert head is not None
    return head


def check_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Raise unless `schema` is migrated to exactly the revision this code expects."""
    try:
        with conn.transaction():
            row = conn.execute(queries(schema)["schema_version"]).fetchone()
    except psycopg.errors.UndefinedTable:
        raise SchemaNotMigrated(
            f"database has no outbox schema {schema!r}: run `outbox migrate --schema {schema}`"
        ) from None
    version = row[0] if row else None
    if version == head_revision():
        return
    if version is None or version in known_revisions():
        raise SchemaNotMigrated(
            f"outbox schema {schema!r} is at revision {version}, this outbox needs "
            f"{head_revision()}: run `outbox migrate --schema {schema}`"
        )
    raise SchemaTooNew(
        f"outbox schema {schema!r} is at revision {version!r}, which this version of outbox "
        "does not know: it was migrated by a newer outbox; upgrade this service's outbox"
    )
