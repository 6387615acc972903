"""A row's lane is one of the relays' lanes (0 to LANES - 1)

Relays read their lanes only (`lane = ANY(lanes)`), so a row whose lane is not one of the 64
(an INSERT written by hand, or by another language without `send()`, with a lane computed its
own way) was never relayed nor handled, and nothing said why: `outbox status` showed it pending,
older and older. A CHECK constraint on `producer_queue`, `producer_scheduled` and
`consumer_queue` now refuses such a lane from any writer, with its name
(`<table>_lane_in_range`). Rows already there get the lane `send()` would have given them
(`outbox.core.lanes.lane_for`: the CRC-32 of the key, or the message id's last byte, modulo
LANES, computed here in PL/pgSQL as the SQL send does), so they go out, in order with their
key's other rows. The constraints are added and validated in the migration's transaction.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

from outbox.core.lanes import LANES
from outbox.postgres.migrate import sibling_migration
from outbox.postgres.queries import quote_ident

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLES = ("producer_queue", "producer_scheduled", "consumer_queue")


def _crc32_table() -> str:
    """zlib's CRC-32 table as migration 0008 writes it for the SQL send."""
    return str(sibling_migration(__file__, "0008_sql_send.py")._crc32_table())


def _fix(q: str, table: str) -> str:
    """A PL/pgSQL loop giving each row of `table` whose lane is out of range the lane of its
    key (or, keyless, of its message id)."""
    return f"""
    FOR r IN SELECT id, key, message_id FROM {q}.{table}
             WHERE lane < 0 OR lane >= {LANES} LOOP
        IF r.key IS NULL THEN
            new_lane := mod(get_byte(uuid_send(r.message_id), 15), {LANES});
        ELSE
            crc := 4294967295;
            FOR i IN 0 .. octet_length(r.key) - 1 LOOP
                crc := (crc >> 8) # crc_table[((crc # get_byte(r.key, i)) & 255) + 1];
            END LOOP;
            new_lane := mod(crc # 4294967295, {LANES});
        END IF;
        UPDATE {q}.{table} SET lane = new_lane WHERE id = r.id;
    END LOOP;"""


def upgrade(schema: str) -> None:
    q = quote_ident(schema)
    loops = "".join(_fix(q, table) for table in TABLES)
    op.execute(f"""
DO $outbox$
DECLARE
    crc_table bigint[] := {_crc32_table()};
    r record;
    crc bigint;
    new_lane smallint;
BEGIN{loops}
END
$outbox$""")
    for table in TABLES:
        name = f"{table}_lane_in_range"
        op.execute(
            f"ALTER TABLE {q}.{table} ADD CONSTRAINT {name} "
            f"CHECK (lane >= 0 AND lane < {LANES}) NOT VALID"
        )
        op.execute(f"ALTER TABLE {q}.{table} VALIDATE CONSTRAINT {name}")


def downgrade(schema: str) -> None:
    q = quote_ident(schema)
    for table in TABLES:
        op.execute(f"ALTER TABLE {q}.{table} DROP CONSTRAINT {table}_lane_in_range")
