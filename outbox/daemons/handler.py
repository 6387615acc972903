"""The Handler runner: `consumer_queue` -> the service's decorated callbacks.

Contract: each message is handled in one database transaction that (1) locks its row, (2) runs
the callback with that transaction's connection or session, and (3) marks the row processed.
The callback's writes and "processed" commit together or not at all, and a processed row stays
(payload cleared) for the dedup window, so a message is never handled twice. A callback that
raises is rolled back, the error recorded, and the row retried with backoff until its handler's
`max_attempts`, then kept as dead. Messages of one key are handled in order: they share a lane,
a lane belongs to one worker of one process, and a key waits behind its failing message.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from outbox import tracing
from outbox.core.envelope import InboxMessage
from outbox.core.errors import ConfigurationError
from outbox.core.handlers import Handlers, HandlerSpec
from outbox.core.headers import from_json
from outbox.core.numbers import check_fields
from outbox.core.serializers import decode_payload
from outbox.core.text import first_line, storable
from outbox.daemons.failpoints import failpoint
from outbox.daemons.lanes import Connection, LaneRelay, new_relay_id
from outbox.observability.metrics import HandlerTallyBook
from outbox.observability.runtime import Observability, ObservabilityConfig, observed
from outbox.postgres.migrate import sqlalchemy_url
from outbox.postgres.queries import queries, validate_schema

log = logging.getLogger("outbox.handler")

Execute = Callable[[str, dict[str, Any]], Any]


@dataclass(frozen=True)
class HandlerConfig:
    """Settings of one Handler process; validated at construction."""

    database_url: str
    schema: str = "outbox"
    concurrency: int = 4
    batch_size: int = 200
    poll_interval: float = 1.0
    rebalance_interval: float = 2.0
    #: Processed rows are kept this long (seconds) to recognise a redelivered message.
    dedup_window: float = 24 * 3600.0
    retention_interval: float = 30.0
    retention_batch: int = 5000
    #: Messages handled in one database transaction (a failure rolls it back and splits it).
    transaction_size: int = 100
    #: Longest a callback may run (seconds). Past it the callback's transaction is terminated
    #: (so nothing it wrote can commit), the attempt counts as failed, and the row is retried.
    lease: float = 300.0
    connect_timeout: float = 10.0
    relay_id: str = field(default_factory=new_relay_id)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        check_fields(
            self,
            {
                "concurrency": "count",
                "batch_size": "count",
                "poll_interval": "seconds",
                "rebalance_interval": "seconds",
                "dedup_window": "seconds_or_zero",
                "retention_interval": "seconds_or_zero",
                "retention_batch": "count",
                "transaction_size": "count",
                "lease": "seconds",
                "connect_timeout": "seconds",
            },
        )


def load_handlers(path: str) -> Handlers:
    """Import `package.module:attribute` and check that it names a `Handlers` registry."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"handlers must be given as module:attribute (e.g. myservice.handlers:handlers), "
            f"got {path!r}"
        )
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for handlers: {exc}") from None
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Handlers):
        raise ConfigurationError(
            f"{path} is a {type(target).__name__}, not an outbox.Handlers registry"
        )
    if not len(target):
        raise ConfigurationError(f"{path} has no handlers registered")
    return target


class Pending(NamedTuple):
    """A row the dispatcher hands to a worker."""

    id: int
    lane: int
    key: bytes | None
    topic: str


# -- transactions in the four flavours: psycopg or SQLAlchemy, sync or async ---------------------


