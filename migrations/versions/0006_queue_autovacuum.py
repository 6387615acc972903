"""Autovacuum settings of the queue tables: vacuum by rows changed, not by table size

`producer_queue` and `consumer_queue` churn: every message is inserted and deleted (the outbox),
or inserted, updated once when handled and deleted after the dedup window (the inbox). Each
update and delete leaves a dead row version that only VACUUM makes reusable. PostgreSQL's
defaults vacuum a table once 20% of its rows are dead and throttle the vacuum (2 ms sleep per
200 cost units): right for tables that grow, wrong for a queue whose live rows are few and
whose dead ones pile up at thousands per second. Here a table is vacuumed once 5,000 of its rows
are dead (and analyzed once 5,000 changed), whatever its size, without the throttle. The server's
`autovacuum_naptime` (a minute by default) still spaces the runs: docs/performance.md.

Setting storage parameters takes a SHARE UPDATE EXCLUSIVE lock, which does not block reads or
writes, and rewrites nothing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

from outbox.postgres.queries import quote_ident

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("producer_queue", "consumer_queue")
SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "5000",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "5000",
    "autovacuum_vacuum_cost_delay": "0",
}


def upgrade(schema: str) -> None:
    settings = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
    for table in TABLES:
        op.execute(f"ALTER TABLE {quote_ident(schema)}.{table} SET ({settings})")


def downgrade(schema: str) -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {quote_ident(schema)}.{table} RESET ({', '.join(SETTINGS)})")
