"""The inbox's statements on `consumer_queue` and `consumer_processed` (the inbox store).

For the Consumer: insert and quarantine, turning the core batches a transport delivers into the
bind parameters of `inbox_insert` and `inbox_quarantine` (no transport knows them); a message
id pending in `consumer_queue` or handled within the dedup window (`consumer_processed`) is
stored no more. For the Handler: fetch what is due, claim, mark done (the row leaves
`consumer_queue`, its id is recorded in `consumer_processed`), record a failure, forget the
handled ids past the dedup window, and end a transaction that overran its lease.

The Handler's transactions are those of `outbox.postgres.sessions` (psycopg or SQLAlchemy, sync
or async): their statements run through the session's `execute`; the Handler's control loop
passes its own psycopg connection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from outbox.core.batches import InboxBatch, Quarantined
from outbox.core.inbox_rows import Claimed, ClaimedBatch, FailedAttempt, Pending
from outbox.postgres.connection import Connection
from outbox.postgres.queries import channel, queries
from outbox.postgres.sessions import AsyncExecute, Execute, fetch_one


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
