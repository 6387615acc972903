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

import inspect
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, NamedTuple

from outbox import tracing
from outbox.core.handlers import Handlers, HandlerSpec
from outbox.core.inbox_rows import Claimed, FailedAttempt, Pending
from outbox.daemons.failpoints import failpoint
from outbox.daemons.handler.config import HandlerConfig
from outbox.daemons.handler.failures import ConnectionLost, Failure, RollBack, raise_lost
from outbox.daemons.handler.outcomes import Outcomes
from outbox.ports import HandlerSession, InboxDatabase


def refuse_awaitable(returned: object, spec: HandlerSpec) -> None:
    """A sync-registered callback that returned an awaitable (an `async def __call__`, a
    wrapper without `functools.wraps`) did nothing yet: fail its attempt rather than mark its
    message done with its effect never run."""
    if inspect.isawaitable(returned):
        if inspect.iscoroutine(returned):
            returned.close()  # no "never awaited" warning: the error below says it
        raise TypeError(
            f"the handler of {spec.topic!r} returned an awaitable ({type(returned).__name__}) "
            "but was registered as a sync function: declare it with `async def` (an object "
            "with an async __call__, or a wrapper that hides the coroutine function, is not "
            "seen as async)"
        )


class Claim(NamedTuple):
    """What a batch transaction's first statement took: by id (`Batches._try_batch`) or the
    next rows of some lanes (`Batches._try_claim`)."""

    #: Rows taken, also those dropped as already handled.
    taken: int
    #: The rows claimed, in id order (from `claim_batch`: those past `cut` go to the caller).
    rows: list[Pending]
    #: How many of `rows` this transaction handles.
    cut: int
    #: What each claimed row is made of, by row id: a row missing was handled meanwhile, or
    #: is held by another process.
    claimed: dict[int, Claimed]


class _Again(Exception):
    """Pipelined, a failure may surface after later callbacks ran: the transaction rolled back,
    to run again unpipelined. `claim` is what its first statement took, None if that statement
    is what failed."""

    def __init__(self, claim: Claim | None) -> None:
        super().__init__("again, unpipelined")
        self.claim = claim


