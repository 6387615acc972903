"""consumer_queue_pending in id order: the Handler's fetch reads it without a sort

The Handler fetches the oldest pending rows of the lanes it owns, in id order. With the pending
index on `(lane, id)`, a fetch over all its lanes (`lane = ANY(...)`) had to read every pending
row of those lanes and sort them for each batch: 36 ms per fetch of 200 rows at 60,000 pending
rows on the project's VM, the largest single cost of the whole path (benchmark w, with
pg_stat_statements). In id order, with the lane as a filter, the fetch reads about as many
index entries as it returns: 0.07 ms. Built without CONCURRENTLY (Alembic runs in a
transaction): the build reads the whole table once and blocks writes to it meanwhile; on a large
inbox run it in a quiet moment.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

PENDING = "processed_at IS NULL AND dead_at IS NULL"


def upgrade(schema: str) -> None:
    op.drop_index("consumer_queue_pending", table_name="consumer_queue", schema=schema)
    op.create_index(
        "consumer_queue_pending",
        "consumer_queue",
        ["id"],
        schema=schema,
        postgresql_where=sa.text(PENDING),
    )


def downgrade(schema: str) -> None:
    op.drop_index("consumer_queue_pending", table_name="consumer_queue", schema=schema)
    op.create_index(
        "consumer_queue_pending",
        "consumer_queue",
        ["lane", "id"],
        schema=schema,
        postgresql_where=sa.text(PENDING),
    )
