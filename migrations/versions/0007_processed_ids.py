"""consumer_processed: handled messages leave consumer_queue; their ids are kept apart

Until this revision a handled inbox row was updated in place (processed_at set, payload
cleared), a non-HOT update since processed_at is in the partial indexes' predicates, and kept in
`consumer_queue` for the dedup window. Now the Handler deletes the row in the transaction of
its callback and records the message in `consumer_processed`: no payload, no headers, one index
besides the primary key (processed_at, for the dedup window's retention). The Consumer's
insert refuses an id that is pending in `consumer_queue` or recorded here (decision 17).

The upgrade moves the processed rows of `consumer_queue` here, then deletes them, under an
EXCLUSIVE lock on `consumer_queue` (reads go on; a Handler or Consumer of the previous release
waits for the commit), so a redelivery of a message handled before the upgrade is refused after
it and a message pending before it is handled once. Stop the previous release's Handlers
before upgrading: they would mark rows processed in place, which this release no longer reads.
The downgrade moves the ids back as processed rows (payload and headers empty).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.postgres.queries import quote_ident

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: As 0006 for the queue tables: the table churns (one insert per handled message, one delete
#: after the dedup window), so it is vacuumed by rows changed, not by its size.
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
    q = quote_ident(schema)
    op.create_table(
        "consumer_processed",
        sa.Column("message_id", sa.Uuid(), primary_key=True),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("key", sa.LargeBinary()),
        sa.Column("lane", sa.SmallInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "processed_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column("handled_count", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("1")),
        schema=schema,
    )
    op.create_index("consumer_processed_at", "consumer_processed", ["processed_at"], schema=schema)
    settings = ", ".join(f"{name} = {value}" for name, value in AUTOVACUUM.items())
    op.execute(f"ALTER TABLE {q}.consumer_processed SET ({settings})")
    op.execute(f"LOCK TABLE {q}.consumer_queue IN EXCLUSIVE MODE")
    op.execute(
        f"WITH moved AS (DELETE FROM {q}.consumer_queue WHERE processed_at IS NOT NULL "
        f"RETURNING message_id, id, topic, key, lane, created_at, processed_at, handled_count, "
        f"attempts) "
        f"INSERT INTO {q}.consumer_processed (message_id, id, topic, key, lane, created_at, "
        f"processed_at, handled_count, attempts) "
        f"SELECT message_id, id, topic, key, lane, created_at, processed_at, "
        f"GREATEST(handled_count, 1), attempts FROM moved"
    )
    op.drop_index("consumer_queue_processed", table_name="consumer_queue", schema=schema)


def downgrade(schema: str) -> None:
    q = quote_ident(schema)
    op.execute(f"LOCK TABLE {q}.consumer_queue IN EXCLUSIVE MODE")
    op.create_index(
        "consumer_queue_processed",
        "consumer_queue",
        ["processed_at"],
        schema=schema,
        postgresql_where=sa.text("processed_at IS NOT NULL"),
    )
    op.execute(
        f"INSERT INTO {q}.consumer_queue (id, message_id, topic, key, payload, content_type, "
        f"lane, created_at, attempts, processed_at, handled_count) "
        f"SELECT id, message_id, topic, key, ''::bytea, 'application/octet-stream', lane, "
        f"created_at, attempts, processed_at, handled_count FROM {q}.consumer_processed "
        f"ON CONFLICT DO NOTHING"
    )
    op.drop_table("consumer_processed", schema=schema)
