"""Inbox work for handlers in other languages (`outbox serve`'s `/v1/inbox`): rows of
`consumer_queue` leased over HTTP, acknowledged as handled, or failed under the retry policy
(docs/http.md). Every method runs in the caller's transaction."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql as psql

from outbox.core.retry import Backoff
from outbox.postgres.connection import connect, notified
from outbox.postgres.queries import channel, queries


@dataclass(frozen=True)
class LeasedRow:
    """One row of `consumer_queue` leased to a client."""

    id: int
    message_id: UUID
    topic: str
    key: bytes | None
    payload: bytes
    headers: dict[str, Any] | None
    content_type: str
    attempt: int
    created_at: datetime


class InboxLeases:
    """The HTTP leases of one schema's inbox."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.sql = queries(schema)

    def lease(self, conn: Any, topics: Sequence[str], limit: int, lease: float) -> list[LeasedRow]:
        """Lease up to `limit` rows of `topics` for `lease` seconds (one per key at a time)."""
        conn.execute(self.sql["serve_inbox_lock"], {"schema": self.schema})
        rows = conn.execute(
            self.sql["serve_inbox_lease"],
            {"topics": list(topics), "limit": limit, "lease": lease},
        ).fetchall()
        return sorted(
            (
                LeasedRow(
                    int(r[0]),
                    r[1],
                    r[2],
                    None if r[3] is None else bytes(r[3]),
                    bytes(r[4]),
                    r[5],
                    r[6],
                    int(r[7]),
                    r[8],
                )
                for r in rows
            ),
            key=lambda row: row.id,
        )

    def ack(self, conn: Any, ids: Sequence[int]) -> list[int]:
        """Mark `ids` handled (they leave the queue, their message ids are kept for the dedup
        window, as the Handler does); the ids that were not rows to mark (unknown, handled
        already, or dead)."""
        done = {int(r[0]) for r in conn.execute(self.sql["serve_inbox_done"], {"ids": list(ids)})}
        return [i for i in ids if i not in done]

    def attempts(self, conn: Any, row_id: int) -> tuple[str, int] | None:
        """A pending row's topic and attempts; None when handled, dead or unknown."""
        row = conn.execute(self.sql["serve_inbox_attempts"], {"id": row_id}).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def nack(
        self,
        conn: Any,
        row_id: int,
        error: str,
        *,
        max_attempts: int,
        backoff: Backoff,
        retry_after: float | None,
    ) -> tuple[bool, float] | None:
        """Fail the attempt of `row_id`: dead once it had `max_attempts`, else due again after
        `retry_after` seconds (the backoff's delay when None). (dead, delay); None when the row
        is not leased (handled, dead or unknown)."""
        found = self.attempts(conn, row_id)
        if found is None:
            return None
        attempts = found[1]
        dead = attempts >= max_attempts
        delay = backoff.delay(attempts) if retry_after is None else retry_after
        row = conn.execute(
            self.sql["serve_inbox_nack"],
            {"id": row_id, "error": error, "dead": dead, "delay": delay},
        ).fetchone()
        return None if row is None else (dead, delay)


class InboxWakeups:
    """One session of an inbox's database that LISTENs for stored rows on behalf of a server's
    inbox long polls: listed in `relay_state` as a process of kind 'serve', always sleeping, so
    that the Consumer's store NOTIFYs while it lives (a killed server's row is dropped as a
    dead relay's). `wait` returns when a notification came, or after `timeout` seconds. Not
    thread-safe: one thread waits."""

    def __init__(self, url: str, schema: str) -> None:
        self.sql = queries(schema)
        # host:pid:random, as a daemon's (`outbox status` shows its host and pid).
        self.relay_id = f"{socket.gethostname()}:{os.getpid()}:serve-{uuid.uuid4().hex[:8]}"
        self.conn = connect(url, timeout=10, application_name="outbox-serve-inbox-wakeups")
        try:
            self.conn.execute(self.sql["relay_forget_dead"])
            self.conn.execute(
                psql.SQL("LISTEN {}").format(psql.Identifier(channel(schema, "consumer_queue")))
            )
            self.conn.execute(self.sql["serve_listener_register"], {"relay_id": self.relay_id})
        except BaseException:
            self.conn.close()
            raise

    def wait(self, timeout: float) -> bool:
        """Whether a store was notified within `timeout` seconds (others pending taken too)."""
        return notified(self.conn, timeout)

    def close(self) -> None:
        """Unregister and close (a closed session's row is dropped by the next relay's look)."""
        with contextlib.suppress(psycopg.Error):
            self.conn.execute(self.sql["relay_unregister"], {"relay_id": self.relay_id})
        self.conn.close()