class _PsycopgSync:
    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, application_name="outbox-handler")
        self.backend_pid = self.conn.info.backend_pid

    @contextmanager
    def transaction(self, *, pipelined: bool = False) -> Iterator[tuple[Execute, Any]]:
        with self.conn.transaction():
            if pipelined:
                with self.conn.pipeline():
                    yield self.conn.execute, self.conn
            else:
                yield self.conn.execute, self.conn

    @property
    def broken(self) -> bool:
        """Whether the connection is lost (as opposed to a statement having failed)."""
        return self.conn.broken or self.conn.closed

    def check(self) -> None:
        """Raise `Misused` if the callback left the transaction unusable."""
        misuse = _misuse(self.conn)
        if misuse is not None:
            raise misuse

    def flush(self, handle: Any) -> None:
        """Nothing to flush: psycopg writes go to the server as they are executed."""

    def close(self) -> None:
        self.conn.close()


class _SqlAlchemySync:
    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        self.engine = create_engine(
            sqlalchemy_url(url),
            poolclass=NullPool,
            connect_args={"application_name": "outbox-handler"},
        )
        self.conn = self.engine.connect()
        self.backend_pid: int = self.conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]

    @contextmanager
    def transaction(self, *, pipelined: bool = False) -> Iterator[tuple[Execute, Any]]:
        from sqlalchemy.orm import Session

        with self.conn.begin():
            # rollback_only: the Session works inside our transaction and never commits it.
            session = Session(bind=self.conn, join_transaction_mode="rollback_only")
            try:
                yield self.conn.exec_driver_sql, session
            finally:
                session.close()

    @property
    def broken(self) -> bool:
        return bool(self.conn.closed or self.conn.invalidated)

    def check(self) -> None:
        """Raise `Misused` if the callback left the transaction unusable (the psycopg
        connection under the session)."""
        raw = self.conn.connection.driver_connection
        misuse = _misuse(raw) if isinstance(raw, psycopg.Connection) else None
        if misuse is not None:
            raise misuse

    def flush(self, handle: Any) -> None:
        """Send the callback's ORM changes now, so that a failure is its own."""
        handle.flush()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


class _PsycopgAsync:
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.backend_pid = conn.info.backend_pid

    @classmethod
    async def open(cls, url: str) -> _PsycopgAsync:
        return cls(
            await psycopg.AsyncConnection.connect(
                url, autocommit=True, application_name="outbox-handler"
            )
        )

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[tuple[Callable[..., Any], Any]]:
        async with self.conn.transaction():
            yield self.conn.execute, self.conn

    @property
    def broken(self) -> bool:
        return self.conn.broken or self.conn.closed

    def check(self) -> None:
        misuse = _misuse(self.conn)
        if misuse is not None:
            raise misuse

    async def close(self) -> None:
        await self.conn.close()


class _SqlAlchemyAsync:
    def __init__(self, engine: Any, conn: Any, backend_pid: int) -> None:
        self.engine = engine
        self.conn = conn
        self.backend_pid = backend_pid

    @classmethod
    async def open(cls, url: str) -> _SqlAlchemyAsync:
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        engine = create_async_engine(
            sqlalchemy_url(url),
            poolclass=NullPool,
            connect_args={"application_name": "outbox-handler"},
        )
        conn = await engine.connect()
        raw = await conn.get_raw_connection()
        return cls(engine, conn, raw.driver_connection.info.backend_pid)  # type: ignore[union-attr]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[tuple[Callable[..., Any], Any]]:
        from sqlalchemy.ext.asyncio import AsyncSession

        async with self.conn.begin():
            session = AsyncSession(bind=self.conn)
            try:
                yield self.conn.exec_driver_sql, session
                await session.flush()
            finally:
                await session.close()

    @property
    def broken(self) -> bool:
        return bool(self.conn.closed or self.conn.invalidated)

    def check(self) -> None:
        """The ORM session's own checks suffice here (its flush fails on a broken one)."""

    async def close(self) -> None:
        await self.conn.close()
        await self.engine.dispose()


# -- a worker: one thread, its own connections, the rows of its lanes in order -----------------


class _RollBack(Exception):
    """Raised inside a batch transaction to roll it back after a callback failed."""


class _ConnectionLost(Exception):
    """The worker's database connection broke; the row stays for a later attempt."""


