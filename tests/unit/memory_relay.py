"""An in-memory `producer_queue` and `consumer_queue` behind the relay ports (outbox.ports), for
unit tests of the Producer's and the Handler's loops without PostgreSQL: lanes owned one session
at a time, rows fetched in id order and held behind a key's retrying row as `producer_fetch`
and `handler_fetch` hold them, wake-ups on insert, handler transactions that apply at commit."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import NoReturn, Self

from outbox.core.batches import OutgoingRecord
from outbox.core.inbox_rows import Claimed, ClaimedBatch, FailedAttempt, Pending
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


# -- the inbox: `consumer_queue` and the Handler's transactions -------------------------------


class MemoryLost(Exception):
    """What a memory session raises for a lost connection (never, unless a test says)."""


@dataclass
class InboxEntry:
    claimed: Claimed
    lane: int
    due: float = 0.0
    state: str = "pending"  # "processed", "dead"
    error: str | None = None
    processed_at: float = 0.0


class MemoryTransaction:
    """A handler transaction in memory: what it did applies at commit, or never. A callback
    receives it as its connection and may `write` effects, which commit with its row."""

    def __init__(self) -> None:
        self.done: list[int] = []
        self.failed: list[FailedAttempt] = []
        self.effects: list[object] = []

    def write(self, effect: object) -> None:
        self.effects.append(effect)


class MemoryInbox:
    """One `consumer_queue` (with the lanes of its Handlers) in memory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[int, InboxEntry] = {}
        self.owners: dict[int, object] = {}
        self.sessions: set[object] = set()
        #: What the callbacks' committed transactions wrote, in commit order.
        self.effects: list[object] = []
        self._ids = itertools.count(1)

    def store(self, topic: str, key: bytes | None, payload: bytes) -> int:
        """Store one message as the Consumer would have."""
        message_id = uuid.uuid4()
        now = datetime.now(UTC)
        with self.lock:
            row_id = next(self._ids)
            claimed = Claimed(
                id=row_id,
                message_id=message_id,
                topic=topic,
                key=key,
                payload=payload,
                headers={},
                content_type="application/json",
                created_at=now,
                received_at=now,
                attempts=0,
                partition=None,
                offset=None,
            )
            self.rows[row_id] = InboxEntry(claimed, lane_for(key, message_id))
        return row_id

    def stores(self) -> RelayStores:
        """Relay stores whose Handlers use this inbox."""

        def outbox(target: RelayTarget) -> NoReturn:
            raise AssertionError("no outbox in memory")

        def inbox(target: RelayTarget) -> MemoryInboxDatabase:
            assert target.kind == "handler"
            return MemoryInboxDatabase(self)

        return RelayStores(outbox=outbox, inbox=inbox)

    def fetch(self, lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:
        now = time.monotonic()
        out: list[Pending] = []
        held: set[bytes] = set()
        with self.lock:
            for row_id in sorted(self.rows):
                entry = self.rows[row_id]
                claimed = entry.claimed
                if entry.state != "pending" or entry.lane not in lanes:
                    continue
                ordered = claimed.topic not in unordered and claimed.key is not None
                if ordered and claimed.key in held:
                    continue
                if entry.due > now:
                    if ordered and claimed.key is not None:
                        held.add(claimed.key)  # the key waits behind its retrying row
                    continue
                out.append(Pending(row_id, entry.lane, claimed.key, claimed.topic))
                if len(out) >= limit:
                    break
        return out

    def commit(self, tx: MemoryTransaction) -> None:
        with self.lock:
            for row_id in tx.done:
                entry = self.rows[row_id]
                entry.state, entry.processed_at = "processed", time.monotonic()
            for failed in tx.failed:
                self._fail(failed)
            self.effects.extend(tx.effects)

    def _fail(self, failed: FailedAttempt) -> None:
        entry = self.rows[failed.id]
        entry.claimed = entry.claimed._replace(attempts=entry.claimed.attempts + 1)
        entry.error = failed.error
        if failed.dead:
            entry.state = "dead"
        else:
            entry.due = time.monotonic() + failed.delay


class MemoryInboxSession(MemoryOutboxSession):
    """The Handler's control session on a `MemoryInbox` (an `outbox.ports.InboxSession`)."""

    def __init__(self, inbox: MemoryInbox) -> None:
        super().__init__(inbox)  # type: ignore[arg-type]  # the lanes' part is the same
        self.inbox = inbox

    def fetch(self, lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:  # type: ignore[override]
        return self.inbox.fetch(lanes, limit, unordered)

    def next_due(self, lanes: list[int]) -> float | None:
        with self.inbox.lock:
            dues = [
                e.due for e in self.inbox.rows.values() if e.lane in lanes and e.state == "pending"
            ]
        due = max(dues, default=0.0)
        return due - time.monotonic() if due else None

    def forget_processed(self, window: float, limit: int) -> int:
        cutoff = time.monotonic() - window
        with self.inbox.lock:
            old = [i for i, e in self.inbox.rows.items() if e.state == "processed"]
            old = [i for i in old if self.inbox.rows[i].processed_at < cutoff][:limit]
            for row_id in old:
                del self.inbox.rows[row_id]
        return len(old)

    def recent_topics(self, limit: int) -> dict[str, int]:
        with self.inbox.lock:
            topics = [e.claimed.topic for _, e in sorted(self.inbox.rows.items())[-limit:]]
        return {topic: topics.count(topic) for topic in set(topics)}

    def attempts(self, row_id: int) -> int:
        with self.inbox.lock:
            entry = self.inbox.rows.get(row_id)
        return entry.claimed.attempts if entry else 0

    def terminate(self, backend_pid: int) -> None:
        raise AssertionError("no callback overruns its lease here")

    def fail(self, failed: FailedAttempt) -> None:  # type: ignore[override]
        with self.inbox.lock:
            self.inbox._fail(failed)


class MemoryHandlerSession:
    """A worker's session on a `MemoryInbox` (an `outbox.ports.HandlerSession`)."""

    backend_pid = 0
    broken = False

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox

    @contextmanager
    def transaction(
        self, *, pipelined: bool = False
    ) -> Iterator[tuple[MemoryTransaction, MemoryTransaction]]:
        tx = MemoryTransaction()
        yield tx, tx  # an exception: nothing of it applies (rolled back)
        self.inbox.commit(tx)

    def check(self) -> None:
        pass

    def flush(self, handle: object) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryHandlerWork:
    """The inbox store's statements in a `MemoryTransaction` (an `outbox.ports.HandlerWork`)."""

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox

    def claim_next(
        self, tx: MemoryTransaction, lanes: list[int], limit: int, unordered: list[str]
    ) -> ClaimedBatch:
        rows = self.inbox.fetch(lanes, limit, unordered)
        claimed = self.claim_many(tx, [row.id for row in rows])
        return ClaimedBatch([row for row in rows if row.id in claimed], claimed, len(rows))

    def claim_many(self, tx: MemoryTransaction, ids: list[int]) -> dict[int, Claimed]:
        with self.inbox.lock:
            entries = [(i, self.inbox.rows.get(i)) for i in ids]
        return {i: e.claimed for i, e in entries if e is not None and e.state == "pending"}

    def done_many(self, tx: MemoryTransaction, ids: list[int]) -> None:
        tx.done.extend(ids)

    def fail(self, tx: MemoryTransaction, failed: FailedAttempt) -> None:
        tx.failed.append(failed)

    async def claim_async(self, tx: MemoryTransaction, row_id: int) -> Claimed | None:
        return self.claim_many(tx, [row_id]).get(row_id)

    async def done_async(self, tx: MemoryTransaction, row_id: int) -> None:
        tx.done.append(row_id)

    async def fail_async(self, tx: MemoryTransaction, failed: FailedAttempt) -> None:
        tx.failed.append(failed)


class MemoryInboxDatabase:
    """The `InboxDatabase` of a `MemoryInbox`: sync workers only."""

    errors: tuple[type[Exception], ...] = (MemoryLost,)
    disconnects: tuple[type[Exception], ...] = (MemoryLost,)

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox
        self.work = MemoryHandlerWork(inbox)

    def connect(self) -> MemoryInboxSession:
        return MemoryInboxSession(self.inbox)

    def check(self, wait: float, stopping: object, attempt: object) -> None:
        pass

    def open_session(self, library: str) -> MemoryHandlerSession:
        return MemoryHandlerSession(self.inbox)

    async def open_async_session(self, library: str) -> NoReturn:
        raise AssertionError("no async callbacks here")
