"""The Consumer's inbox on PostgreSQL: `InboxWriter` and `InboxWriterSession` (outbox.ports).

A session is one autocommit psycopg connection: each statement of `InboxStore` (insert,
quarantine) runs in a pipeline, so it is sent at once and commits on its own while the caller
does its `meanwhile` work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from outbox.core.batches import InboxBatch, Quarantined
from outbox.postgres.connection import Connection, check_database, connect
from outbox.postgres.inbox_store import InboxStore
from outbox.postgres.migrate import check_schema

__all__ = ["PostgresInbox", "PostgresInboxSession"]

APPLICATION_NAME = "outbox-consumer"


class PostgresInboxSession:
    """An `InboxWriterSession` on one psycopg connection (autocommit)."""

    def __init__(self, conn: Connection, store: InboxStore) -> None:
        self.conn = conn
        self.store = store

    @property
    def usable(self) -> bool:
        return not (self.conn.closed or self.conn.broken)

    def insert(
        self, batch: InboxBatch, meanwhile: Callable[[], None] | None = None
    ) -> Counter[str]:
        # In a pipeline the statement is sent at once, and committed when the pipeline ends,
        # after `meanwhile`.
        with self.conn.pipeline():
            result = self.store.insert(self.conn, batch)
            if meanwhile is not None:
                meanwhile()
        return result()

    def quarantine(self, records: Sequence[Quarantined]) -> Counter[str]:
        with self.conn.pipeline():
            result = self.store.quarantine(self.conn, records)
        return result()

    def close(self) -> None:
        self.conn.close()


class PostgresInbox:
    """The `InboxWriter` of `consumer_queue` in schema `schema` of the database at `url`."""

    def __init__(self, url: str, schema: str, *, connect_timeout: float) -> None:
        self.url = url
        self.schema = schema
        self.connect_timeout = connect_timeout
        self.store = InboxStore(schema)

    def _connect(self) -> Connection:
        return connect(self.url, timeout=self.connect_timeout, application_name=APPLICATION_NAME)

    def connect(self, *, checked: bool = False) -> PostgresInboxSession:
        conn = self._connect()
        if checked:
            try:
                check_schema(conn, self.schema)
            except BaseException:
                conn.close()
                raise
        return PostgresInboxSession(conn, self.store)

    def check(
        self,
        *,
        wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        attempt: Callable[[], None] = lambda: None,
    ) -> None:
        def open_connection() -> Connection:
            attempt()
            return self._connect()

        check_database(open_connection, self.schema, wait=wait, stopping=stopping)