class Misused(Exception):
    """A callback left the transaction it was given unusable: it closed the connection, ended
    the transaction itself (COMMIT or ROLLBACK) or went on after one of its statements failed.
    Its message fails like any callback error; the other messages of the transaction are
    handled again in a new one."""


def _misuse(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Misused | None:
    """What a callback did to its transaction's connection, if it left it unusable.

    A connection whose server side is lost (broken) is not a misuse: the statement that lost
    it raised already, or the next one will.
    """
    if conn.closed:
        if conn.broken:
            return None
        return Misused("the callback closed the database connection it was given")
    status = conn.info.transaction_status
    if status == psycopg.pq.TransactionStatus.IDLE:
        return Misused(
            "the callback ended the transaction it was given (COMMIT or ROLLBACK); the messages "
            "handled before it in that transaction are handled again"
        )
    if status == psycopg.pq.TransactionStatus.INERROR:
        return Misused(
            "a statement of the callback failed and the callback went on: the transaction is "
            "aborted (catch database errors inside a savepoint: conn.transaction())"
        )
    return None


class Undecodable(Exception):
    """A message's payload cannot be decoded as its content type: no attempt can succeed, so
    the message is dead at once (not retried); the decoder's error is the cause."""


#: Where a handler transaction failed: (index in its rows, row, handler, claimed row, error,
#: size). Size 1 names the failing row; more is a batch handler that raised for rows
#: [index, index + size), each to be handled alone.
_Failure = tuple[int, Pending, HandlerSpec | None, Any, BaseException, int]


class _Worker:
    def __init__(self, runner: HandlerRunner, index: int) -> None:
        self.runner = runner
        self.index = index
        self.jobs: queue.Queue[tuple[list[Pending], threading.Event] | None] = queue.Queue()
        self.error: BaseException | None = None
        #: The row being handled, when it started, and the backend running its transaction;
        #: read by the dispatcher to enforce the lease.
        self.current: Pending | None = None
        self.started = 0.0
        self.backend_pid: int | None = None
        #: Set by the dispatcher when this worker overran its lease and was replaced.
        self.retired = False
        self._sync: _PsycopgSync | _SqlAlchemySync | None = None
        self._async: _PsycopgAsync | _SqlAlchemyAsync | None = None
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
                rows, done = job
                try:
                    self._run(rows)
                except BaseException as exc:  # handed to the dispatcher, which re-raises it
                    if not self.retired:
                        self.error = exc
                finally:
                    self.current = None
                    done.set()
                if self.retired:
                    return
        finally:
            self._close()

    def _close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        if self._async is not None and self._loop is not None:
            self._loop.run_until_complete(self._async.close())
        if self._loop is not None:
            self._loop.close()

    def _run(self, rows: list[Pending]) -> None:
        """Handle a group in order: runs of sync handlers in batched transactions."""
        failed_keys: set[bytes] = set()
        chunk: list[Pending] = []
        limit = self.runner.config.transaction_size
        try:
            for row in rows:
                spec = self.runner.handlers.get(row.topic)
                if spec is not None and spec.is_async:
                    self._sync_batch(chunk, failed_keys)
                    chunk = []
                    self._async_row(row, spec, failed_keys)
                else:
                    chunk.append(row)
                    if len(chunk) >= limit:
                        self._sync_batch(chunk, failed_keys)
                        chunk = []
                if self.retired:
                    return
            self._sync_batch(chunk, failed_keys)
        except _ConnectionLost as exc:
            if not self.retired:
                log.warning("worker %d lost its database connection: %s", self.index, exc)
            self._reset()
        finally:
            self.current = None

    def _blocked(self, row: Pending, failed_keys: set[bytes]) -> bool:
        """A row whose key already failed in this group stays behind it, in order."""
        return row.key is not None and row.key in failed_keys

    def _note_failure(
        self, row: Pending, spec: HandlerSpec | None, failed_keys: set[bytes]
    ) -> None:
        if row.key is not None and (spec is None or spec.ordered):
            failed_keys.add(row.key)

    def _async_row(self, row: Pending, spec: HandlerSpec, failed_keys: set[bytes]) -> None:
        if self._blocked(row, failed_keys):
            return
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        self.started = time.monotonic()
        self.current = row
        if not self._loop.run_until_complete(self._handle_async(row, spec)):
            self._note_failure(row, spec, failed_keys)
        self.current = None

    def _reset(self) -> None:
        sync, self._sync = self._sync, None
        if sync is not None:
            with suppress(psycopg.Error):
                sync.close()
        if self._async is not None and self._loop is not None:
            with suppress(psycopg.Error):
                self._loop.run_until_complete(self._async.close())
        self._async = None

    def _tx_sync(self) -> _PsycopgSync | _SqlAlchemySync:
        if self._sync is not None and self._sync.broken:  # closed by a callback, say
            self._reset()
        if self._sync is None:
            url = self.runner.config.database_url
            try:
                if self.runner.handlers.transaction == "sqlalchemy":
                    self._sync = _SqlAlchemySync(url)
                else:
                    self._sync = _PsycopgSync(url)
            except Exception as exc:
                raise _ConnectionLost(str(exc)) from exc
        return self._sync

    def _sync_batch(self, rows: list[Pending], failed_keys: set[bytes]) -> None:
        """Handle rows in ONE transaction: their writes and processed marks commit together.

        Callbacks run without savepoints (each would cost two more round trips). When one
        raises, the whole transaction rolls back; the rows before it are handled again in a
        new batch, the failure is recorded on its own, and the rows after it follow. A crash
        before the commit leaves every row of the batch to be handled again, with none of the
        batch's writes kept.
        """
        pending = [row for row in rows if not self._blocked(row, failed_keys)]
        while pending and not self.retired:
            failed_at = self._try_batch(pending)
            if failed_at is None:
                return
            index, row, spec, claimed, exc, size = failed_at
            # pending[:index] succeeded but were rolled back with the failure: run them again.
            if index:
                self._sync_batch(pending[:index], failed_keys)
            if size > 1:
                # A batch callback failed for several messages: handle each alone, which
                # records the failure against the message that causes it.
                for single in pending[index : index + size]:
                    if not self.retired and not self._blocked(single, failed_keys):
                        self._sync_batch([single], failed_keys)
                pending = [r for r in pending[index + size :] if not self._blocked(r, failed_keys)]
                continue
            self._record_failure(row, spec, claimed, exc)
            self._note_failure(row, spec, failed_keys)
            pending = [r for r in pending[index + 1 :] if not self._blocked(r, failed_keys)]

    def _try_batch(self, rows: list[Pending], *, pipelined: bool | None = None) -> _Failure | None:
        """Run one batch transaction; on a callback failure return where and why, rolled back.

        Pipelined (`Handlers(pipeline=True)`), a failed statement may surface after later
        callbacks ran, so any failure rolls the batch back and runs it again unpipelined, which
        names the failing message exactly.
        """
        if pipelined is None:
            pipelined = self.runner.handlers.pipeline and len(rows) > 1
        sql = self.runner.sql
        tx = self._tx_sync()
        self.backend_pid = tx.backend_pid
        handled: list[tuple[str, float]] = []  # (topic, seconds) of each callback
        failure: _Failure | None = None
        try:
            with tx.transaction(pipelined=pipelined) as (execute, handle):
                claimed = {
                    r[0]: r
                    for r in execute(
                        sql["handler_claim_many"], {"ids": [row.id for row in rows]}
                    ).fetchall()
                }
                done: list[int] = []
                dead: list[dict[str, Any]] = []
                index = 0
                while index < len(rows) and not self.retired:
                    row = rows[index]
                    if row.id not in claimed:
                        index += 1
                        continue  # handled meanwhile, or held by another process
                    spec = self.runner.handlers.get(row.topic)
                    if spec is None:
                        dead.append(self.runner.no_handler(row))
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
                            if isinstance(failure[4], _lost_errors()):
                                raise failure[4]  # the connection is gone: see below
                            raise _RollBack from failure[4]
                        seconds = (time.monotonic() - self.started) / len(positions)
                        done.extend(rows[i].id for i in positions)
                        handled.extend((rows[i].topic, seconds) for i in positions)
                        index = end
                        continue
                    self.started = time.monotonic()
                    self.current = row
                    try:
                        message = self.runner.message(claimed[row.id])
                        with tracing.handling(message):
                            spec.func(message, handle)
                            tx.flush(handle)
                        if not pipelined:
                            tx.check()
                    except _lost_errors() as exc:
                        # Lost while the callback ran (or its own error of that class, such as
                        # a statement timeout): the callback's failure if the database answers.
                        failure = (index, row, spec, claimed[row.id], exc, 1)
                        raise
                    except BaseException as exc:
                        # Any callback error, SystemExit and KeyboardInterrupt too: callbacks
                        # run in worker threads, where neither comes from the process's signals.
                        failure = (index, row, spec, claimed[row.id], exc, 1)
                        raise _RollBack from exc
                    finally:
                        self.current = None
                    done.append(row.id)
                    handled.append((row.topic, time.monotonic() - self.started))
                    index += 1
                if done:
                    execute(sql["handler_done_many"], {"ids": done})
                for params in dead:
                    execute(sql["handler_fail"], params)
                failpoint("handler.before_commit")
        except _RollBack:
            if pipelined:
                return self._try_batch(rows, pipelined=False)
            return failure
        except psycopg.Error as exc:
            if failure is not None:
                return self._lost_in_callback(failure)
            if pipelined and isinstance(tx, _PsycopgSync) and not tx.broken:
                return self._try_batch(rows, pipelined=False)  # a statement failed, late
            if isinstance(exc, psycopg.OperationalError):
                raise _ConnectionLost(str(exc)) from exc
            raise
        except _sqlalchemy_disconnect() as exc:
            if failure is not None:
                return self._lost_in_callback(failure)
            raise _ConnectionLost(str(exc)) from exc
        self.runner.count_handled(handled)
        return None

    def _call_batch(
        self,
        rows: list[Pending],
        positions: list[int],
        spec: HandlerSpec,
        claimed: dict[int, Any],
        handle: Any,
        tx: _PsycopgSync | _SqlAlchemySync,
        pipelined: bool,
    ) -> _Failure | None:
        """Call a batch handler once with the claimed messages at `positions` of `rows`; on
        failure, where and why. A message that cannot be decoded is named exactly; a callback
        that raises for several messages names their whole span (size > 1), to be handled one
        by one."""
        self.started = time.monotonic()
        messages = []
        for i in positions:
            try:
                messages.append(self.runner.message(claimed[rows[i].id]))
            except Exception as exc:
                return (i, rows[i], spec, claimed[rows[i].id], exc, 1)
        self.current = rows[positions[0]]
        try:
            spec.func(messages, handle)
            tx.flush(handle)
            if not pipelined:
                tx.check()
        except BaseException as exc:  # a lost connection too: _try_batch tells them apart
            first, last = positions[0], positions[-1]
            size = last - first + 1
            return (first, rows[first], spec, claimed[rows[first].id], exc, size)
        finally:
            self.current = None
        return None

    def _lost_in_callback(self, failure: _Failure) -> _Failure:
        """The connection was lost (or closed) while a callback ran, or the transaction could
        not end after a callback failed: a failed attempt of that callback's message if the
        database answers a new connection, else a database outage (`_ConnectionLost`, nothing
        counted). A retired worker's loss is its lease's, counted by the dispatcher."""
        self._reset()
        if self.retired:
            raise _ConnectionLost(first_line(failure[4]))
        self._tx_sync()  # raises _ConnectionLost while the database is down
        return failure

    def _record_failure(
        self, row: Pending, spec: HandlerSpec | None, claimed: Any, exc: BaseException
    ) -> None:
        tx = self._tx_sync()
        params = self.runner.failure(row, spec, claimed, exc)
        try:
            with tx.transaction() as (execute, _handle):
                execute(self.runner.sql["handler_fail"], params)
        except (psycopg.OperationalError, _sqlalchemy_disconnect()) as lost:
            raise _ConnectionLost(str(lost)) from lost

    async def _tx_async(self) -> _PsycopgAsync | _SqlAlchemyAsync:
        if self._async is None:
            url = self.runner.config.database_url
            try:
                if self.runner.handlers.transaction == "sqlalchemy":
                    self._async = await _SqlAlchemyAsync.open(url)
                else:
                    self._async = await _PsycopgAsync.open(url)
            except Exception as exc:
                raise _ConnectionLost(str(exc)) from exc
        return self._async

    async def _handle_async(self, row: Pending, spec: HandlerSpec) -> bool:
        sql = self.runner.sql
        tx = await self._tx_async()
        self.backend_pid = tx.backend_pid
        claimed: Any = None
        calling = False
        error: BaseException
        try:
            async with tx.transaction() as (execute, handle):
                # psycopg's async cursor fetches asynchronously; SQLAlchemy's result is buffered.
                fetched = (await execute(sql["handler_claim"], {"id": row.id})).fetchone()
                claimed = await fetched if inspect.isawaitable(fetched) else fetched
                if claimed is None:
                    return True
                message = self.runner.message(claimed)
                calling = True
                with tracing.handling(message):
                    await spec.func(message, handle)
                tx.check()
                calling = False
                await execute(sql["handler_done"], {"id": row.id})
                failpoint("handler.before_commit")
        except _lost_errors() as exc:
            # Lost while the callback ran: its failure if the database answers (as in
            # _lost_in_callback); lost anywhere else, or by a retired worker: an outage.
            if not calling or self.retired:
                raise _ConnectionLost(str(exc)) from exc
            error = exc
        except BaseException as exc:  # any callback error (see _try_batch)
            error = exc
        else:
            self.runner.count_handled([(row.topic, time.monotonic() - self.started)])
            return True
        if tx.broken:
            self._async = None
            with suppress(Exception):
                await tx.close()
            tx = await self._tx_async()  # raises _ConnectionLost while the database is down
        failure = self.runner.failure(row, spec, claimed, error)
        try:
            async with tx.transaction() as (execute, _handle):
                await execute(sql["handler_fail"], failure)
        except _lost_errors() as lost:
            raise _ConnectionLost(str(lost)) from lost
        return False


def _sqlalchemy_disconnect() -> type[Exception]:
    from sqlalchemy.exc import OperationalError

    return OperationalError


def _lost_errors() -> tuple[type[Exception], ...]:
    """The errors of a lost database connection, psycopg's and SQLAlchemy's."""
    return (psycopg.OperationalError, _sqlalchemy_disconnect())


class HandlerRunner(LaneRelay[Pending]):
    """Runs the callbacks of a `Handlers` registry over `consumer_queue` until asked to stop."""

    table = "consumer_queue"
    kind = "handler"

    def __init__(self, config: HandlerConfig, handlers: Handlers) -> None:
        super().__init__(
            database_url=config.database_url,
            schema=config.schema,
            poll_interval=config.poll_interval,
            rebalance_interval=config.rebalance_interval,
            connect_timeout=config.connect_timeout,
            relay_id=config.relay_id,
        )
        self.config = config
        self.sql = queries(config.schema)
        self.handlers = handlers
        self._unordered = handlers.unordered_topics
        self._workers: list[_Worker] = []
        self._counts_lock = threading.Lock()
        self._next_retention = 0.0
        #: Counters for tests and logs.
        self.handled = 0
        self.failed = 0
        self.dead = 0
        self.lease_expired = 0
        self._tally = HandlerTallyBook()
        self.observability = Observability(
            "handler",
            config,
            heartbeat=self.heartbeat,
            relay_id=config.relay_id,
            lanes=lambda: len(self.lanes),
        )

    # -- lifecycle -----------------------------------------------------------------------------

    @observed
    def run(self) -> None:
        """Check, then handle messages until `stop()`; SIGTERM lets in-flight work finish."""
        self.check_database(self.config.observability.wait_for_database)
        self._workers = [_Worker(self, i) for i in range(self.config.concurrency)]
        try:
            self.serve_forever()
        finally:
            for worker in self._workers:
                worker.jobs.put(None)
            for worker in self._workers:
                worker.thread.join(30)
            log.info(
                "handler stopped: handled=%d failed=%d dead=%d",
                self.handled,
                self.failed,
                self.dead,
            )

    # -- the relay hooks -----------------------------------------------------------------------

    def fetch(self, conn: Connection, lanes: list[int]) -> list[Pending]:
        rows = conn.execute(
            self.sql["handler_fetch"],
            {"lanes": lanes, "limit": self.config.batch_size, "unordered": self._unordered},
        ).fetchall()
        return [Pending(*r) for r in rows]

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        row = conn.execute(self.sql["handler_next_retry"], {"lanes": lanes}).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def process(self, conn: Connection, rows: Sequence[Pending]) -> None:
        groups: list[list[Pending]] = [[] for _ in self._workers]
        for row in rows:
            groups[row.lane % len(self._workers)].append(row)
        waits = []
        for worker, group in zip(self._workers, groups, strict=True):
            if group:
                done = threading.Event()
                worker.jobs.put((group, done))
                waits.append((worker, done))
        while waits:
            self.heartbeat.beat()
            worker, done = waits[0]
            if done.wait(0.1) or worker.retired:
                waits.pop(0)
                if worker.error is not None:
                    error, worker.error = worker.error, None
                    raise error
                continue
            for other, _ in waits:
                self._enforce_lease(conn, other)
        self.observability.handler_batch(len(rows), self._tally.take())

    def _enforce_lease(self, conn: Connection, worker: _Worker) -> None:
        """Take a message back from a callback that overran its lease, and replace its worker."""
        row, pid = worker.current, worker.backend_pid
        if row is None or worker.retired:
            return
        elapsed = time.monotonic() - worker.started
        if elapsed <= self.config.lease:
            return
        worker.retired = True
        log.error(
            "message row %d topic %r: handler ran %.1fs, past its lease of %.1fs; terminating "
            "its transaction and retrying the message",
            row.id,
            row.topic,
            elapsed,
            self.config.lease,
            extra={"topic": row.topic},
        )
        if pid is not None:
            # Its writes roll back and its row lock is released: it can never commit now.
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with self._counts_lock:
            self.lease_expired += 1
        self._tally.lease_expired(row.topic)
        spec = self.handlers.get(row.topic)
        attempts = conn.execute(self.sql["handler_attempts"], {"id": row.id}).fetchone()
        claimed = [None] * 9 + [attempts[0] if attempts else 0]
        failure = self.failure(
            row, spec, claimed, TimeoutError(f"lease of {self.config.lease:g}s expired")
        )
        conn.execute(self.sql["handler_fail"], failure)
        self._workers[worker.index] = _Worker(self, worker.index)

    def housekeeping(self, conn: Connection, *, busy: bool) -> None:
        """Forget processed rows older than the dedup window, in bounded batches.

        Runs every `retention_interval`, also while a backlog keeps the handler busy (then one
        batch at a time, so that handling is not held up), so the table cannot grow without
        bound under sustained load.
        """
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + self.config.retention_interval
        total = 0
        while True:
            cursor = conn.execute(
                self.sql["handler_retention"],
                {"window": self.config.dedup_window, "limit": self.config.retention_batch},
            )
            total += cursor.rowcount
            more = cursor.rowcount >= self.config.retention_batch
            if busy and more:
                # One batch now and another after the next handled batch, until caught up:
                # forgetting keeps pace with handling without holding it up.
                self._next_retention = now
                break
            if not more or self.stopping:
                break
        if total:
            log.info("forgot %d processed messages older than the dedup window", total)

    # -- used by the workers -------------------------------------------------------------------

    def message(self, row: Sequence[Any]) -> InboxMessage:
        (
            _id,
            message_id,
            topic,
            key,
            payload,
            headers,
            content_type,
            created_at,
            received_at,
            attempts,
            partition,
            offset,
        ) = row
        payload = bytes(payload)
        try:
            decoded = decode_payload(payload, content_type, self.handlers.serializer)
        except Exception as exc:
            raise Undecodable(
                f"cannot decode the payload as {content_type!r}: {first_line(exc)}"
            ) from exc
        return InboxMessage(
            id=message_id,
            topic=topic,
            key=bytes(key) if key is not None else None,
            payload=decoded,
            raw_payload=payload,
            content_type=content_type,
            headers=from_json(headers),
            attempt=attempts + 1,
            created_at=created_at,
            received_at=received_at,
            partition=partition,
            offset=offset,
        )

    def no_handler(self, row: Pending) -> dict[str, Any]:
        with self._counts_lock:
            self.dead += 1
        self._tally.failed(row.topic, dead=True)
        log.error(
            "message row %d: no handler registered for topic %r",
            row.id,
            row.topic,
            extra={"topic": row.topic},
        )
        return {
            "id": row.id,
            "error": storable(
                f"no handler registered for topic {row.topic!r} "
                f"(registered: {', '.join(self.handlers.topics)})"
            ),
            "dead": True,
            "delay": 0.0,
        }

    def failure(
        self, row: Pending, spec: HandlerSpec | None, claimed: Any, exc: BaseException
    ) -> dict[str, Any]:
        """The `handler_fail` parameters of a failed attempt, counted and logged.

        Contract: the recorded error is always storable, whatever the exception's text (NUL,
        lone surrogates, a __str__ that raises), so recording a failure cannot fail. A payload
        that cannot be decoded (`Undecodable`) is dead at once.
        """
        attempt = (int(claimed[9]) if claimed is not None else 0) + 1
        max_attempts = spec.max_attempts if spec is not None else 1
        dead = attempt >= max_attempts or isinstance(exc, Undecodable)
        delay = 0.0 if dead or spec is None else spec.backoff.delay(attempt)
        with self._counts_lock:
            self.failed += 1
            if dead:
                self.dead += 1
        self._tally.failed(row.topic, dead=dead)
        try:
            text = storable("".join(traceback.format_exception(exc)))
        except Exception:  # traceback copes with a raising __str__; this is the last resort
            text = f"{type(exc).__name__}: {first_line(exc)}"
        message_id = str(claimed[1]) if claimed is not None and claimed[1] is not None else None
        log.warning(
            "message %s (row %d) topic %r attempt %d/%d failed%s: %s",
            message_id,
            row.id,
            row.topic,
            attempt,
            max_attempts,
            " (now dead)" if dead else f" (retry in {delay:.1f}s)",
            first_line(exc),
            extra={"message_id": message_id, "topic": row.topic},
        )
        return {"id": row.id, "error": text, "dead": dead, "delay": delay}

    def count_handled(self, callbacks: list[tuple[str, float]]) -> None:
        """Count committed callbacks, given as (topic, seconds)."""
        with self._counts_lock:
            self.handled += len(callbacks)
        self._tally.handled(callbacks)
