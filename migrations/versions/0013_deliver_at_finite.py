"""producer_scheduled.deliver_at is a finite time

PostgreSQL's timestamps include `infinity` and `-infinity`, which the SQL send took as a
`deliver_at`: an `infinity` row waited in `producer_scheduled` for ever, and every statement
that measures the time to the next due row (`now() - deliver_at`) failed with "cannot subtract
infinite timestamps", so the Producer's move of due rows failed at each look for its lanes and
`outbox status` could not read its database. A CHECK constraint now refuses such a time
from any writer (the SQL send, a hand-written INSERT or UPDATE) with its name,
`producer_scheduled_deliver_at_finite`. Rows already there are made finite first: `infinity`
becomes 9999-12-30 (due last, as meant: never soon), `-infinity` now (it was due). The
statements that read due times also clamp them to years 1 and 9999, so a row written after the
constraint was dropped by hand harms nothing either. Python's and HTTP's sends never wrote
one (a datetime is finite).

The check is added and validated in the migration's transaction: one scan of
`producer_scheduled` (the messages waiting for a due time) while sends to that table wait.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

from outbox.postgres.queries import quote_ident

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

CONSTRAINT = "producer_scheduled_deliver_at_finite"


def upgrade(schema: str) -> None:
    q = quote_ident(schema)
    op.execute(
        f"UPDATE {q}.producer_scheduled SET deliver_at = CASE WHEN deliver_at > now() "
        "THEN timestamptz '9999-12-30Z' ELSE now() END WHERE NOT isfinite(deliver_at)"
    )
    op.execute(
        f"ALTER TABLE {q}.producer_scheduled ADD CONSTRAINT {CONSTRAINT} "
        "CHECK (isfinite(deliver_at)) NOT VALID"
    )
    op.execute(f"ALTER TABLE {q}.producer_scheduled VALIDATE CONSTRAINT {CONSTRAINT}")


def downgrade(schema: str) -> None:
    op.execute(f"ALTER TABLE {quote_ident(schema)}.producer_scheduled DROP CONSTRAINT {CONSTRAINT}")
