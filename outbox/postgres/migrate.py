"""Applies outbox's Alembic migrations and checks the version a database is at."""

from __future__ import annotations

import ast
import io
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from outbox.core.errors import SchemaNotMigrated, SchemaTooNew
from outbox.postgres.queries import queries, validate_schema

if TYPE_CHECKING:  # Alembic is imported where it is used (see _revisions)
    from alembic.config import Config


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
    from alembic.config import Config

    cfg = Config(output_buffer=attributes.pop("output_buffer", None))
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["schema"] = validate_schema(schema)
    cfg.attributes["url"] = sqlalchemy_url(url)
    cfg.attributes.update(attributes)
    return cfg


def upgrade(database_url: str, schema: str = "outbox", revision: str = "head") -> None:
    """Bring the schema up to `revision` (default: the newest)."""
    from alembic import command

    command.upgrade(_config(database_url, schema), revision)


def downgrade(database_url: str, schema: str = "outbox", revision: str = "base") -> None:
    """Take the schema down to `revision` (default: remove every outbox table)."""
    from alembic import command

    command.downgrade(_config(database_url, schema), revision)


def upgrade_sql(schema: str = "outbox", revision: str = "head") -> str:
    """The SQL `upgrade` would run on an empty database, for a DBA to review and apply."""
    from alembic import command

    buffer = io.StringIO()
    cfg = _config("postgresql+psycopg://", schema, output_buffer=buffer)
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


@cache
def _revisions() -> dict[str, tuple[str, ...]]:
    """Each revision this version of outbox ships, with the revisions it follows.

    Read from the scripts' `revision` and `down_revision` lines, without Alembic: importing
    Alembic costs every daemon about 0.4 s at start, and checking the schema needs nothing
    else from it. A script this cannot read falls back to Alembic's own reading.
    """
    revisions: dict[str, tuple[str, ...]] = {}
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        values = dict(_ASSIGNMENT.findall(path.read_text(encoding="utf-8")))
        try:
            revision = ast.literal_eval(values["revision"])
            down = ast.literal_eval(values.get("down_revision", "None"))
        except (KeyError, ValueError, SyntaxError):
            return _alembic_revisions()
        downs = () if down is None else (down,) if isinstance(down, str) else tuple(down)
        if not isinstance(revision, str) or not all(isinstance(d, str) for d in downs):
            return _alembic_revisions()
        revisions[revision] = downs
    return revisions


_ASSIGNMENT = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.MULTILINE)


def _alembic_revisions() -> dict[str, tuple[str, ...]]:
    from alembic.script import ScriptDirectory

    revisions: dict[str, tuple[str, ...]] = {}
    for script in ScriptDirectory(str(migrations_dir())).walk_revisions():
        down = script.down_revision
        revisions[script.revision] = (
            () if down is None else (down,) if isinstance(down, str) else tuple(down)
        )
    return revisions


@cache
def known_revisions() -> frozenset[str]:
    """Every revision this version of outbox ships."""
    return frozenset(_revisions())


@cache
def head_revision() -> str:
    """The newest revision this version of outbox ships."""
    revisions = _revisions()
    followed = {down for downs in revisions.values() for down in downs}
    heads = [revision for revision in revisions if revision not in followed]
    assert len(heads) == 1, f"outbox migrations have {len(heads)} heads: {heads}"
    return heads[0]


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
