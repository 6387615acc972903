"""The inbox on PostgreSQL (`consumer_queue` and `consumer_processed`): its statements and the
ports the Consumer and the Handler reach it through, in one module.

`InboxStore` holds the statements. For the Consumer: insert and quarantine, turning the core
batches a transport delivers into the bind parameters of `inbox_insert` and `inbox_quarantine`
(no transport knows them); a message id pending in `consumer_queue` or handled within the dedup
window (`consumer_processed`) is stored no more. For the Handler: fetch what is due, claim, mark
done (the row leaves `consumer_queue`, its id is recorded in `consumer_processed`), record a
failure, forget the handled ids past the dedup window, and end a transaction that overran its
lease.

`PostgresInboxWriter` (`outbox.ports.InboxWriter`) gives the Consumer its sessions,
`PostgresInboxWriterSession`: one autocommit psycopg connection each, where each statement runs
in a pipeline, so it is sent at once and commits on its own while the caller does its
`meanwhile` work. `PostgresInbox` (`outbox.ports.InboxDatabaseFactory`) gives the Handler its
control session, `PostgresInboxSession`, and its workers' transactions: those of
`outbox.postgres.sessions` (psycopg or SQLAlchemy, sync or async), whose statements run through
the session's `execute`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

import psycopg

from outbox.core.batches import InboxBatch, Quarantined
from outbox.core.inbox_rows import Claimed, ClaimedBatch, FailedAttempt, Pending
from outbox.ports import RelayTarget
from outbox.postgres.connection import Connection, check_database, connect
from outbox.postgres.lanes import Lanes
from outbox.postgres.migrate import check_schema
from outbox.postgres.queries import channel, queries
from outbox.postgres.relay_stores import PostgresRelaySession, RelayDatabase
from outbox.postgres.sessions import (
    AsyncExecute,
    AsyncSession,
    Execute,
    Session,
    disconnects,
    fetch_one,
    open_async_session,
    open_session,
)

__all__ = [
    "InboxStore",
    "PostgresInbox",
    "PostgresInboxSession",
    "PostgresInboxWriter",
    "PostgresInboxWriterSession",
    "insert_params",
    "quarantine_params",
]


def insert_params(batch: InboxBatch, wake_channel: str) -> dict[str, Any]:
    """Bind parameters of `inbox_insert` for the ordinary records of a batch."""
    return {
        "message_ids": batch.message_ids,
        "topics": batch.topics,
        "keys": batch.keys,
        "payloads": batch.payloads,
        "headers": batch.headers,
        "content_types": batch.content_types,
        "lanes": batch.lanes,
        "created_ats": batch.created_ats,
        "partitions": batch.partitions,
        "offsets": batch.offsets,
        "channel": wake_channel,
    }


def quarantine_params(records: Sequence[Quarantined]) -> dict[str, Any]:
    """Bind parameters of `inbox_quarantine`."""
    return {
        "message_ids": [q.message_id for q in records],
        "topics": [q.topic for q in records],
        "keys": [q.key for q in records],
        "payloads": [q.payload for q in records],
        "raw_headers": [q.raw_headers for q in records],
        "lanes": [q.lane for q in records],
        "created_ats": [q.created_at for q in records],
        "partitions": [q.partition for q in records],
        "offsets": [q.offset for q in records],
        "errors": [q.reason for q in records],
    }


#: The outcome of a statement started in a pipeline: call it once the pipeline ended.
Stored = Callable[[], Counter[str]]


class InboxStore:
    """The inbox's statements (one schema): the Consumer's and the Handler's.

    The Consumer's methods start one statement (atomic on its own in autocommit) and return a
    function that gives, once the statement's results are in, the rows stored per topic; a
    stored batch wakes a sleeping Handler.
    """

    def __init__(self, schema: str) -> None:
        self.sql = queries(schema)
        self.channel = channel(schema, "consumer_queue")

    def insert(self, conn: Connection, batch: InboxBatch) -> Stored:
        """Insert the ordinary records of `batch`, once per message id."""
        cursor = conn.execute(self.sql["inbox_insert"], insert_params(batch, self.channel))
        return lambda: _counts(cursor.fetchone(), 2)

    def quarantine(self, conn: Connection, records: Sequence[Quarantined]) -> Stored:
        """Store records that cannot be ordinary rows as dead rows, once per message id."""
        cursor = conn.execute(self.sql["inbox_quarantine"], quarantine_params(records))
        return lambda: _counts(cursor.fetchone(), 0)

    # -- the Handler's control connection ---------------------------------------------------

    def fetch(
        self, conn: Connection, lanes: list[int], limit: int, unordered: list[str]
    ) -> list[Pending]:
        """The next rows of `lanes` due for handling, in id order; a key waits behind its
        retrying row, except on the `unordered` topics."""
        params = {"lanes": lanes, "limit": limit, "unordered": unordered}
        return [Pending._make(r) for r in conn.execute(self.sql["handler_fetch"], params)]

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        """Seconds until a retrying row of `lanes` may be fetched (negative: due), or None."""
        row = conn.execute(self.sql["handler_next_retry"], {"lanes": lanes}).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def forget_processed(self, conn: Connection, window: float, limit: int) -> int:
        """Forget up to `limit` messages handled more than `window` seconds ago (their ids in
        `consumer_processed`); how many."""
        params = {"window": window, "limit": limit}
        return conn.execute(self.sql["handler_retention"], params).rowcount

    def recent_topics(self, conn: Connection, limit: int) -> dict[str, int]:
        """The topics of the last `limit` rows of `consumer_queue` (pending, retrying or dead;
        handled rows have left it): rows per topic."""
        rows = conn.execute(self.sql["handler_recent_topics"], {"limit": limit}).fetchall()
        return {str(topic): int(count) for topic, count in rows}

    def attempts(self, conn: Connection, row_id: int) -> int:
        """The attempts a row has had (0 if it is gone)."""
        row = conn.execute(self.sql["handler_attempts"], {"id": row_id}).fetchone()
        return int(row[0]) if row else 0

    def terminate(self, conn: Connection, backend_pid: int) -> None:
        """End the backend of a transaction that overran its lease: it rolls back and releases
        its row locks, so nothing it wrote can commit."""
        conn.execute(self.sql["handler_terminate"], {"pid": backend_pid})

    # -- in a handler transaction (a session's `execute`) --------------------------------------

    def claim_next(
        self, execute: Execute, lanes: list[int], limit: int, unordered: list[str]
    ) -> ClaimedBatch:
        """Fetch and lock the next rows of `lanes` due for handling, in id order (a key waits
        behind its retrying row, except on the `unordered` topics), as `claim_many` locks them:
        one statement instead of a fetch and a claim."""
        params = {"lanes": lanes, "limit": limit, "unordered": unordered}
        rows = execute(self.sql["handler_claim_next"], params).fetchall()
        pending: list[Pending] = []
        claimed: dict[int, Claimed] = {}
        for row in rows:
            if not row[13]:  # not `dropped` (a redelivery of a handled message, deleted)
                pending.append(Pending(row[0], row[12], row[3], row[2]))
                claimed[row[0]] = Claimed._make(row[:12])
        return ClaimedBatch(pending, claimed, len(rows))

    def claim_many(self, execute: Execute, ids: list[int]) -> dict[int, Claimed]:
        """Lock the rows of `ids` that are still pending and not held by another transaction.

        A row whose message id was handled meanwhile (a redelivery stored while its first
        copy's handling committed) is deleted in this transaction instead, and not returned."""
        rows = execute(self.sql["handler_claim_many"], {"ids": ids}).fetchall()
        return {row[0]: Claimed._make(row) for row in rows}

    def done_many(self, execute: Execute, ids: list[int]) -> None:
        """Mark rows processed: they leave `consumer_queue` and their ids are kept in
        `consumer_processed` for the dedup window."""
        execute(self.sql["handler_done_many"], {"ids": ids})

    def fail(self, execute: Execute, failed: FailedAttempt) -> None:
        """Record a failed attempt (see `FailedAttempt`)."""
        execute(self.sql["handler_fail"], failed._asdict())

    async def claim_async(self, execute: AsyncExecute, row_id: int) -> Claimed | None:
        """Lock one pending row, or None if it is handled or held by another transaction (as
        `claim_many`)."""
        row = await fetch_one(await execute(self.sql["handler_claim"], {"id": row_id}))
        return None if row is None else Claimed._make(row)

    async def done_async(self, execute: AsyncExecute, row_id: int) -> None:
        """Mark one row processed."""
        await execute(self.sql["handler_done"], {"id": row_id})

    async def fail_async(self, execute: AsyncExecute, failed: FailedAttempt) -> None:
        """Record a failed attempt."""
        await execute(self.sql["handler_fail"], failed._asdict())


def _counts(row: Any, column: int) -> Counter[str]:
    return Counter[str](row[column] if row and row[column] else {})


# -- the Consumer's sessions ---------------------------------------------------------------

#: The Consumer's connections, as pg_stat_activity shows them.
APPLICATION_NAME = "outbox-consumer"


class PostgresInboxWriterSession:
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


class PostgresInboxWriter:
    """The `InboxWriter` of `consumer_queue` in schema `schema` of the database at `url`."""

    def __init__(self, url: str, schema: str, *, connect_timeout: float) -> None:
        self.url = url
        self.schema = schema
        self.connect_timeout = connect_timeout
        self.store = InboxStore(schema)

    def _connect(self) -> Connection:
        return connect(self.url, timeout=self.connect_timeout, application_name=APPLICATION_NAME)

    def connect(self, *, checked: bool = False) -> PostgresInboxWriterSession:
        conn = self._connect()
        if checked:
            try:
                check_schema(conn, self.schema)
            except BaseException:
                conn.close()
                raise
        return PostgresInboxWriterSession(conn, self.store)

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


# -- the Handler's control session and workers' transactions ------------------------------


class PostgresInboxSession(PostgresRelaySession):
    """The Handler's control session on `consumer_queue`."""

    def __init__(self, conn: Connection, lanes: Lanes, store: InboxStore) -> None:
        super().__init__(conn, lanes)
        self.store = store

    def fetch(self, lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:
        return self.store.fetch(self.conn, lanes, limit, unordered)

    def next_due(self, lanes: list[int]) -> float | None:
        return self.store.next_due(self.conn, lanes)

    def forget_processed(self, window: float, limit: int) -> int:
        return self.store.forget_processed(self.conn, window, limit)

    def recent_topics(self, limit: int) -> dict[str, int]:
        return self.store.recent_topics(self.conn, limit)

    def attempts(self, row_id: int) -> int:
        return self.store.attempts(self.conn, row_id)

    def terminate(self, backend_pid: int) -> None:
        self.store.terminate(self.conn, backend_pid)

    def fail(self, failed: FailedAttempt) -> None:
        self.store.fail(self.conn.execute, failed)


class PostgresInbox(RelayDatabase):
    """The Handler's `consumer_queue` and its workers' sessions (an
    `outbox.ports.InboxDatabaseFactory`)."""

    #: What psycopg raises for a failed statement or a lost connection.
    errors: tuple[type[Exception], ...] = (psycopg.Error,)

    def __init__(
        self, target: RelayTarget, worker_application_name: str = "outbox-handler"
    ) -> None:
        super().__init__(target)
        self.store = InboxStore(target.schema)
        self.work = self.store
        self.disconnects = disconnects()
        self._worker_application_name = worker_application_name

    def connect(self) -> PostgresInboxSession:
        return PostgresInboxSession(self._connect(), self.lanes, self.store)

    def open_session(self, library: Literal["psycopg", "sqlalchemy"]) -> Session:
        return open_session(library, self.database_url, self._worker_application_name)

    async def open_async_session(self, library: Literal["psycopg", "sqlalchemy"]) -> AsyncSession:
        return await open_async_session(library, self.database_url, self._worker_application_name)
