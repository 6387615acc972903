"""An in-memory `producer_queue` behind the relay ports (outbox.ports), for unit tests of the
Producer's loop without PostgreSQL: lanes owned one session at a time, rows fetched in id order
and held behind a key's retrying row as `producer_fetch` holds them, wake-ups on insert."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import NoReturn, Self

from outbox.core.batches import OutgoingRecord
from outbox.core.lanes import lane_for
from outbox.ports import RelayStores, RelayTarget


@dataclass
class Row:
    record: OutgoingRecord
    lane: int
    due: float = 0.0
    error: str | None = None


class Rows:
    """What a fetch returns: read at once (nothing is pipelined in memory)."""

    def __init__(self, rows: list[OutgoingRecord]) -> None:
        self.rows = rows

    def fetchall(self) -> list[OutgoingRecord]:
        return self.rows

    def fetchone(self) -> OutgoingRecord | None:
        return self.rows[0] if self.rows else None


class MemoryOutbox:
    """One `producer_queue` and its relays' registry, shared by the sessions of any relay."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[int, Row] = {}
        self.dead: dict[int, Row] = {}
        self.owners: dict[int, MemoryOutboxSession] = {}
        self.sessions: set[MemoryOutboxSession] = set()
        self.statements = 0
        self._ids = itertools.count(1)

    # -- what a test does ---------------------------------------------------------------------

    def send(self, topic: str, key: bytes | None, payload: bytes) -> int:
        """Store one message (as `broker.send` would have, committed) and wake the relays."""
        message_id = uuid.uuid4()
        with self.lock:
            row_id = next(self._ids)
            record = OutgoingRecord(
                id=row_id,
                topic=topic,
                key=key,
                payload=payload,
                message_id=str(message_id),
                created_at="2026-11-27T00:00:00.000000+00:00",
                content_type="application/octet-stream",
                headers=None,
                attempts=0,
            )
            self.rows[row_id] = Row(record, lane_for(key, message_id))
            sessions = list(self.sessions)
        for session in sessions:
            session.wake.set()
        return row_id

    def stores(self) -> RelayStores:
        """Relay stores whose Producers use this queue (no Handler: its factory refuses)."""

        def outbox(target: RelayTarget) -> MemoryOutboxDatabase:
            assert target.kind == "producer"
            return MemoryOutboxDatabase(self)

        def inbox(target: RelayTarget) -> NoReturn:
            raise AssertionError("no inbox in memory")

        return RelayStores(outbox=outbox, inbox=inbox)

    # -- what the sessions do -----------------------------------------------------------------

    def fetch(self, lanes: list[int], limit: int, exclude: list[int]) -> list[OutgoingRecord]:
        wanted, skipped, now = set(lanes), set(exclude), time.monotonic()
        out: list[OutgoingRecord] = []
        held: set[tuple[int, bytes]] = set()
        with self.lock:
            self.statements += 1
            for row_id in sorted(self.rows):
                row = self.rows[row_id]
                if row.lane not in wanted:
                    continue
                key = row.record.key
                if key is not None and (row.lane, key) in held:
                    continue
                if key is not None and row.record.attempts > 0:
                    held.add((row.lane, key))  # the key's later rows wait behind it
                if row.due > now or row_id in skipped:
                    continue
                out.append(row.record)
                if len(out) >= limit:
                    break
        return out


class MemoryOutboxSession:
    """One relay's session on a `MemoryOutbox` (an `outbox.ports.OutboxSession`)."""

    def __init__(self, queue: MemoryOutbox) -> None:
        self.queue = queue
        self.closed = False
        self.sleeping = False
        self.wake = threading.Event()

    def check_lock_class(self) -> None:
        pass

    def join(self) -> None:
        with self.queue.lock:
            self.queue.sessions.add(self)

    def leave(self) -> None:
        with self.queue.lock:
            self.queue.sessions.discard(self)

    def set_sleeping(self, sleeping: bool) -> None:
        self.sleeping = sleeping

    def live_relays(self) -> int:
        with self.queue.lock:
            return max(1, len(self.queue.sessions))

    def held(self) -> set[int]:
        with self.queue.lock:
            return set(self.queue.owners)

    def lock(self, lane: int) -> bool:
        with self.queue.lock:
            return self.queue.owners.setdefault(lane, self) is self

    def unlock(self, lane: int) -> None:
        with self.queue.lock:
            if self.queue.owners.get(lane) is self:
                del self.queue.owners[lane]

    def notified(self, timeout: float) -> bool:
        woken = self.wake.wait(timeout)
        self.wake.clear()
        return woken

    def fetch(self, lanes: list[int], limit: int, exclude: list[int]) -> Rows:
        return Rows(self.queue.fetch(lanes, limit, exclude))

    def next_due(self, lanes: list[int]) -> float | None:
        with self.queue.lock:
            dues = [r.due for r in self.queue.rows.values() if r.lane in lanes and r.due]
        return min(dues) - time.monotonic() if dues else None

    def delete(self, ids: Sequence[int]) -> None:
        with self.queue.lock:
            self.queue.statements += 1
            for row_id in ids:
                self.queue.rows.pop(row_id, None)

    def fail(
        self, ids: Sequence[int], errors: Sequence[str], delays: Sequence[float | None]
    ) -> None:
        with self.queue.lock:
            self.queue.statements += 1
            for row_id, error, delay in zip(ids, errors, delays, strict=True):
                row = self.queue.rows[row_id]
                row.error = error
                row.record = row.record._replace(attempts=row.record.attempts + 1)
                if delay is None:
                    self.queue.dead[row_id] = self.queue.rows.pop(row_id)
                else:
                    row.due = time.monotonic() + delay

    def pipeline(self) -> AbstractContextManager[object]:
        return nullcontext()

    def transaction(self) -> AbstractContextManager[object]:
        return nullcontext()

    def close(self) -> None:
        self.closed = True
        with self.queue.lock:
            self.queue.sessions.discard(self)
            for lane in [lane for lane, s in self.queue.owners.items() if s is self]:
                del self.queue.owners[lane]  # locks die with their session

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class MemoryOutboxDatabase:
    """The `QueueDatabase` of a `MemoryOutbox`: always reachable and migrated."""

    def __init__(self, queue: MemoryOutbox) -> None:
        self.queue = queue

    def connect(self) -> MemoryOutboxSession:
        return MemoryOutboxSession(self.queue)

    def check(self, wait: float, stopping: object, attempt: object) -> None:
        pass
