"""The relay's statements on `producer_queue`: fetch, delete, fail (the outbox store)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import Cursor
from psycopg.rows import RowMaker

from outbox.core.batches import OutgoingRecord
from outbox.postgres.connection import Connection
from outbox.postgres.queries import queries


def _records(_cursor: Cursor[Any]) -> RowMaker[OutgoingRecord]:
    """psycopg row factory of `producer_fetch`: the row tuple becomes an OutgoingRecord as it is."""
    return OutgoingRecord._make


class OutboxStore:
    """Reads and settles the rows of `producer_queue` for the relay (one schema)."""

    table = "producer_queue"
    #: Whatever `producer_queue`'s statistics say (docs/decisions/0007): read it in id order
    #: through the primary key, so the fetch stops after `limit` rows instead of sorting the
    #: backlog; and plan each execution with its arrays as constants, which PostgreSQL hashes
    #: or looks up, instead of a generic plan made for an empty table that compares every row
    #: with every id of a batch. Not `enable_seqscan = off`: it made the relay's catalog
    #: queries (dead relays, lane locks) take 100 ms and delayed messages by as much.
    planner_settings = ("enable_sort = off", "plan_cache_mode = force_custom_plan")

    def __init__(self, schema: str) -> None:
        self.sql = queries(schema)

    def fetch(
        self, conn: Connection, lanes: list[int], limit: int, exclude: list[int]
    ) -> Cursor[OutgoingRecord]:
        """Start `producer_fetch` (in a pipeline, without waiting for its rows): the next rows
        of `lanes` that may go out now, in id order, less the ids in `exclude`."""
        # Binary results: bytea arrives as it is, without hex decoding.
        cursor = conn.cursor(row_factory=_records, binary=True)
        params = {"lanes": lanes, "limit": limit, "exclude": exclude}
        return cursor.execute(self.sql["producer_fetch"], params)

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        """Seconds until a retrying row of `lanes` may be fetched, or None."""
        row = conn.execute(self.sql["producer_next_retry"], {"lanes": lanes}).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def delete(self, conn: Connection, ids: Sequence[int]) -> None:
        """Forget delivered rows."""
        conn.execute(self.sql["producer_delete"], {"ids": list(ids)})

    def fail(
        self,
        conn: Connection,
        ids: Sequence[int],
        errors: Sequence[str],
        delays: Sequence[float | None],
    ) -> None:
        """Record failed deliveries: retried after its delay, or dead where the delay is None.
        The errors must be storable text."""
        params = {"ids": list(ids), "errors": list(errors), "delays": list(delays)}
        conn.execute(self.sql["producer_fail"], params)
