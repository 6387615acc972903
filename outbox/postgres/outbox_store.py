"""The relay's statements on `producer_queue`: fetch, delete, fail (the outbox store)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from psycopg import Cursor
from psycopg.adapt import Dumper
from psycopg.postgres import types
from psycopg.rows import RowMaker

from outbox.core.batches import OutgoingRecord
from outbox.postgres.connection import Connection
from outbox.postgres.queries import queries

#: The row tuple becomes an OutgoingRecord as it is (what `_make` does, less its length check:
#: `producer_fetch` returns the record's columns).
_as_record: RowMaker[OutgoingRecord] = partial(tuple.__new__, OutgoingRecord)


def _records(_cursor: Cursor[Any]) -> RowMaker[OutgoingRecord]:
    """psycopg row factory of `producer_fetch`."""
    return _as_record


class Ids:
    """Row ids bound as one `bigint[]` parameter (of `producer_fetch` and `producer_delete`).

    Its text form is built in one join: psycopg's own list dumpers handle each element in
    Python, which cost the relay about 1.5 ms per 8,000 ids, twice per batch (docs/performance.md,
    "The relay and the log: profiles"). The parameter is typed `bigint[]`, so that PostgreSQL
    plans each execution with the array as a constant, hashed (Producer.planner_settings).
    """

    __slots__ = ("ids",)

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = ids


class _IdsDumper(Dumper):
    oid = types["int8"].array_oid

    def dump(self, obj: Ids) -> bytes:
        return ("{" + ",".join(map(str, obj.ids)) + "}").encode()


class OutboxStore:
    """Reads and settles the rows of `producer_queue` for the relay (one schema)."""

    table = "producer_queue"
    #: Whatever `producer_queue`'s statistics say (docs/decisions/0007): read it in id order
    #: through the primary key, so the fetch stops after `limit` rows instead of sorting the
    #: backlog; and plan each execution with its arrays as constants, which PostgreSQL hashes
    #: or looks up, instead of a generic plan made for an empty table that compares every row
    #: with every id of a batch. Not `enable_seqscan = off`: it made the relay's catalog
    #: queries (dead relays, lane locks) take 100 ms and delayed messages by as much. No JIT:
    #: a sort the plan cannot do without (`producer_promote`'s, of the rows it moves) costs
    #: 10^10 with sorts off, past `jit_above_cost`, and compiling took 0.4 s per execution.
    planner_settings = ("enable_sort = off", "plan_cache_mode = force_custom_plan", "jit = off")

    def __init__(self, schema: str) -> None:
        self.sql = queries(schema)

    @staticmethod
    def adapt(conn: Connection) -> None:
        """Teach `conn` to bind `Ids` (once per connection, before the store's statements)."""
        conn.adapters.register_dumper(Ids, _IdsDumper)

    def fetch(
        self, conn: Connection, lanes: list[int], limit: int, exclude: list[int]
    ) -> Cursor[OutgoingRecord]:
        """Start `producer_fetch` (in a pipeline, without waiting for its rows): the next rows
        of `lanes` that may go out now, in id order, less the ids in `exclude`."""
        # Binary results: bytea arrives as it is, without hex decoding.
        cursor = conn.cursor(row_factory=_records, binary=True)
        params = {"lanes": lanes, "limit": limit, "exclude": Ids(exclude)}
        return cursor.execute(self.sql["producer_fetch"], params)

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        """Seconds until a retrying row of `lanes` may be fetched, or None."""
        row = conn.execute(self.sql["producer_next_retry"], {"lanes": lanes}).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def promote(self, conn: Connection, lanes: list[int], limit: int) -> tuple[int, float | None]:
        """Move up to `limit` scheduled rows of `lanes` that fell due into `producer_queue`:
        how many, and the seconds until the next one falls due (None: none waits)."""
        params = {"lanes": lanes, "limit": limit}
        row = conn.execute(self.sql["producer_promote"], params).fetchone()
        assert row is not None
        return int(row[0]), None if row[1] is None else float(row[1])

    def delete(self, conn: Connection, ids: Sequence[int]) -> None:
        """Forget delivered rows."""
        conn.execute(self.sql["producer_delete"], {"ids": Ids(ids)})

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
