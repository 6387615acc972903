"""A worker: one thread, its own database sessions, the rows of its own lanes in order.

Contract: a worker fetches and claims the next rows of its lanes in one statement, at the start
of the transaction that handles them (no row passes from thread to thread), and handles them in
their order; a row whose key already failed in this round is not handled (it waits behind the
failure, unless its handler is unordered). Runs of sync callbacks share batch transactions
(`batches.py`); an async callback has a transaction of its own on the worker's event loop. The
runner gives each worker its lanes and a quota per round, reads `current`, `started` and
`backend_pid` to enforce the lease, and sets `retired` when it replaced this worker.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from contextlib import suppress

from outbox import tracing
from outbox.core.handlers import Handlers, HandlerSpec
from outbox.core.inbox_rows import Claimed, Pending
from outbox.daemons.failpoints import failpoint
from outbox.daemons.handler.batches import Batches
from outbox.daemons.handler.config import HandlerConfig
from outbox.daemons.handler.failures import ConnectionLost, raise_lost
from outbox.daemons.handler.outcomes import Outcomes
from outbox.ports import AsyncHandlerSession, InboxDatabase

#: A round: the worker's lanes, how many rows it may take from them, and the event it sets
#: when it is done.
Job = tuple[list[int], int, threading.Event]


class Worker(Batches):
    """One thread handling the rounds the runner puts on `jobs`."""

    def __init__(
        self,
        index: int,
        config: HandlerConfig,
        handlers: Handlers,
        inbox: InboxDatabase,
        outcomes: Outcomes,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(config, handlers, inbox, outcomes)
        self.index = index
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self._stopping = stopping
        #: The last round's rows taken, and whether its last claim came back short (the lanes
        #: had no more rows due).
        self.taken = 0
        self.short = False
        #: What stopped a group (not a callback's failure) that retrying cannot fix: the
        #: runner re-raises it, which stops the daemon.
        self.error: BaseException | None = None
        #: What stopped a group that retrying can fix: the runner backs off.
        self.lost: ConnectionLost | None = None
        self._async: AsyncHandlerSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(
            target=self._main, name=f"outbox-handler-{index}", daemon=True
        )
        self.thread.start()

    def _main(self) -> None:
        try:
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                lanes, quota, done = job
                try:
                    self._round(lanes, quota)
                except BaseException as exc:  # handed to the runner, which re-raises it
                    if not self.retired:
                        self.error = exc
                finally:
                    self.current = None
                    done.set()
                if self.retired:
                    return
        finally:
            self._close()

    @property
    def connected(self) -> bool:
        """Whether the worker has a database session (it had rows in its lanes)."""
        return self._sync is not None or self._async is not None

    def _close(self) -> None:
        self.close_session()
        if self._async is not None and self._loop is not None:
            self._loop.run_until_complete(self._async.close())
        if self._loop is not None:
            self._loop.close()

    def _round(self, lanes: list[int], quota: int) -> None:
        """Claim and handle the rows of `lanes`, a transaction at a time, until `quota` rows
        were taken, a claim comes back short, or the runner stops or retires this worker."""
        self.taken = 0
        self.short = False
        failed_keys: set[bytes] = set()
        try:
            while not self.retired and not self._stopping():
                limit = min(self.config.transaction_size, quota - self.taken)
                taken = self._claim_and_handle(lanes, limit, failed_keys)
                self.taken += taken
                if taken < limit:
                    self.short = True
                    return
                if self.taken >= quota:
                    return
        except ConnectionLost as exc:
            if not self.retired:
                self.lost = exc  # the runner logs it and backs off
            self._reset()
        finally:
            self.current = None

    def _claim_and_handle(self, lanes: list[int], limit: int, failed_keys: set[bytes]) -> int:
        """One claiming transaction (`Batches.claim_batch`), then what it left: the rows after
        a failure, and those from the first async or lease-overrunning one on. How many rows
        the claim took."""
        taken, rest = self.claim_batch(lanes, limit, failed_keys)
        if rest:
            self._handle_rows(rest, failed_keys)
        return taken

    def _handle_rows(self, rows: list[Pending], failed_keys: set[bytes]) -> None:
        """Handle rows in order: runs of sync handlers in batched transactions."""
        if self.outcomes.alone:
            rows = self._hung_last(rows)
        chunk: list[Pending] = []
        limit = self.config.transaction_size
        for row in rows:
            spec = self.handlers.get(row.topic)
            if row.id in self.outcomes.alone:
                # Its callback overran its lease last time: alone, after the other keys (an
                # async callback in its own transaction, as always: called as a sync one it
                # would return a coroutine never awaited, and its row be marked done).
                self.handle_batches(chunk, failed_keys)
                chunk = []
                self.outcomes.alone.discard(row.id)
                if spec is not None and spec.is_async:
                    self._async_row(row, spec, failed_keys)
                else:
                    self.handle_batches([row], failed_keys)
                if self.retired:
                    return
                continue
            if spec is not None and spec.is_async:
                self.handle_batches(chunk, failed_keys)
                chunk = []
                self._async_row(row, spec, failed_keys)
            else:
                chunk.append(row)
                if len(chunk) >= limit:
                    self.handle_batches(chunk, failed_keys)
                    chunk = []
            if self.retired:
                return
        self.handle_batches(chunk, failed_keys)

    def _hung_last(self, rows: list[Pending]) -> list[Pending]:
        """`rows` with those whose callback overran its lease, and the later rows of their
        keys, moved after the rest (in their order): a key's own order is kept, other keys no
        longer wait behind a callback that may hang again."""
        alone = self.outcomes.alone
        held_keys: set[bytes] = set()
        first: list[Pending] = []
        last: list[Pending] = []
        for row in rows:
            if row.id in alone or (row.key is not None and row.key in held_keys):
                last.append(row)
                if row.key is not None:
                    held_keys.add(row.key)
            else:
                first.append(row)
        return first + last if last else rows

    def _reset(self) -> None:
        self.close_session(quietly=True)
        if self._async is not None and self._loop is not None:
            with suppress(Exception):
                self._loop.run_until_complete(self._async.close())
        self._async = None

    # -- async callbacks: one row, one transaction ---------------------------------------------

    def _async_row(self, row: Pending, spec: HandlerSpec, failed_keys: set[bytes]) -> None:
        if self.blocked(row, failed_keys):
            return
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        self.started = time.monotonic()
        self.current = row
        if not self._loop.run_until_complete(self._handle_async(row, spec)):
            self.note_failure(row, spec, failed_keys)
        self.current = None

    async def _async_session(self) -> AsyncHandlerSession:
        if self._async is None:
            try:
                self._async = await self.inbox.open_async_session(self.handlers.transaction)
            except Exception as exc:
                raise_lost(exc)
        return self._async

    async def _handle_async(self, row: Pending, spec: HandlerSpec) -> bool:
        tx = await self._async_session()
        self.backend_pid = tx.backend_pid
        claimed: Claimed | None = None
        calling = False
        error: BaseException
        try:
            async with tx.transaction() as (execute, handle):
                claimed = await self.store.claim_async(execute, row.id)
                if claimed is None:
                    return True
                self.current_claim = claimed
                message = self.outcomes.message(claimed)
                calling = True
                with tracing.handling(message):
                    await spec.func(message, handle)
                tx.check()
                calling = False
                await self.store.done_async(execute, row.id)
                failpoint("handler.before_commit")
        except self.disconnects as exc:
            # Lost while the callback ran: its failure if the database answers (as in
            # Batches._lost_in_callback); lost anywhere else, or by a retired worker: an outage.
            if not calling or self.retired:
                raise_lost(exc)
            error = exc
        except BaseException as exc:  # any callback error (see Batches._transaction)
            error = exc
        else:
            self.outcomes.count_handled([(row.topic, time.monotonic() - self.started)])
            return True
        if tx.broken:
            self._async = None
            with suppress(Exception):
                await tx.close()
            tx = await self._async_session()  # raises ConnectionLost while the database is down
        failure = self.outcomes.failure(row, spec, claimed, error)
        try:
            async with tx.transaction() as (execute, _handle):
                await self.store.fail_async(execute, failure)
        except self.disconnects as exc:
            raise_lost(exc)
        return False
