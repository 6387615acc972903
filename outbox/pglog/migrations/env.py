"""Alembic environment of the PostgreSQL log (outbox.pglog), apart from outbox's own tables.

A script directory of its own, not a branch of `migrations/`: a service's outbox database and
the log database are usually different databases, migrated by different commands, and each
keeps one linear history. The schema comes from `config.attributes["schema"]` (set by
`outbox migrate --log-url`) or `-x schema=...`; the version table `log_alembic_version` lives in
it, so the log may share a database, even a schema, with outbox's tables. The environment is
outbox's own (`outbox.postgres.migrate.run_environment`), with no declared tables to compare.
"""

from __future__ import annotations

from outbox.pglog.log import DEFAULT_SCHEMA
from outbox.postgres.migrate import run_environment

run_environment(
    default_schema=DEFAULT_SCHEMA,
    version_table="log_alembic_version",
    what="log migrations",
)
