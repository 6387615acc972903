"""The log: topics, partitions with their offset counters, records, groups and their offsets

One records table keyed by (partition id, offset), not a table per topic-partition: topics are
created by the relay on first publish, which then needs no DDL (docs/decisions/0009).

Revision ID: log0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "log0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    s = '"' + schema + '"'
    op.execute(f"""
        CREATE TABLE {s}.log_topics (
            id          serial PRIMARY KEY,
            name        text NOT NULL UNIQUE,
            partitions  int NOT NULL CHECK (partitions BETWEEN 1 AND 10000),
            created_at  timestamptz NOT NULL DEFAULT now()
        )""")
    # One row per topic-partition: its id names the partition everywhere else, and
    # next_offset is the counter publishers reserve gapless offsets through.
    op.execute(f"""
        CREATE TABLE {s}.log_partitions (
            id           serial PRIMARY KEY,
            topic_id     int NOT NULL REFERENCES {s}.log_topics (id) ON DELETE CASCADE,
            partition    int NOT NULL,
            next_offset  bigint NOT NULL DEFAULT 0,
            UNIQUE (topic_id, partition)
        )""")
    # No foreign key: it would cost a lookup per appended record.
    op.execute(f"""
        CREATE TABLE {s}.log_records (
            partition_id  int NOT NULL,
            log_offset    bigint NOT NULL,
            key           bytea,
            value         bytea NOT NULL,
            headers       bytea,
            created_at    timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (partition_id, log_offset)
        )""")
    op.execute(f"""
        CREATE TABLE {s}.log_groups (
            id          serial PRIMARY KEY,
            name        text NOT NULL UNIQUE,
            created_at  timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute(f"""
        CREATE TABLE {s}.log_group_offsets (
            group_id      int NOT NULL REFERENCES {s}.log_groups (id) ON DELETE CASCADE,
            partition_id  int NOT NULL REFERENCES {s}.log_partitions (id) ON DELETE CASCADE,
            next_offset   bigint NOT NULL,
            updated_at    timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (group_id, partition_id)
        )""")
    op.execute(f"CREATE INDEX log_group_offsets_partition ON {s}.log_group_offsets (partition_id)")
    # Live members of the groups (rows of dead sessions are forgotten, as relay_state's).
    op.execute(f"""
        CREATE TABLE {s}.log_members (
            member_id      text PRIMARY KEY,
            group_id       int NOT NULL REFERENCES {s}.log_groups (id) ON DELETE CASCADE,
            topics         text[] NOT NULL,
            backend_pid    int NOT NULL,
            backend_start  timestamptz,
            sleeping       boolean NOT NULL DEFAULT false,
            updated_at     timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade(schema: str) -> None:
    s = '"' + schema + '"'
    for table in (
        "log_members",
        "log_group_offsets",
        "log_groups",
        "log_records",
        "log_partitions",
        "log_topics",
    ):
        op.execute(f"DROP TABLE {s}.{table}")
