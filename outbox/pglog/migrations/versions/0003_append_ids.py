"""Append ids: a random id per append stored with each record, so that a member can tell that
the record before its position is still the one it read (the log restored from a backup or
rolled back by hand under it); the group's committed record's id beside its offset, and a note
of the last time the log went back under the group (docs/decisions/0019).

Nothing is rewritten: the new columns are nullable or have a constant default, and records
appended before have no append id (a member then checks only the partition's end).

Revision ID: log0003
Revises: log0002
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "log0003"
down_revision = "log0002"
branch_labels = None
depends_on = None


def upgrade(schema: str) -> None:
    s = '"' + schema + '"'
    # Added without a default, then given one: a volatile default on ADD COLUMN would rewrite
    # the table, SET DEFAULT only applies to the rows inserted from now on. The publisher
    # gives every record of one append to one partition the same id (log_append); the
    # default covers the records an older publisher appends during the upgrade, or an INSERT
    # by hand: an id per record.
    op.execute(f"ALTER TABLE {s}.log_records ADD COLUMN append_id bigint")
    op.execute(
        f"ALTER TABLE {s}.log_records ALTER COLUMN append_id "
        "SET DEFAULT (random() * 9.2e18)::bigint"
    )
    # last_offset, last_append_id: the record before next_offset as the member that stored
    # it read it (NULL id: not known); an offset written by hand leaves last_offset behind,
    # and is then not checked. went_back*: how often the log was found behind the group's
    # position here, and the last time (outbox status).
    op.execute(f"""
        ALTER TABLE {s}.log_group_offsets
            ADD COLUMN last_offset bigint,
            ADD COLUMN last_append_id bigint,
            ADD COLUMN went_back int NOT NULL DEFAULT 0,
            ADD COLUMN went_back_at timestamptz,
            ADD COLUMN went_back_position bigint,
            ADD COLUMN went_back_end bigint,
            ADD COLUMN went_back_to bigint""")


def downgrade(schema: str) -> None:
    s = '"' + schema + '"'
    op.execute(f"""
        ALTER TABLE {s}.log_group_offsets
            DROP COLUMN went_back_to,
            DROP COLUMN went_back_end,
            DROP COLUMN went_back_position,
            DROP COLUMN went_back_at,
            DROP COLUMN went_back,
            DROP COLUMN last_append_id,
            DROP COLUMN last_offset""")
    op.execute(f"ALTER TABLE {s}.log_records DROP COLUMN append_id")
