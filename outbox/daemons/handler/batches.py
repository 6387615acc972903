"""Runs of sync callbacks in batch transactions, and how a failure splits a batch.

Contract: the rows of a batch are claimed, handled and marked processed in ONE transaction, so
their callbacks' writes and their processed marks commit together. Callbacks run without
savepoints (each would cost two more round trips). When one raises, the whole transaction rolls
back; the rows before it are handled again in a new batch, the failure is recorded on its own,
and the rows after it follow. A crash before the commit leaves every row of the batch to be
handled again, with none of the batch's writes kept.

A callback that misbehaves fails its own message like one that raises: a BaseException, a
transaction it closed, ended (COMMIT, ROLLBACK) or left aborted (checked after each callback
unless pipelined), or its connection lost while it ran (`_lost_in_callback`).
"""

from __future__ import annotations

import time
from contextlib import suppress
from typing import Any

from outbox import tracing
from outbox.core.handlers import Handlers, HandlerSpec
from outbox.core.inbox_rows import Claimed, FailedAttempt, Pending
from outbox.daemons.failpoints import failpoint
from outbox.daemons.handler.config import HandlerConfig
from outbox.daemons.handler.failures import ConnectionLost, Failure, RollBack, raise_lost
from outbox.daemons.handler.outcomes import Outcomes
from outbox.ports import HandlerSession, InboxDatabase


