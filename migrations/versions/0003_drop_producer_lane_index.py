"""Drop producer_queue_lane_id: the relay reads the primary key in id order

Since decision 0007 the Producer's session plans without sorts, so its fetch reads
`producer_queue` through the primary key and the `(lane, id)` index was used by nothing. It
still cost every `broker.send` an index insertion: with 16 writers (pgbench, prepared
statements, 2 cores), a business transaction with the outbox INSERT committed about 15% faster
once it was gone. Dropping an index takes a brief ACCESS EXCLUSIVE lock on the table and
rewrites nothing.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    op.drop_index("producer_queue_lane_id", table_name="producer_queue", schema=schema)


def downgrade(schema: str) -> None:
    op.create_index(
        "producer_queue_lane_id",
        "producer_queue",
        ["lane", "id"],
        schema=schema,
        postgresql_where=sa.text("dead_at IS NULL"),
    )
