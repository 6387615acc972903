"""Alembic environment for outbox's own tables.

The schema comes from `config.attributes["schema"]` (set by `outbox migrate`) or `-x schema=...`
on the alembic command line; it defaults to `outbox`. The version table lives in that schema,
so several outbox schemas can share one database. The log's migrations
(outbox/pglog/migrations/env.py) run the same environment with their own version table.
"""

from __future__ import annotations

from outbox.postgres.migrate import run_environment
from outbox.postgres.schema import metadata

run_environment(
    default_schema="outbox",
    version_table="alembic_version",
    what="outbox migrations",
    metadata=metadata,
)
