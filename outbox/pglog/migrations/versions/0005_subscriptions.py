"""Subscriptions of `outbox serve`: a named reader of one topic with its own position, and the
leases by which its clients take a partition's next records (docs/decisions/0023).

A subscription is a consumer group of the log (`log_groups`, its position in
`log_group_offsets`), so retention already deletes only what every subscription has read and
`outbox status` shows its lag; `log_subscriptions` says which topic it reads under which name.
A client's `next` leases a partition (`log_subscription_leases`): no other client reads it
until the lease is acknowledged (the position moves to `next_offset`) or runs out (the same
records are handed out again), so each record goes to one client at a time, in order per
partition. `log_listeners` names the sessions of the servers whose long polls wait for appends:
while one is there, every append wakes them (LISTEN/NOTIFY).

Revision ID: log0005
Revises: log0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "log0005"
down_revision = "log0004"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    s = '"' + schema + '"'
    op.execute(f"""
        CREATE TABLE {s}.log_subscriptions (
            group_id    int PRIMARY KEY REFERENCES {s}.log_groups (id) ON DELETE CASCADE,
            topic_id    int NOT NULL REFERENCES {s}.log_topics (id) ON DELETE CASCADE,
            name        text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            UNIQUE (topic_id, name)
        )""")
    # One lease per (subscription, partition): the records [first_offset, next_offset) handed
    # out under `cursor`, until `until`.
    op.execute(f"""
        CREATE TABLE {s}.log_subscription_leases (
            group_id      int NOT NULL REFERENCES {s}.log_groups (id) ON DELETE CASCADE,
            partition_id  int NOT NULL REFERENCES {s}.log_partitions (id) ON DELETE CASCADE,
            cursor        uuid NOT NULL,
            first_offset  bigint NOT NULL,
            next_offset   bigint NOT NULL,
            until         timestamptz NOT NULL,
            PRIMARY KEY (group_id, partition_id)
        )""")
    op.execute(
        f"CREATE INDEX log_subscription_leases_cursor ON {s}.log_subscription_leases (cursor)"
    )
    # The sessions of `outbox serve` listening for appends (its long polls wait on them):
    # while one is here, every append NOTIFYs, as while a member naps (log_append).
    op.execute(f"""
        CREATE TABLE {s}.log_listeners (
            backend_pid    int PRIMARY KEY,
            backend_start  timestamptz,
            since          timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade(schema: str) -> None:
    s = '"' + schema + '"'
    op.execute(f"DROP TABLE {s}.log_listeners")
    op.execute(f"DROP TABLE {s}.log_subscription_leases")
    # The groups of the subscriptions stay: their positions still hold back retention until
    # `outbox log-topics` (or PgLog.forget_group) forgets them.
    op.execute(f"DROP TABLE {s}.log_subscriptions")
