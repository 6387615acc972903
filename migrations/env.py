"""Alembic environment for outbox's own tables.

The schema comes from `config.attributes["schema"]` (set by `outbox migrate`) or `-x schema=...`
on the alembic command line; it defaults to `outbox`. The version table lives in that schema,
so several outbox schemas can share one database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from outbox.postgres.queries import quote_ident, validate_schema
from outbox.postgres.schema import metadata

config = context.config
schema = validate_schema(
    config.attributes.get("schema")
    or context.get_x_argument(as_dictionary=True).get("schema")
    or "outbox"
)
target_metadata = metadata(schema)
VERSION_TABLE = "alembic_version"


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL given to the outbox migrations")
    return str(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
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
        target_metadata=target_metadata,
        version_table_schema=schema,
        version_table=VERSION_TABLE,
        include_schemas=True,
        include_name=lambda name, type_, parent: type_ != "schema" or name == schema,
    )
    with context.begin_transaction():
        context.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}"))
        context.run_migrations(schema=schema)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
