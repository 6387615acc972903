"""The relays' queue stores in PostgreSQL: the adapters of `outbox.ports`' relay side.

A session wraps one psycopg connection (autocommit) and runs, for each port method, the one
statement the lanes (`lanes.py`) or the store (`outbox_store.py`) has for it: nothing more goes
over the wire than when the relays called those directly. What the relays share is here, with
the Producer's outbox; the Handler's inbox is in `inbox.py`, beside the Consumer's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Self

import psycopg

from outbox.core.batches import OutgoingRecord
from outbox.ports import RelayTarget
from outbox.postgres.connection import Connection, check_database, connect, notified
from outbox.postgres.lanes import Lanes
from outbox.postgres.outbox_store import OutboxStore

__all__ = [
    "PostgresOutbox",
    "PostgresOutboxSession",
    "PostgresRelaySession",
    "RelayDatabase",
]

#: The queue table of each kind of relay.
TABLES = {"producer": OutboxStore.table, "handler": "consumer_queue"}


class PostgresRelaySession:
    """A relay's connection: lane locks, the relay registry, LISTEN and the sleeping flag."""

    planner_settings: tuple[str, ...] = ()

    def __init__(self, conn: Connection, lanes: Lanes) -> None:
        self.conn = conn
        self.lanes = lanes

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def check_lock_class(self) -> None:
        self.lanes.check_lock_class(self.conn)

    def join(self) -> None:
        # A queue table's statistics are wrong most of the time: the store says which plans
        # its statements want (docs/decisions/0007). Only this session is affected.
        self.lanes.join(self.conn, self.planner_settings)

    def leave(self, parked: bool = False) -> None:
        self.lanes.leave(self.conn, parked)

    def parked_seen(self) -> None:
        self.lanes.parked_seen(self.conn)

    def set_sleeping(self, sleeping: bool) -> None:
        self.lanes.set_sleeping(self.conn, sleeping)

    def live_relays(self) -> int:
        return self.lanes.live_relays(self.conn)

    def held(self) -> set[int]:
        return self.lanes.held(self.conn)

    def lock(self, lane: int) -> bool:
        return self.lanes.lock(self.conn, lane)

    def lock_each(self, lanes: list[int]) -> list[int]:
        return self.lanes.lock_each(self.conn, lanes)

    def unlock(self, lane: int) -> None:
        self.lanes.unlock(self.conn, lane)

    def notified(self, timeout: float) -> bool:
        return notified(self.conn, timeout)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.conn.__exit__(exc_type, exc, tb)


class PostgresOutboxSession(PostgresRelaySession):
    """The Producer's session on `producer_queue`."""

    planner_settings = OutboxStore.planner_settings

    def __init__(self, conn: Connection, lanes: Lanes, store: OutboxStore) -> None:
        super().__init__(conn, lanes)
        self.store = store
        store.adapt(conn)

    def fetch(
        self, lanes: list[int], limit: int, exclude: list[int]
    ) -> psycopg.Cursor[OutgoingRecord]:
        return self.store.fetch(self.conn, lanes, limit, exclude)

    def next_due(self, lanes: list[int]) -> float | None:
        return self.store.next_due(self.conn, lanes)

    def promote(self, lanes: list[int], limit: int) -> tuple[int, float | None]:
        return self.store.promote(self.conn, lanes, limit)

    def delete(self, ids: Sequence[int]) -> None:
        self.store.delete(self.conn, ids)

    def fail(
        self, ids: Sequence[int], errors: Sequence[str], delays: Sequence[float | None]
    ) -> None:
        self.store.fail(self.conn, ids, errors, delays)

    def pipeline(self) -> AbstractContextManager[object]:
        return self.conn.pipeline()

    def transaction(self) -> AbstractContextManager[object]:
        return self.conn.transaction()


class RelayDatabase:
    """A relay's database in PostgreSQL: connecting and the start-up check."""

    def __init__(self, target: RelayTarget) -> None:
        self.database_url = target.database_url
        self.schema = target.schema
        self.timeout = target.connect_timeout
        self.application_name = target.application_name
        self.lanes = Lanes(target.schema, TABLES[target.kind], target.kind, target.relay_id)

    def _connect(self) -> Connection:
        return connect(
            self.database_url, timeout=self.timeout, application_name=self.application_name
        )

    def check(self, wait: float, stopping: Callable[[], bool], attempt: Callable[[], None]) -> None:
        def open_connection() -> Connection:
            attempt()
            return self._connect()

        check_database(open_connection, self.schema, wait=wait, stopping=stopping)


class PostgresOutbox(RelayDatabase):
    """The Producer's `producer_queue` (an `outbox.ports.OutboxDatabaseFactory`: made from
    a `RelayTarget`)."""

    def __init__(self, target: RelayTarget) -> None:
        super().__init__(target)
        self.store = OutboxStore(target.schema)

    def connect(self) -> PostgresOutboxSession:
        return PostgresOutboxSession(self._connect(), self.lanes, self.store)
