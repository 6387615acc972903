"""Applies outbox's Alembic migrations and checks the version a database is at.

What the log's migrations (outbox/pglog/migrations) share with outbox's own: `Migrations` (upgrade,
downgrade, offline SQL, the revision check) over either script directory, and the env.py
(`run_environment`).
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

import psycopg

from outbox.core.errors import SchemaNotMigrated, SchemaTooNew
from outbox.postgres.queries import queries, quote_ident, validate_schema

if TYPE_CHECKING:  # Alembic and SQLAlchemy are imported where they are used (see _revisions)
    from alembic.config import Config
    from sqlalchemy import Connection, MetaData


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


def sibling_migration(script: str, filename: str) -> ModuleType:
    """The migration `filename` beside `script` (a migration's `__file__`), loaded as a module:
    for a migration that builds on an earlier one's text (its function, its CRC-32 table)."""
    path = Path(script).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"outbox_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alembic_config(
    script_location: Path, url: str, schema: str, *, output_buffer: TextIO | None = None
) -> Config:
    """The Alembic configuration that runs the scripts of `script_location` on `url` (libpq's
    form or SQLAlchemy's) in `schema`, printing the SQL to `output_buffer` in offline mode.

    Both script directories, outbox's own and the log's (outbox/pglog/migrations), read the
    schema and the URL from `attributes` in their env.py (`run_environment`).
    """
    from alembic.config import Config

    cfg = Config(output_buffer=output_buffer)
    cfg.set_main_option("script_location", str(script_location))
    cfg.attributes["schema"] = validate_schema(schema)
    cfg.attributes["url"] = sqlalchemy_url(url)
    return cfg


def offline_sql(script_location: Path, schema: str, revision: str = "head") -> str:
    """The SQL that upgrading an empty database to `revision` with the scripts of
    `script_location` runs, for a DBA to review and apply (no database is contacted)."""
    from alembic import command

    buffer = io.StringIO()
    cfg = alembic_config(script_location, "postgresql+psycopg://", schema, output_buffer=buffer)
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


#: The advisory lock key (one bigint: a space of its own beside the lanes' two-int keys) that
#: serializes the migrations of one database.
MIGRATION_LOCK = 0x6F7574626F78  # "outbox"


def run_upgrade(cfg: Config, revision: str, what: str) -> None:
    """`alembic upgrade` with `cfg`; a database at a revision these scripts do not know (a
    newer outbox migrated it) raises `SchemaTooNew` naming `what`, not Alembic's CommandError."""
    from alembic import command
    from alembic.util import CommandError

    try:
        command.upgrade(cfg, revision)
    except CommandError as exc:
        found = re.search(r"Can't locate revision identified by '([^']*)'", str(exc))
        if found is None:
            raise
        raise SchemaTooNew(
            f"{what} is at revision {found.group(1)!r}, which this version of outbox does not "
            "know: it was migrated by a newer outbox; upgrade this service's outbox (nothing "
            "was changed)"
        ) from None


def run_environment(
    *,
    default_schema: str,
    version_table: str,
    what: str,
    metadata: Callable[[str], MetaData] | None = None,
) -> None:
    """What the env.py of a script directory does, online or offline (`alembic --sql`).

    The schema comes from `config.attributes["schema"]` (`alembic_config`) or `-x schema=...`
    on the alembic command line, else `default_schema`; it is created if missing and holds the
    version table `version_table`, so several schemas (and both histories) can share one
    database. The scripts' `upgrade` and `downgrade` get the schema as their argument.
    `metadata(schema)`, when given, is what `alembic check` compares the database with, in that
    schema only. `what` names the migrations in the error for a missing URL.
    """
    from alembic import context
    from sqlalchemy import create_engine, text

    config = context.config
    schema = validate_schema(
        config.attributes.get("schema")
        or context.get_x_argument(as_dictionary=True).get("schema")
        or default_schema
    )
    options: dict[str, Any] = {
        "target_metadata": None if metadata is None else metadata(schema),
        "version_table_schema": schema,
        "version_table": version_table,
    }

    def url() -> str:
        found = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
        if not found:
            raise RuntimeError(f"no database URL given to the {what}")
        return str(found)

    def run(connection: Connection) -> None:
        context.configure(
            connection=connection,
            include_schemas=True,
            include_name=lambda name, type_, parent: type_ != "schema" or name == schema,
            **options,
        )
        with context.begin_transaction():
            # One migration at a time per database (several `outbox migrate` at once, say the
            # init containers of a Deployment): held to the commit; the next one then reads
            # the version the first one left. Without it the loser failed on CREATE SCHEMA's
            # unique name or the version table.
            context.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
            context.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}"))
            context.run_migrations(schema=schema)

    if context.is_offline_mode():
        context.configure(url=url(), literal_binds=True, **options)
        with context.begin_transaction():
            context.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
            context.run_migrations(schema=schema)
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    engine = create_engine(url())
    try:
        with engine.connect() as conn:
            run(conn)
    finally:
        engine.dispose()  # also when a migration failed: no pooled connection left open


