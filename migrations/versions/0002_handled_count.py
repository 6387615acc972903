"""consumer_queue.handled_count: how many times a message's handling committed

The Handler increments it in the transaction that marks a row processed, so the delivery audit
(`outbox spark audit`) can tell a message handled once from one handled twice. Rows processed
before this revision are counted as handled once. Adding a column with a constant default does
not rewrite the table (PostgreSQL >= 11); the UPDATE touches only the processed rows, which the
dedup window bounds.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    op.add_column(
        "consumer_queue",
        sa.Column("handled_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
        schema=schema,
    )
    consumer_queue = sa.table(
        "consumer_queue", sa.column("handled_count", sa.Integer()), schema=schema
    )
    op.execute(
        consumer_queue.update().where(sa.text("processed_at IS NOT NULL")).values(handled_count=1)
    )


def downgrade(schema: str) -> None:
    op.drop_column("consumer_queue", "handled_count", schema=schema)
