"""The inbox's statements on `consumer_queue` for the Consumer: insert and quarantine.

The inbox store turns the core batches a transport delivers into the bind parameters of
`inbox_insert` and `inbox_quarantine`; no transport knows them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from outbox.core.batches import InboxBatch, Quarantined
from outbox.postgres.connection import Connection
from outbox.postgres.queries import channel, queries


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
    """Stores received batches in `consumer_queue` (one schema), waking a sleeping Handler.

    Each method starts one statement (atomic on its own in autocommit) and returns a function
    that gives, once the statement's results are in, the rows stored per topic.
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


def _counts(row: Any, column: int) -> Counter[str]:
    return Counter[str](row[column] if row and row[column] else {})