class Batches:
    """The sync side of a worker (its base): a session and the batch transactions on it, and
    what the dispatcher reads to enforce the lease."""

    def __init__(
        self, config: HandlerConfig, handlers: Handlers, inbox: InboxDatabase, outcomes: Outcomes
    ) -> None:
        self.config = config
        self.handlers = handlers
        self.inbox = inbox
        #: The inbox store's statements in a transaction of the worker's sessions.
        self.store = inbox.work
        #: What the sessions raise for a database error, and for a lost connection.
        self.errors = inbox.errors
        self.disconnects = inbox.disconnects
        self.outcomes = outcomes
        #: The row being handled, when it started, and the backend running its transaction;
        #: read by the dispatcher to enforce the lease.
        self.current: Pending | None = None
        self.started = 0.0
        self.backend_pid: int | None = None
        #: Set by the dispatcher when this worker overran its lease and was replaced.
        self.retired = False
        self._sync: HandlerSession | None = None

    def session(self) -> HandlerSession:
        """The sync session, opened when first needed (again after it broke)."""
        if self._sync is not None and self._sync.broken:  # closed by a callback, say
            self._reset()
        if self._sync is None:
            try:
                self._sync = self.inbox.open_session(self.handlers.transaction)
            except Exception as exc:
                raise_lost(exc)
        return self._sync

    def close_session(self, *, quietly: bool = False) -> None:
        """Close the sync session (after a lost connection `quietly`: it may fail to close)."""
        sync, self._sync = self._sync, None
        if sync is not None:
            if quietly:
                with suppress(Exception):
                    sync.close()
            else:
                sync.close()

    def _reset(self) -> None:
        """Drop the sessions after a lost connection (a worker drops its async one too)."""
        self.close_session(quietly=True)

    def blocked(self, row: Pending, failed_keys: set[bytes]) -> bool:
        """A row whose key already failed in this group stays behind it, in order."""
        return row.key is not None and row.key in failed_keys

    def note_failure(self, row: Pending, spec: HandlerSpec | None, failed_keys: set[bytes]) -> None:
        """Hold the later rows of a failed row's key (unless its handler is unordered)."""
        if row.key is not None and (spec is None or spec.ordered):
            failed_keys.add(row.key)

    def handle_batches(self, rows: list[Pending], failed_keys: set[bytes]) -> None:
        """Handle `rows` in as few transactions as their failures allow (see the module)."""
        pending = [row for row in rows if not self.blocked(row, failed_keys)]
        while pending and not self.retired:
            failed_at = self._try_batch(pending)
            if failed_at is None:
                return
            index, row, spec, claimed, exc, size = failed_at
            # pending[:index] succeeded but were rolled back with the failure: run them again.
            if index:
                self.handle_batches(pending[:index], failed_keys)
            if size > 1:
                # A batch callback failed for several messages: handle each alone, which
                # records the failure against the message that causes it.
                for single in pending[index : index + size]:
                    if not self.retired and not self.blocked(single, failed_keys):
                        self.handle_batches([single], failed_keys)
                pending = [r for r in pending[index + size :] if not self.blocked(r, failed_keys)]
                continue
            self._record_failure(row, spec, claimed, exc)
            self.note_failure(row, spec, failed_keys)
            pending = [r for r in pending[index + 1 :] if not self.blocked(r, failed_keys)]

    def _try_batch(self, rows: list[Pending], *, pipelined: bool | None = None) -> Failure | None:
        """Run one batch transaction; on a callback failure return where and why, rolled back.

        Pipelined (`Handlers(pipeline=True)`), a failed statement may surface after later
        callbacks ran, so any failure rolls the batch back and runs it again unpipelined, which
        names the failing message exactly.
        """
        if pipelined is None:
            pipelined = self.handlers.pipeline and len(rows) > 1
        tx = self.session()
        self.backend_pid = tx.backend_pid
        handled: list[tuple[str, float]] = []  # (topic, seconds) of each callback
        failure: Failure | None = None
        try:
            with tx.transaction(pipelined=pipelined) as (execute, handle):
                claimed = self.store.claim_many(execute, [row.id for row in rows])
                done: list[int] = []
                dead: list[FailedAttempt] = []
                index = 0
                while index < len(rows) and not self.retired:
                    row = rows[index]
                    if row.id not in claimed:
                        index += 1
                        continue  # handled meanwhile, or held by another process
                    spec = self.handlers.get(row.topic)
                    if spec is None:
                        dead.append(self.outcomes.no_handler(row))
                        index += 1
                        continue
                    if spec.batch:
                        end = index + 1
                        while end < len(rows) and rows[end].topic == row.topic:
                            end += 1
                        positions = [i for i in range(index, end) if rows[i].id in claimed]
                        failure = self._call_batch(
                            rows, positions, spec, claimed, handle, tx, pipelined
                        )
                        if failure is not None:
                            if isinstance(failure.error, self.disconnects):
                                raise failure.error  # the connection is gone: see below
                            raise RollBack from failure.error
                        seconds = (time.monotonic() - self.started) / len(positions)
                        done.extend(rows[i].id for i in positions)
                        handled.extend((rows[i].topic, seconds) for i in positions)
                        index = end
                        continue
                    self.started = time.monotonic()
                    self.current = row
                    try:
                        message = self.outcomes.message(claimed[row.id])
                        with tracing.handling(message):
                            spec.func(message, handle)
                            tx.flush(handle)
                        if not pipelined:
                            tx.check()
                    except self.disconnects as exc:
                        # Lost while the callback ran (or its own error of that class, such as
                        # a statement timeout): the callback's failure if the database answers.
                        failure = Failure(index, row, spec, claimed[row.id], exc)
                        raise
                    except BaseException as exc:
                        # Any callback error, SystemExit and KeyboardInterrupt too: callbacks
                        # run in worker threads, where neither comes from the process's signals.
                        failure = Failure(index, row, spec, claimed[row.id], exc)
                        raise RollBack from exc
                    finally:
                        self.current = None
                    done.append(row.id)
                    handled.append((row.topic, time.monotonic() - self.started))
                    index += 1
                if done:
                    self.store.done_many(execute, done)
                for failed in dead:
                    self.store.fail(execute, failed)
                failpoint("handler.before_commit")
        except RollBack:
            if pipelined:
                return self._try_batch(rows, pipelined=False)
            return failure
        except self.errors as exc:
            if failure is not None:
                return self._lost_in_callback(failure)
            if pipelined and not tx.broken:
                return self._try_batch(rows, pipelined=False)  # a statement failed, late
            raise_lost(exc)
        except self.disconnects as exc:
            if failure is not None:
                return self._lost_in_callback(failure)
            raise_lost(exc)
        self.outcomes.count_handled(handled)
        return None

    def _call_batch(
        self,
        rows: list[Pending],
        positions: list[int],
        spec: HandlerSpec,
        claimed: dict[int, Claimed],
        handle: Any,
        tx: HandlerSession,
        pipelined: bool,
    ) -> Failure | None:
        """Call a batch handler once with the claimed messages at `positions` of `rows`; on
        failure, where and why. A message that cannot be decoded is named exactly; a callback
        that raises for several messages names their whole span (size > 1), to be handled one
        by one. Any exception counts, BaseException too, and a lost connection (`_try_batch`
        tells it apart)."""
        self.started = time.monotonic()
        messages = []
        for i in positions:
            try:
                messages.append(self.outcomes.message(claimed[rows[i].id]))
            except Exception as exc:
                return Failure(i, rows[i], spec, claimed[rows[i].id], exc)
        self.current = rows[positions[0]]
        try:
            spec.func(messages, handle)
            tx.flush(handle)
            if not pipelined:
                tx.check()
        except BaseException as exc:  # a lost connection too: _try_batch tells them apart
            first, last = positions[0], positions[-1]
            return Failure(first, rows[first], spec, claimed[rows[first].id], exc, last - first + 1)
        finally:
            self.current = None
        return None

    def _lost_in_callback(self, failure: Failure) -> Failure:
        """The connection was lost (or closed) while a callback ran, or the transaction could
        not end after a callback failed: a failed attempt of that callback's message if the
        database answers a new connection, else a database outage (`ConnectionLost`, nothing
        counted). A retired worker's loss is its lease's, counted by the dispatcher."""
        self._reset()
        if self.retired:
            raise ConnectionLost(failure.error)
        self.session()  # raises ConnectionLost while the database is down
        return failure

    def _record_failure(
        self, row: Pending, spec: HandlerSpec | None, claimed: Claimed | None, exc: BaseException
    ) -> None:
        tx = self.session()
        failed = self.outcomes.failure(row, spec, claimed, exc)
        try:
            with tx.transaction() as (execute, _handle):
                self.store.fail(execute, failed)
        except self.disconnects as exc:
            raise_lost(exc)