class Batches:
    """The sync side of a worker (its base): a session and the batch transactions on it, and
    what the runner reads to enforce the lease."""

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
        #: read by the runner to enforce the lease.
        self.current: Pending | None = None
        #: The claimed message of `current` (its id names it in the lease's log line), set
        #: once the row is claimed; compare its `id` with `current`'s before trusting it.
        self.current_claim: Claimed | None = None
        self.started = 0.0
        self.backend_pid: int | None = None
        #: Set by the runner when this worker overran its lease and was replaced.
        self.retired = False
        self._sync: HandlerSession | None = None
        self._unordered = handlers.unordered_topics

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

    def claim_batch(
        self, lanes: list[int], limit: int, failed_keys: set[bytes]
    ) -> tuple[int, list[Pending]]:
        """Fetch and claim up to `limit` rows of `lanes` in one statement at the start of a
        batch transaction, and handle them in it: those before the first row that needs a
        transaction of its own (an async callback's, or one that overran its lease), which are
        left, with the rows after them, to the caller. A failure splits the batch as in
        `handle_batches`. The rows taken, and those left."""
        claim, failure = self._try_claim(lanes, limit, pipelined=self.handlers.pipeline)
        if failure is not None:
            pending = self._after_failure(claim.rows[: claim.cut], failure, failed_keys)
            self.handle_batches(pending, failed_keys)
        return claim.taken, claim.rows[claim.cut :]

    def _cut(self, rows: list[Pending]) -> int:
        """Where the rows a claim handles in its own transaction end: at the first row that
        needs a transaction of its own."""
        alone = self.outcomes.alone
        for index, row in enumerate(rows):
            spec = self.handlers.get(row.topic)
            if (spec is not None and spec.is_async) or row.id in alone:
                return index
        return len(rows)

    def handle_batches(self, rows: list[Pending], failed_keys: set[bytes]) -> None:
        """Handle `rows` in as few transactions as their failures allow (see the module)."""
        pending = [row for row in rows if not self.blocked(row, failed_keys)]
        while pending and not self.retired:
            failed_at = self._try_batch(pending)
            if failed_at is None:
                return
            pending = self._after_failure(pending, failed_at, failed_keys)

    def _after_failure(
        self, pending: list[Pending], failed_at: Failure, failed_keys: set[bytes]
    ) -> list[Pending]:
        """After `failed_at` rolled back a batch of `pending`: handle the rows before it again,
        record the failure, and return the rows after it that are still to handle."""
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
            return [r for r in pending[index + size :] if not self.blocked(r, failed_keys)]
        self._record_failure(row, spec, claimed, exc)
        self.note_failure(row, spec, failed_keys)
        return [r for r in pending[index + 1 :] if not self.blocked(r, failed_keys)]

    def _try_batch(self, rows: list[Pending], *, pipelined: bool | None = None) -> Failure | None:
        """The by-id path: claim `rows` and handle them in one transaction; on a callback
        failure return where and why, rolled back.

        Pipelined (`Handlers(pipeline=True)`), a failed statement may surface after later
        callbacks ran, so any failure rolls the batch back and runs it again unpipelined, which
        names the failing message exactly.
        """
        if pipelined is None:
            pipelined = self.handlers.pipeline and len(rows) > 1

        def by_id(execute: Any) -> Claim:
            claimed = self.store.claim_many(execute, [row.id for row in rows])
            return Claim(len(rows), rows, len(rows), claimed)

        try:
            return self._transaction(by_id, pipelined)[1]
        except _Again:
            return self._try_batch(rows, pipelined=False)

    def _try_claim(
        self, lanes: list[int], limit: int, *, pipelined: bool
    ) -> tuple[Claim, Failure | None]:
        """The claim path: one transaction whose first statement fetches and claims up to
        `limit` rows of `lanes`, and handles those before the cut (`_cut`); what it took, and
        where and why a callback failed, rolled back. Pipelined, a failure runs the claimed
        rows again unpipelined, by id (or, if the claim is what failed, the claim)."""

        def next_rows(execute: Any) -> Claim:
            batch = self.store.claim_next(execute, lanes, limit, self._unordered)
            return Claim(batch.taken, batch.rows, self._cut(batch.rows), batch.claimed)

        try:
            return self._transaction(next_rows, pipelined)
        except _Again as again:
            if again.claim is None:
                return self._try_claim(lanes, limit, pipelined=False)
            claim = again.claim
            return claim, self._try_batch(claim.rows[: claim.cut], pipelined=False)

    def _transaction(
        self, claim: Callable[[Any], Claim], pipelined: bool
    ) -> tuple[Claim, Failure | None]:
        """One batch transaction: `claim` (its first statement, given the transaction's
        `execute`) takes the rows, the callbacks of the first `cut` of them run, and their rows
        are marked done, all committed together. What `claim` took, and on a callback failure
        where and why, rolled back; `_Again` when pipelined and it must run again unpipelined.
        """
        tx = self.session()
        self.backend_pid = tx.backend_pid
        handled: list[tuple[str, float]] = []  # (topic, seconds) of each callback
        failure: Failure | None = None
        taken: Claim | None = None
        try:
            with tx.transaction(pipelined=pipelined) as (execute, handle):
                taken = claim(execute)
                rows, claimed = taken.rows[: taken.cut], taken.claimed
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
                    self.current_claim = claimed[row.id]
                    self.current = row
                    try:
                        message = self.outcomes.message(claimed[row.id])
                        with tracing.handling(message):
                            returned = spec.func(message, handle)
                            if returned is not None:
                                refuse_awaitable(returned, spec)
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
                raise _Again(taken) from None
            assert taken is not None  # a callback failed: the claim answered
            return taken, failure
        except self.errors as exc:
            if failure is not None:
                assert taken is not None
                return taken, self._lost_in_callback(failure)
            if pipelined and not tx.broken:
                # A statement failed, late: again unpipelined (the claim too if it was that).
                raise _Again(taken) from exc
            raise_lost(exc)
        except self.disconnects as exc:
            if failure is not None:
                assert taken is not None
                return taken, self._lost_in_callback(failure)
            raise_lost(exc)
        self.outcomes.count_handled(handled)
        return taken, None

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
        claims = [claimed[rows[i].id] for i in positions]
        messages, undecodable = self.outcomes.messages(claims, spec)
        if undecodable is not None:
            at = len(messages)
            i = positions[at]
            return Failure(i, rows[i], spec, claims[at], undecodable)
        self.current_claim = claimed[rows[positions[0]].id]
        self.current = rows[positions[0]]
        try:
            returned = spec.func(messages, handle)
            if returned is not None:
                refuse_awaitable(returned, spec)
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
        counted). A retired worker's loss is its lease's, counted by the runner."""
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
