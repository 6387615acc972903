"""producer_scheduled: messages sent with a due time wait here until it comes

`Broker.send(..., deliver_at=...)` or `delay=...` writes a message that is due later to
`producer_scheduled` (its due time in `deliver_at`, computed with the database's clock), not
to `producer_queue`: the relay's fetch, which reads `producer_queue` in id order through its
primary key, never meets a row that is not due, however many wait, and a send without a due
time costs what it did (no new index on `producer_queue`). The Producer moves the rows of its
lanes that fell due into `producer_queue` (`producer_promote`, in due-time order, under new
ids: behind every row of their key already there), where they are relayed like any other.
`Broker.cancel` deletes a row that is still here. The index on `(deliver_at, id)` gives the
relay the rows due now, in order, and the next due time, without reading the later ones
(docs/decisions/0021-delayed-delivery.md).

Creating an empty table and its index takes no lock on the existing tables. The downgrade
drops the table and the messages still scheduled in it: relay or cancel them first.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.postgres.queries import quote_ident

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: As 0006 for the queue tables: every row is inserted and deleted once.
AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "5000",
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "5000",
    "autovacuum_vacuum_cost_delay": "0",
}


def upgrade(schema: str) -> None:
    op.create_table(
        "producer_scheduled",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.Uuid(), nullable=False, unique=True),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.LargeBinary()),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column(
            "headers",
            sa.dialects.postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'{}'::jsonb"),
        ),
        sa.Column("content_type", sa.Text(), nullable=False),
        sa.Column("lane", sa.SmallInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("deliver_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
    )
    op.create_index(
        "producer_scheduled_due", "producer_scheduled", ["deliver_at", "id"], schema=schema
    )
    settings = ", ".join(f"{name} = {value}" for name, value in AUTOVACUUM.items())
    op.execute(f"ALTER TABLE {quote_ident(schema)}.producer_scheduled SET ({settings})")


def downgrade(schema: str) -> None:
    op.drop_table("producer_scheduled", schema=schema)
