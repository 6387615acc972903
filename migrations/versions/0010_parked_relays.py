"""relay_state.parked_at: a relay parked by --idle-disconnect stays listed, as parked

A relay serving one of several databases parks after `--idle-disconnect` seconds without rows:
it leaves its lanes and closes its connection, looking for rows on a short-lived one. Until this
revision it also deleted its `relay_state` row, so `outbox status` and the console said
"processes: none registered" of a database a running process serves. Now a parking relay keeps
its row with `parked_at` set (since when), refreshes `updated_at` now and then from its looks,
and no relay counts a parked row when sharing lanes (`relay_count`); a parked row whose process
stopped looking is forgotten after a while (`relay_forget_dead`).

Adding a nullable column without a default rewrites nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.postgres.queries import quote_ident

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    op.add_column(
        "relay_state",
        sa.Column("parked_at", sa.DateTime(timezone=True), nullable=True),
        schema=schema,
    )


def downgrade(schema: str) -> None:
    op.execute(f"DELETE FROM {quote_ident(schema)}.relay_state WHERE parked_at IS NOT NULL")
    op.drop_column("relay_state", "parked_at", schema=schema)
