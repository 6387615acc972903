"""`consumer_queue` and `consumer_processed` in memory (`MemoryInbox`): what the Consumer
stores (`inbox_insert`, `inbox_quarantine`) and the Handler's sessions fetch, claim, mark done,
fail and forget, in transactions that see their own writes, hold their rows' locks (SKIP LOCKED
passes over them) and apply at commit or never."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn

from outbox.core.batches import InboxBatch, Quarantined
from outbox.core.envelope import InboxRow
from outbox.core.inbox_rows import Claimed, ClaimedBatch, FailedAttempt, Pending
from outbox.core.lanes import lane_for
from outbox.ports import InboxWriters, RelayStores, RelayTarget
from outbox.testing.stores import values
from outbox.testing.stores.relays import MemoryRelaySession, Relays
from outbox.testing.stores.values import (
    DataError,
    LockTimeout,
    MemoryLost,
    as_uuid,
    aware,
    integer,
    jsonb,
    text,
)


@dataclass
class InboxEntry:
    """A row of the in-memory `consumer_queue`: pending, retrying or dead."""

    claimed: Claimed
    lane: int
    #: When it may be claimed (`time.monotonic()`), after a failed attempt.
    due: float = 0.0
    #: "pending" (retrying too: `attempts` > 0) or "dead".
    state: str = "pending"
    error: str | None = None
    #: A quarantined record's headers as received (`Quarantined.raw_headers`, parsed).
    raw_headers: Any = None

    @property
    def attempts(self) -> int:
        return self.claimed.attempts


@dataclass
class Processed:
    """A handled message, remembered in `consumer_processed` for the dedup window."""

    message_id: uuid.UUID
    row_id: int
    topic: str
    key: bytes | None
    #: Attempts, the successful one included (of every handling, if handled more than once).
    attempts: int
    #: When it was last handled (`time.monotonic()`).
    processed_at: float
    handled_count: int = 1


class MemoryTransaction:
    """A handler transaction on a `MemoryInbox`, which the callbacks receive as connection.

    What a callback `write`s commits with the rows its transaction handled, or never.
    """

    def __init__(self) -> None:
        #: What the callbacks wrote, in order (`MemoryInbox.effects` once committed).
        self.effects: list[object] = []
        #: Rows it deleted: True for handled, False for dropped (a handled message's copy).
        self.gone: dict[int, bool] = {}
        #: The message ids it handled.
        self.handled: set[uuid.UUID] = set()
        #: Rows it changed (failed attempts), as they are in it.
        self.changed: dict[int, InboxEntry] = {}
        #: Rows whose lock it holds.
        self.locked: set[int] = set()
        #: Ended from outside (`InboxSession.terminate`): it can never commit.
        self.terminated = False

    def write(self, effect: object) -> None:
        """Record an effect of the callback: it commits with the transaction, or never."""
        self.effects.append(effect)


class MemoryInbox:
    """One `consumer_queue` and its `consumer_processed` in memory.

    Consumers store in it (`writers()`), HandlerRunners read it (`stores()`).
    """

    def __init__(self) -> None:
        #: Guards everything below; row-lock waits wait on it.
        self.lock = threading.Condition()
        #: The rows of `consumer_queue` (pending, retrying, dead), by row id, in id order.
        self.rows: dict[int, InboxEntry] = {}
        #: The messages handled within the dedup window, by message id.
        self.processed: dict[uuid.UUID, Processed] = {}
        #: What the callbacks' committed transactions wrote, in commit order.
        self.effects: list[object] = []
        self.relays = Relays()
        #: Row locks: the open transaction that holds each.
        self.locks: dict[int, MemoryTransaction] = {}
        #: The workers' sessions, by backend pid (for `terminate`).
        self.sessions: dict[int, _WorkerSession] = {}
        self._ids = itertools.count(1)
        self._row_of: dict[uuid.UUID, int] = {}

    # -- what the code under test does ---------------------------------------------------------

    def store(
        self,
        topic: str,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        content_type: str = "application/octet-stream",
        message_id: uuid.UUID | None = None,
    ) -> int | None:
        """Store one message as a Consumer would have; its row id, or None when its message
        id is stored already or was handled within the dedup window. Bytes by default, as
        `Broker.send` sends bytes: pass the content type your handlers decode."""
        message_id = message_id or uuid.uuid4()
        row = InboxRow(
            message_id,
            topic,
            key,
            payload,
            dict(headers or {}),
            content_type,
            lane_for(key, message_id),
            datetime.now(UTC),
            0,
            0,
        )
        if not self.insert(InboxBatch.of([row])):
            return None
        with self.lock:
            return self._row_of[message_id]

    def dead(self) -> list[InboxEntry]:
        """The dead rows (failed for good, or quarantined), in id order."""
        with self.lock:
            return [entry for entry in self.rows.values() if entry.state == "dead"]

    def writer(self) -> MemoryInboxWriter:
        """The `InboxWriter` a Consumer stores batches in this inbox through."""
        return MemoryInboxWriter(self)

    def writers(self) -> InboxWriters:
        """`InboxWriters` for a Consumer (its `inbox=`): every database URL is this inbox."""

        def writers(url: str, schema: str, *, connect_timeout: float) -> MemoryInboxWriter:
            return self.writer()

        return writers

    def database(self, relay_id: str | None = None) -> MemoryInboxDatabase:
        """The `InboxDatabase` a HandlerRunner reaches this inbox through (one relay's)."""
        return MemoryInboxDatabase(self, relay_id or uuid.uuid4().hex)

    def stores(self) -> RelayStores:
        """Relay stores whose Handlers use this inbox; a Producer given them is refused."""

        def outbox(target: RelayTarget) -> NoReturn:
            raise ValueError("a MemoryInbox has no producer_queue: use MemoryOutbox.stores()")

        def inbox(target: RelayTarget) -> MemoryInboxDatabase:
            if target.kind != "handler":
                raise ValueError(f"a MemoryInbox serves handlers, not a {target.kind!r}")
            return self.database(target.relay_id)

        return RelayStores(outbox=outbox, inbox=inbox)

    # -- the Consumer's statements (inbox_insert, inbox_quarantine) -----------------------------

    def insert(self, batch: InboxBatch) -> Counter[str]:
        """Store the ordinary records of `batch` once per message id (not one pending, dead or
        handled within the dedup window; the first of a batch's copies), all or none
        (`DataError`), and wake a sleeping Handler; the rows stored per topic."""
        now = datetime.now(UTC)
        entries = [
            InboxEntry(
                Claimed(
                    id=0,
                    message_id=as_uuid(batch.message_ids[i]),
                    topic=text(batch.topics[i], "topic"),
                    key=batch.keys[i],
                    payload=batch.payloads[i],
                    headers=_nullif_empty(jsonb(batch.headers[i], "headers")),
                    content_type=text(batch.content_types[i], "content type"),
                    created_at=aware(batch.created_ats[i]),
                    received_at=now,
                    attempts=0,
                    partition=integer(batch.partitions[i], 32, "partition"),
                    offset=integer(batch.offsets[i], 64, "offset"),
                ),
                integer(batch.lanes[i], 16, "lane"),
            )
            for i in range(batch.ordinary)
        ]
        stored = self._add(entries)
        self.relays.wake_if_sleeping()
        return stored

    def quarantine(self, records: Sequence[Quarantined]) -> Counter[str]:
        """Store records that cannot be ordinary rows as dead rows with their reason (no user
        headers, the raw-bytes content type, 0 attempts), once per message id, all or none
        (`DataError`); the rows stored per topic."""
        now = datetime.now(UTC)
        entries = [
            InboxEntry(
                Claimed(
                    id=0,
                    message_id=as_uuid(q.message_id),
                    topic=text(q.topic, "topic"),
                    key=q.key,
                    payload=q.payload,
                    headers=None,
                    content_type="application/octet-stream",
                    created_at=aware(q.created_at),
                    received_at=now,
                    attempts=0,
                    partition=integer(q.partition, 32, "partition"),
                    offset=integer(q.offset, 64, "offset"),
                ),
                integer(q.lane, 16, "lane"),
                state="dead",
                error=text(q.reason, "reason"),
                raw_headers=jsonb(q.raw_headers, "raw headers"),
            )
            for q in records
        ]
        return self._add(entries)

    def _add(self, entries: list[InboxEntry]) -> Counter[str]:
        stored: Counter[str] = Counter()
        with self.lock:
            for entry in entries:
                message_id = entry.claimed.message_id
                if message_id in self._row_of or message_id in self.processed:
                    continue
                row_id = next(self._ids)
                entry.claimed = entry.claimed._replace(id=row_id)
                self.rows[row_id] = entry
                self._row_of[message_id] = row_id
                stored[entry.claimed.topic] += 1
        return stored

    # -- the Handler's control session (handler_fetch, handler_next_retry, ...) ----------------

    def fetch(self, lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:
        """The next rows of `lanes` due for handling, in id order, as committed (see `_due`)."""
        with self.lock:
            due = self._due(self.rows, lanes, limit, unordered)
        return [_pending(entry) for entry in due]

    def next_due(self, lanes: list[int]) -> float | None:
        """Seconds until a retrying key of `lanes` is free (at the latest due of its retrying
        rows; a row without a key on its own), negative if due; None when none retries."""
        wanted = set(lanes)
        free_at: dict[object, float] = {}
        with self.lock:
            for row_id, entry in self.rows.items():
                if entry.state != "pending" or entry.attempts == 0 or entry.lane not in wanted:
                    continue
                key = entry.claimed.key
                group = (entry.lane, key) if key is not None else row_id
                free_at[group] = max(free_at.get(group, entry.due), entry.due)
        return min(free_at.values()) - time.monotonic() if free_at else None

    def forget_processed(self, window: float, limit: int) -> int:
        """Forget up to `limit` messages handled more than `window` seconds ago; how many."""
        cutoff = time.monotonic() - window
        with self.lock:
            old = [m for m, p in self.processed.items() if p.processed_at < cutoff]
            old = old[: max(0, limit)]
            for message_id in old:
                del self.processed[message_id]
        return len(old)

    def recent_topics(self, limit: int) -> dict[str, int]:
        """The topics of the last `limit` rows of `consumer_queue`: rows per topic."""
        with self.lock:
            recent = [self.rows[i].claimed.topic for i in list(self.rows)[::-1][: max(0, limit)]]
        return dict(sorted(Counter(recent).items()))

    def attempts(self, row_id: int) -> int:
        """The attempts a row has had (0 if it is gone)."""
        with self.lock:
            entry = self.rows.get(row_id)
        return entry.attempts if entry is not None else 0

    def fail(self, failed: FailedAttempt) -> None:
        """Record a failed attempt on its own (committed at once; it waits for the row's lock
        like any statement)."""
        apply = _failure(failed)
        with self.lock:
            if failed.id not in self.rows:
                return
            scratch = MemoryTransaction()
            self._take(scratch, [failed.id])
            try:
                if failed.id in self.rows:
                    self.rows[failed.id] = apply(self.rows[failed.id])
            finally:
                self._release(scratch)

    def terminate(self, backend_pid: int) -> None:
        """End the transaction of the worker session `backend_pid` as a terminated backend
        ends: its locks go now, and its statements and its commit raise `MemoryLost`."""
        with self.lock:
            session = self.sessions.get(backend_pid)
            if session is None:
                return
            session.broken = True
            if session.tx is not None:
                session.tx.terminated = True
                self._release(session.tx)

    # -- the Handler's transactions -------------------------------------------------------------

    def _view(self, tx: MemoryTransaction) -> dict[int, InboxEntry]:
        """The rows as `tx` sees them: its own changes in."""
        if not (tx.gone or tx.changed):
            return self.rows
        return {i: tx.changed.get(i, e) for i, e in self.rows.items() if i not in tx.gone}

    @staticmethod
    def _due(
        rows: dict[int, InboxEntry],
        lanes: list[int],
        limit: int,
        unordered: list[str],
        skip: Callable[[int], bool] = lambda _: False,
    ) -> list[InboxEntry]:
        """The pending rows of `lanes` due now, in id order, less those `skip` says and those
        of a key (in its lane) whose retrying row is not due yet, except on the `unordered`
        topics; at most `limit`."""
        now, wanted, free = time.monotonic(), set(lanes), set(unordered)
        blocked = {
            (entry.lane, entry.claimed.key)
            for entry in rows.values()
            if entry.state == "pending" and entry.attempts > 0 and entry.due > now
        }
        out: list[InboxEntry] = []
        for row_id, entry in rows.items():
            if len(out) >= limit:
                break
            if entry.state != "pending" or entry.lane not in wanted or entry.due > now:
                continue
            key = entry.claimed.key
            if key is not None and entry.claimed.topic not in free and (entry.lane, key) in blocked:
                continue
            if not skip(row_id):
                out.append(entry)
        return out

    def _alive(self, tx: MemoryTransaction) -> None:
        if tx.terminated:
            raise MemoryLost("terminating connection due to administrator command")

    def _locked_by_other(self, tx: MemoryTransaction) -> Callable[[int], bool]:
        return lambda row_id: self.locks.get(row_id, tx) is not tx

    def _take(self, tx: MemoryTransaction, row_ids: Sequence[int]) -> None:
        """Lock rows for `tx`, waiting while another open transaction holds one (`lock`
        held): `LockTimeout` after `values.LOCK_TIMEOUT` seconds."""
        held_by_other = self._locked_by_other(tx)
        deadline = time.monotonic() + values.LOCK_TIMEOUT
        while any(held_by_other(row_id) for row_id in row_ids):
            self._alive(tx)
            if not self.lock.wait(max(0.0, deadline - time.monotonic())):
                raise LockTimeout("canceling statement due to lock timeout")
        self._alive(tx)
        for row_id in row_ids:
            self.locks[row_id] = tx
        tx.locked.update(row_ids)

    def _release(self, tx: MemoryTransaction) -> None:
        for row_id in tx.locked:
            if self.locks.get(row_id) is tx:
                del self.locks[row_id]
        tx.locked.clear()
        self.lock.notify_all()

    def claim_next(
        self, tx: MemoryTransaction, lanes: list[int], limit: int, unordered: list[str]
    ) -> ClaimedBatch:
        """`handler_claim_next`: the rows `fetch` would give `tx`, less those another
        transaction holds (SKIP LOCKED), locked; a handled message's copy is dropped."""
        with self.lock:
            self._alive(tx)
            due = self._due(self._view(tx), lanes, limit, unordered, self._locked_by_other(tx))
            kept = self._claim(tx, due)
        return ClaimedBatch(
            [_pending(entry) for entry in kept], {e.claimed.id: e.claimed for e in kept}, len(due)
        )

    def claim_many(self, tx: MemoryTransaction, ids: Sequence[int]) -> dict[int, Claimed]:
        """`handler_claim_many`: lock the rows of `ids` no other transaction holds; those
        still pending are returned, a handled message's copy is dropped."""
        with self.lock:
            self._alive(tx)
            view, held_by_other = self._view(tx), self._locked_by_other(tx)
            found = [view[i] for i in sorted(set(ids)) if i in view and not held_by_other(i)]
            kept = self._claim(tx, found)
        return {e.claimed.id: e.claimed for e in kept if e.state == "pending"}

    def _claim(self, tx: MemoryTransaction, rows: list[InboxEntry]) -> list[InboxEntry]:
        """Lock `rows` for `tx`, dropping (deleting in `tx`) those whose message was handled;
        the others (`lock` held)."""
        self._take(tx, [entry.claimed.id for entry in rows])
        kept: list[InboxEntry] = []
        for entry in rows:
            message_id = entry.claimed.message_id
            if message_id in self.processed or message_id in tx.handled:
                tx.gone[entry.claimed.id] = False
            else:
                kept.append(entry)
        return kept

    def done(self, tx: MemoryTransaction, ids: Sequence[int]) -> None:
        """`handler_done_many`: delete rows in `tx`; their messages count as handled from its
        commit on."""
        with self.lock:
            self._alive(tx)
            view = self._view(tx)
            present = [row_id for row_id in dict.fromkeys(ids) if row_id in view]
            self._take(tx, present)
            for row_id in present:
                tx.gone[row_id] = True
                tx.handled.add(view[row_id].claimed.message_id)
                tx.changed.setdefault(row_id, view[row_id])

    def fail_in(self, tx: MemoryTransaction, failed: FailedAttempt) -> None:
        """`handler_fail` in `tx`."""
        apply = _failure(failed)
        with self.lock:
            self._alive(tx)
            current = self._view(tx).get(failed.id)
            if current is None:
                return
            self._take(tx, [failed.id])
            tx.changed[failed.id] = apply(current)

    def commit(self, tx: MemoryTransaction) -> None:
        """Apply `tx` at once (`MemoryLost`, and nothing of it, if it was terminated)."""
        with self.lock:
            try:
                self._alive(tx)
                now = time.monotonic()
                for row_id, changed in tx.changed.items():
                    if row_id in self.rows and row_id not in tx.gone:
                        self.rows[row_id] = changed
                for row_id, handled in tx.gone.items():
                    gone = self.rows.pop(row_id, None)
                    if gone is None:
                        continue
                    gone = tx.changed.get(row_id, gone)
                    self._row_of.pop(gone.claimed.message_id, None)
                    if handled:
                        self._remember(gone, now)
                self.effects.extend(tx.effects)
            finally:
                self._release(tx)

    def rollback(self, tx: MemoryTransaction) -> None:
        """End `tx` without applying anything of it."""
        with self.lock:
            self._release(tx)

    def _remember(self, entry: InboxEntry, now: float) -> None:
        claimed = entry.claimed
        known = self.processed.get(claimed.message_id)
        if known is None:
            self.processed[claimed.message_id] = Processed(
                claimed.message_id,
                claimed.id,
                claimed.topic,
                claimed.key,
                claimed.attempts + 1,
                now,
            )
        else:  # handled twice: the audit's "duplicated"
            known.handled_count += 1
            known.processed_at = now
            known.attempts += claimed.attempts + 1


def _nullif_empty(headers: Any) -> Any:
    """The claims' `NULLIF(headers, '{}')`: no user headers read as None."""
    return None if headers == {} else headers


def _pending(entry: InboxEntry) -> Pending:
    return Pending(entry.claimed.id, entry.lane, entry.claimed.key, entry.claimed.topic)


def _failure(failed: FailedAttempt) -> Callable[[InboxEntry], InboxEntry]:
    """What a failed attempt makes of a row (`handler_fail`): an attempt more, its error, and
    a retry after its delay or, when dead, none. `DataError` for what PostgreSQL refuses."""
    text(failed.error, "error")
    if not failed.dead:
        values.delay(failed.delay)

    def apply(entry: InboxEntry) -> InboxEntry:
        claimed = entry.claimed._replace(attempts=entry.claimed.attempts + 1)
        if failed.dead:
            return replace(entry, claimed=claimed, error=failed.error, state="dead")
        due = time.monotonic() + failed.delay
        return replace(entry, claimed=claimed, error=failed.error, state="pending", due=due)

    return apply


class MemoryInboxSession(MemoryRelaySession):
    """The Handler's control session on a `MemoryInbox` (an `outbox.ports.InboxSession`)."""

    def __init__(self, inbox: MemoryInbox, relay_id: str) -> None:
        super().__init__(inbox.relays, relay_id)
        self.inbox = inbox

    def fetch(self, lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:
        self._live()
        return self.inbox.fetch(lanes, limit, unordered)

    def next_due(self, lanes: list[int]) -> float | None:
        self._live()
        return self.inbox.next_due(lanes)

    def forget_processed(self, window: float, limit: int) -> int:
        self._live()
        return self.inbox.forget_processed(window, limit)

    def recent_topics(self, limit: int) -> dict[str, int]:
        self._live()
        return self.inbox.recent_topics(limit)

    def attempts(self, row_id: int) -> int:
        self._live()
        return self.inbox.attempts(row_id)

    def terminate(self, backend_pid: int) -> None:
        self._live()
        self.inbox.terminate(backend_pid)

    def fail(self, failed: FailedAttempt) -> None:
        self._live()
        self.inbox.fail(failed)


_backend_pids = itertools.count(1)


class _WorkerSession:
    """What a worker's sync and async sessions share.

    One transaction at a time, and a backend pid `InboxSession.terminate` knows it by.
    """

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox
        self.backend_pid = next(_backend_pids)
        #: Lost: the transaction it had open was terminated (`InboxSession.terminate`).
        self.broken = False
        self.closed = False
        self.tx: MemoryTransaction | None = None
        with inbox.lock:
            inbox.sessions[self.backend_pid] = self

    def _begin(self) -> MemoryTransaction:
        if self.broken or self.closed:
            raise MemoryLost("the connection is lost" if self.broken else "the session is closed")
        if self.tx is not None:
            raise RuntimeError("a worker's session runs one transaction at a time")
        self.tx = MemoryTransaction()
        return self.tx

    def _end(self, tx: MemoryTransaction, failed: bool) -> None:
        self.tx = None
        if failed:
            self.inbox.rollback(tx)
        else:
            self.inbox.commit(tx)

    def check(self) -> None:
        """Nothing a callback does to a `MemoryTransaction` leaves it unusable."""

    def _close(self) -> None:
        self.closed = True
        with self.inbox.lock:
            self.inbox.sessions.pop(self.backend_pid, None)


class MemoryHandlerSession(_WorkerSession):
    """A worker's session on a `MemoryInbox` (an `outbox.ports.HandlerSession`).

    Its transactions are `MemoryTransaction`s, which the callbacks receive as connection.
    """

    @contextmanager
    def transaction(
        self, *, pipelined: bool = False
    ) -> Iterator[tuple[MemoryTransaction, MemoryTransaction]]:
        tx = self._begin()
        try:
            yield tx, tx
        except BaseException:
            self._end(tx, failed=True)
            raise
        self._end(tx, failed=False)

    def flush(self, handle: object) -> None:
        """Nothing to send early: a `MemoryTransaction` keeps its writes until commit."""

    def close(self) -> None:
        self._close()


class MemoryAsyncHandlerSession(_WorkerSession):
    """A worker's session for async callbacks (an `outbox.ports.AsyncHandlerSession`)."""

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[tuple[MemoryTransaction, MemoryTransaction]]:
        tx = self._begin()
        try:
            yield tx, tx
        except BaseException:
            self._end(tx, failed=True)
            raise
        self._end(tx, failed=False)

    async def close(self) -> None:
        self._close()


class MemoryHandlerWork:
    """The inbox's statements in a `MemoryTransaction` (an `outbox.ports.HandlerWork`)."""

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox

    def claim_next(
        self, tx: MemoryTransaction, lanes: list[int], limit: int, unordered: list[str]
    ) -> ClaimedBatch:
        return self.inbox.claim_next(tx, lanes, limit, unordered)

    def claim_many(self, tx: MemoryTransaction, ids: list[int]) -> dict[int, Claimed]:
        return self.inbox.claim_many(tx, ids)

    def done_many(self, tx: MemoryTransaction, ids: list[int]) -> None:
        self.inbox.done(tx, ids)

    def fail(self, tx: MemoryTransaction, failed: FailedAttempt) -> None:
        self.inbox.fail_in(tx, failed)

    async def claim_async(self, tx: MemoryTransaction, row_id: int) -> Claimed | None:
        return self.inbox.claim_many(tx, [row_id]).get(row_id)

    async def done_async(self, tx: MemoryTransaction, row_id: int) -> None:
        self.inbox.done(tx, [row_id])

    async def fail_async(self, tx: MemoryTransaction, failed: FailedAttempt) -> None:
        self.inbox.fail_in(tx, failed)


class MemoryInboxDatabase:
    """The `InboxDatabase` of a `MemoryInbox`: always reachable and migrated."""

    errors: tuple[type[Exception], ...] = (MemoryLost, DataError, LockTimeout)
    disconnects: tuple[type[Exception], ...] = (MemoryLost,)

    def __init__(self, inbox: MemoryInbox, relay_id: str) -> None:
        self.inbox = inbox
        self.relay_id = relay_id
        self.work = MemoryHandlerWork(inbox)

    def connect(self) -> MemoryInboxSession:
        return MemoryInboxSession(self.inbox, self.relay_id)

    def check(self, wait: float, stopping: Callable[[], bool], attempt: Callable[[], None]) -> None:
        attempt()

    def open_session(self, library: str) -> MemoryHandlerSession:
        return MemoryHandlerSession(self.inbox)

    async def open_async_session(self, library: str) -> MemoryAsyncHandlerSession:
        return MemoryAsyncHandlerSession(self.inbox)


class MemoryInboxWriterSession:
    """A Consumer's session on a `MemoryInbox` (an `outbox.ports.InboxWriterSession`)."""

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox
        self.closed = False

    @property
    def usable(self) -> bool:
        return not self.closed

    def insert(
        self, batch: InboxBatch, meanwhile: Callable[[], None] | None = None
    ) -> Counter[str]:
        if self.closed:
            raise MemoryLost("the session is closed")
        if meanwhile is not None:
            meanwhile()  # the statement is on its way: its outcome comes after
        return self.inbox.insert(batch)

    def quarantine(self, records: Sequence[Quarantined]) -> Counter[str]:
        if self.closed:
            raise MemoryLost("the session is closed")
        return self.inbox.quarantine(records)

    def close(self) -> None:
        self.closed = True


class MemoryInboxWriter:
    """The `InboxWriter` of a `MemoryInbox`: always reachable and migrated."""

    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox

    def connect(self, *, checked: bool = False) -> MemoryInboxWriterSession:
        return MemoryInboxWriterSession(self.inbox)

    def check(
        self,
        *,
        wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        attempt: Callable[[], None] = lambda: None,
    ) -> None:
        attempt()
