"""Lock ids: the advisory lock of a (group, partition) is keyed by the log schema's OID and an id
of the pair unique in the schema, so that two logs in one database, two groups or two
partitions never share a lock; members say which keys they use, and a member of an older outbox
still running after this migration is refused at its next heartbeat (docs/decisions/0019).

Revision ID: log0004
Revises: log0003
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "log0004"
down_revision = "log0003"
branch_labels = None
depends_on = None

#: The partition locks' protocol of the members this revision admits (`log_members.protocol`;
#: `outbox.pglog.subscriber.PROTOCOL`): 2, the keys of log_group_locks.
PROTOCOL = 2


def upgrade(schema: str) -> None:
    s = '"' + schema + '"'
    # The lower half of a partition lock's key (the upper half is the schema's OID): below
    # 2^30, so that no key of a log ever equals outbox's migration lock (0x6F7574626F78, whose
    # lower half is 0x74626F78), whatever the schema's OID.
    op.execute(f"""
        CREATE TABLE {s}.log_group_locks (
            lock_id       serial PRIMARY KEY CHECK (lock_id < 1073741824),
            group_id      int NOT NULL REFERENCES {s}.log_groups (id) ON DELETE CASCADE,
            partition_id  int NOT NULL REFERENCES {s}.log_partitions (id) ON DELETE CASCADE,
            UNIQUE (group_id, partition_id)
        )""")
    op.execute(f"CREATE INDEX log_group_locks_partition ON {s}.log_group_locks (partition_id)")
    # NULL: a member of an older outbox, which locks partitions by the keys before this
    # revision. NOT VALID: its row stays as it is, but any change of it (its heartbeat, its
    # nap, a registration) fails with this constraint's name, and its consumer stops: it can
    # take no partition a member of this revision holds. Its locks are respected until then
    # (log_partitions_held).
    op.execute(f"ALTER TABLE {s}.log_members ADD COLUMN protocol smallint")
    op.execute(
        f"ALTER TABLE {s}.log_members ADD CONSTRAINT log_members_need_a_newer_outbox "
        f"CHECK (protocol IS NOT NULL AND protocol >= {PROTOCOL}) NOT VALID"
    )


def downgrade(schema: str) -> None:
    s = '"' + schema + '"'
    op.execute(f"ALTER TABLE {s}.log_members DROP CONSTRAINT log_members_need_a_newer_outbox")
    op.execute(f"ALTER TABLE {s}.log_members DROP COLUMN protocol")
    op.execute(f"DROP TABLE {s}.log_group_locks")
