"""producer_queue, consumer_queue and relay_state

consumer_queue keeps a processed row (payload cleared) for the dedup window, so that a
redelivered message meets the unique message_id and is stored once.

Revision ID: 0001
Revises:
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _message_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.Uuid(), nullable=False, unique=True),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.LargeBinary()),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column(
            "headers", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("content_type", sa.Text(), nullable=False),
        sa.Column("lane", sa.SmallInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("last_error", sa.Text()),
        sa.Column("dead_at", sa.DateTime(timezone=True)),
    ]


def upgrade(schema: str) -> None:
    op.create_table("producer_queue", *_message_columns(), schema=schema)
    op.create_index(
        "producer_queue_lane_id",
        "producer_queue",
        ["lane", "id"],
        schema=schema,
        postgresql_where=sa.text("dead_at IS NULL"),
    )
    op.create_index(
        "producer_queue_retry",
        "producer_queue",
        ["lane", "key"],
        schema=schema,
        postgresql_where=sa.text("attempts > 0 AND dead_at IS NULL"),
    )
    op.create_table(
        "consumer_queue",
        *_message_columns(),
        sa.Column("source_partition", sa.Integer()),
        sa.Column("source_offset", sa.BigInteger()),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("processed_at", sa.DateTime(timezone=True)),
        schema=schema,
    )
    op.create_index(
        "consumer_queue_pending",
        "consumer_queue",
        ["lane", "id"],
        schema=schema,
        postgresql_where=sa.text("processed_at IS NULL AND dead_at IS NULL"),
    )
    op.create_index(
        "consumer_queue_retry",
        "consumer_queue",
        ["lane", "key"],
        schema=schema,
        postgresql_where=sa.text("attempts > 0 AND processed_at IS NULL AND dead_at IS NULL"),
    )
    op.create_index(
        "consumer_queue_processed",
        "consumer_queue",
        ["processed_at"],
        schema=schema,
        postgresql_where=sa.text("processed_at IS NOT NULL"),
    )
    op.create_table(
        "relay_state",
        sa.Column("relay_id", sa.Text(), primary_key=True),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("backend_pid", sa.Integer(), nullable=False),
        sa.Column("sleeping", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        schema=schema,
    )


def downgrade(schema: str) -> None:
    op.drop_table("relay_state", schema=schema)
    op.drop_table("consumer_queue", schema=schema)
    op.drop_table("producer_queue", schema=schema)
