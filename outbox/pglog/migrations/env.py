"""Alembic environment of the PostgreSQL log (outbox.pglog), apart from outbox's own tables.

A script directory of its own, not a branch of `migrations/`: a service's outbox database and
the log database are usually different databases, migrated by different commands, and each
keeps one linear history. The schema comes from `config.attributes["schema"]` (set by
`outbox migrate --log-url`) or `-x schema=...`; the version table `log_alembic_version` lives in
it, so the log may share a database, even a schema, with outbox's tables.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from outbox.postgres.queries import quote_ident, validate_schema

config = context.config
schema = validate_schema(
    config.attributes.get("schema")
    or context.get_x_argument(as_dictionary=True).get("schema")
    or "outbox_log"
)
VERSION_TABLE = "log_alembic_version"


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL given to the log migrations")
    return str(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=None,
        literal_binds=True,
        version_table_schema=schema,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        context.run_migrations(schema=schema)


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        engine = create_engine(_url())
        with engine.connect() as conn:
            _run(conn)
        engine.dispose()
    else:
        _run(connection)


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=None,
        version_table_schema=schema,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}"))
        context.run_migrations(schema=schema)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
