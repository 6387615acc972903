"""What the Spark jobs run on a service's `consumer_queue` (statements of sql/spark.sql and
sql/audit.sql): the bulk store of the Kafka -> inbox stream, and the audit's reads.

The bulk store keeps the Consumer daemon's contract: a row is stored once per message id (the
unique index meets a task, micro-batch or replay that runs again), a row marked for quarantine
is stored dead by the daemon's own statement (`inbox_quarantine`), and a sleeping Handler is
woken by the same NOTIFY. The audit's reads never touch payloads or headers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg

from outbox.core.batches import quarantined_row
from outbox.core.envelope import InboxRow
from outbox.core.headers import to_json
from outbox.postgres.inbox import quarantine_params
from outbox.postgres.queries import channel, queries

#: The staging table's column types, in the order `store_rows` copies them.
STAGE_TYPES = [
    "uuid",
    "text",
    "bytea",
    "bytea",
    "jsonb",
    "text",
    "int2",
    "timestamptz",
    "int4",
    "int8",
]


def store_rows(conn: psycopg.Connection[Any], schema: str, rows: Sequence[InboxRow]) -> int:
    """Store rows in one transaction: COPY to a staging table, insert new ones, NOTIFY.

    A row `to_inbox_row` marked for quarantine is stored dead with its reason and raw headers,
    by the Consumer daemon's statement (`inbox_quarantine`). Returns how many rows were new,
    quarantined ones included.
    """
    sql = queries(schema)
    quarantined = [quarantined_row(r) for r in rows if r.quarantine is not None]
    with conn.transaction(), conn.cursor() as cursor:
        cursor.execute(sql["spark_inbox_stage"])
        with cursor.copy(sql["spark_inbox_copy"]) as copy:
            copy.set_types(STAGE_TYPES)
            for r in rows:
                if r.quarantine is not None:
                    continue
                copy.write_row(
                    (
                        r.message_id,
                        r.topic,
                        r.key,
                        r.payload,
                        to_json(r.headers),  # the jsonb dumper encodes it
                        r.content_type,
                        r.lane,
                        r.created_at,
                        r.partition,
                        r.offset,
                    )
                )
        cursor.execute(sql["spark_inbox_merge"], {"channel": channel(schema, "consumer_queue")})
        found = cursor.fetchone()
        stored = int(found[0]) if found else 0
        if quarantined:
            cursor.execute(sql["inbox_quarantine"], quarantine_params(quarantined))
            dead = cursor.fetchone()
            stored += sum(dead[0].values()) if dead and dead[0] else 0
    return stored


def id_bounds(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int] | None:
    """The (min, max) id of `consumer_queue`, or None when it is empty."""
    row = conn.execute(queries(schema)["audit_inbox_bounds"]).fetchone()
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def audit_rows(
    conn: psycopg.Connection[Any], schema: str, params: Mapping[str, Any], fetch_rows: int
) -> Iterator[list[tuple[Any, ...]]]:
    """The audit's columns of the inbox rows `params` select (`audit_inbox_read`), through a
    server-side cursor, `fetch_rows` rows at a time (never the whole range in memory)."""
    with conn.cursor(name="outbox_audit_inbox") as cursor:
        cursor.itersize = fetch_rows
        cursor.execute(queries(schema)["audit_inbox_read"], params)
        while rows := cursor.fetchmany(fetch_rows):
            yield rows
