"""Members' session timeouts: a member whose heartbeat (log_members.updated_at) is older than
its own session_timeout is evicted by the other members of its group (docs/decisions/0009).

Revision ID: log0002
Revises: log0001
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "log0002"
down_revision = "log0001"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    s = '"' + schema + '"'
    # NULL: a member of an older outbox, still running after this migration, which does not
    # heartbeat; it is never evicted (it leaves when its session ends, as before).
    op.execute(
        f"ALTER TABLE {s}.log_members ADD COLUMN session_timeout double precision "
        "CHECK (session_timeout > 0)"
    )


def downgrade(schema: str) -> None:
    s = '"' + schema + '"'
    op.execute(f"ALTER TABLE {s}.log_members DROP COLUMN session_timeout")