@cache
def _revisions(directory: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Each revision the scripts of `directory` (default: outbox's own) hold, with the
    revisions it follows.

    Read from the scripts' `revision` and `down_revision` lines, without Alembic: importing
    Alembic costs every daemon about 0.4 s at start, and checking the schema needs nothing
    else from it. A script this cannot read falls back to Alembic's own reading.
    """
    directory = directory or migrations_dir()
    revisions: dict[str, tuple[str, ...]] = {}
    for path in sorted((directory / "versions").glob("*.py")):
        values = dict(_ASSIGNMENT.findall(path.read_text(encoding="utf-8")))
        try:
            revision = ast.literal_eval(values["revision"])
            down = ast.literal_eval(values.get("down_revision", "None"))
        except (KeyError, ValueError, SyntaxError):
            return _alembic_revisions(directory)
        downs = () if down is None else (down,) if isinstance(down, str) else tuple(down)
        if not isinstance(revision, str) or not all(isinstance(d, str) for d in downs):
            return _alembic_revisions(directory)
        revisions[revision] = downs
    return revisions


_ASSIGNMENT = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", re.MULTILINE)


def _alembic_revisions(directory: Path | None = None) -> dict[str, tuple[str, ...]]:
    from alembic.script import ScriptDirectory

    directory = directory or migrations_dir()
    revisions: dict[str, tuple[str, ...]] = {}
    for script in ScriptDirectory(str(directory)).walk_revisions():
        down = script.down_revision
        revisions[script.revision] = (
            () if down is None else (down,) if isinstance(down, str) else tuple(down)
        )
    return revisions


@dataclass(frozen=True)
class Migrations:
    """One Alembic script directory with one linear history: outbox's own (`OUTBOX`) or the
    log's (`outbox.pglog.log.LOG_MIGRATIONS`). Upgrades, downgrades, offline SQL and the check
    that a schema is at exactly the newest revision, with errors that name the schema and the
    command that migrates it."""

    #: The script directory, found when first needed.
    directory: Callable[[], Path]
    #: What a schema of these migrations is called: "outbox schema", "log schema".
    kind: str
    #: Where a missing schema is missing from: "database", "the log database".
    where: str
    #: The command that migrates a schema, with `{schema}` for its name.
    fix: str
    #: The statement that reads a schema's version table.
    version_sql: Callable[[str], str]

    def upgrade(self, url: str, schema: str, revision: str = "head") -> None:
        """Bring `schema` up to `revision` (default: the newest)."""
        cfg = alembic_config(self.directory(), url, schema)
        run_upgrade(cfg, revision, f"{self.kind} {schema!r}")

    def downgrade(self, url: str, schema: str, revision: str = "base") -> None:
        """Take `schema` down to `revision` (default: remove every table of these scripts)."""
        from alembic import command

        command.downgrade(alembic_config(self.directory(), url, schema), revision)

    def upgrade_sql(self, schema: str, revision: str = "head") -> str:
        """The SQL `upgrade` would run on an empty database, for a DBA to review and apply."""
        return offline_sql(self.directory(), schema, revision)

    def known_revisions(self) -> frozenset[str]:
        """Every revision the scripts hold."""
        return frozenset(_revisions(self.directory()))

    def head_revision(self) -> str:
        """The newest revision the scripts hold."""
        revisions = _revisions(self.directory())
        followed = {down for downs in revisions.values() for down in downs}
        heads = [revision for revision in revisions if revision not in followed]
        assert len(heads) == 1, f"{self.kind} migrations have {len(heads)} heads: {heads}"
        return heads[0]

    def check_schema(self, conn: psycopg.Connection[Any], schema: str) -> None:
        """Raise unless `schema` is migrated to exactly the newest revision."""
        fix = self.fix.format(schema=schema)
        try:
            with conn.transaction():
                row = conn.execute(self.version_sql(schema)).fetchone()
        except psycopg.errors.UndefinedTable:
            raise SchemaNotMigrated(
                f"{self.where} has no {self.kind} {schema!r}: run `{fix}`"
            ) from None
        version = row[0] if row else None
        head = self.head_revision()
        if version == head:
            return
        if version is None or version in self.known_revisions():
            raise SchemaNotMigrated(
                f"{self.kind} {schema!r} is at revision {version}, this outbox needs "
                f"{head}: run `{fix}`"
            )
        raise SchemaTooNew(
            f"{self.kind} {schema!r} is at revision {version!r}, which this version of outbox "
            "does not know: it was migrated by a newer outbox; upgrade this service's outbox"
        )


#: outbox's own migrations (migrations/, outbox/_migrations in the wheel).
OUTBOX = Migrations(
    directory=migrations_dir,
    kind="outbox schema",
    where="database",
    fix="outbox migrate --schema {schema}",
    version_sql=lambda schema: queries(schema)["schema_version"],
)


def upgrade(database_url: str, schema: str = "outbox", revision: str = "head") -> None:
    """Bring the schema up to `revision` (default: the newest)."""
    OUTBOX.upgrade(database_url, schema, revision)


def downgrade(database_url: str, schema: str = "outbox", revision: str = "base") -> None:
    """Take the schema down to `revision` (default: remove every outbox table)."""
    OUTBOX.downgrade(database_url, schema, revision)


def upgrade_sql(schema: str = "outbox", revision: str = "head") -> str:
    """The SQL `upgrade` would run on an empty database, for a DBA to review and apply."""
    return OUTBOX.upgrade_sql(schema, revision)


@cache
def known_revisions() -> frozenset[str]:
    """Every revision this version of outbox ships."""
    return OUTBOX.known_revisions()


@cache
def head_revision() -> str:
    """The newest revision this version of outbox ships."""
    return OUTBOX.head_revision()


def check_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Raise unless `schema` is migrated to exactly the revision this code expects."""
    OUTBOX.check_schema(conn, schema)
