"""http_published: the message ids `outbox serve` accepted, so that a publish retried over HTTP
is written once

A message sent with `Broker.send` is refused while its id waits in `producer_queue`; once
relayed the row is gone, and the same id would be written again. An HTTP client retries after a
timeout or a lost answer without knowing whether its first request committed, so `outbox serve`
records each id the client gave in the transaction that writes the message: a second request
with that id finds it here and writes nothing (docs/decisions/0023). Rows older than the
server's `--idempotency-window` are deleted by the server.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    op.create_table(
        "http_published",
        sa.Column("message_id", sa.Uuid(), primary_key=True),
        sa.Column(
            "published_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        schema=schema,
    )
    op.create_index("http_published_at", "http_published", ["published_at"], schema=schema)


def downgrade(schema: str) -> None:
    op.drop_table("http_published", schema=schema)
