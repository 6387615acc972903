"""Transactions in four flavours (psycopg or SQLAlchemy, sync or async), chosen in one place.

Two users, one dispatch (`flavour`). `broker.send` runs its statement in the caller's
transaction handle, whose library and kind pick the flavour (`executor`, checked: never in
autocommit, never in a failed transaction). The Handler opens a connection of its own in the
flavour of `Handlers(transaction=...)` and runs each batch in one of its transactions, whose
handle (connection or session) it passes to the callbacks; after each callback, `check()`
raises `Misused` if the callback left that transaction unusable (closed, ended or aborted),
and `broken` tells a lost connection from a failed statement.

Contract: nothing here commits a caller's transaction, opens a connection for `send` or runs
DDL. The sync flavours import nothing of SQLAlchemy's asyncio (which needs greenlet): a plain
install sends with a SQLAlchemy `Session`.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from outbox.core.errors import Misused, NotInTransaction, UnsupportedTransaction
from outbox.postgres.migrate import sqlalchemy_url

Execute = Callable[[str, dict[str, Any]], Any]
AsyncExecute = Callable[[str, dict[str, Any]], Awaitable[Any]]
Library = Literal["psycopg", "sqlalchemy"]

SUPPORTED_SYNC = "psycopg.Connection, sqlalchemy Connection or Session"
SUPPORTED_ASYNC = "psycopg.AsyncConnection, sqlalchemy AsyncConnection or AsyncSession"


def _defined_in(handle: object, package: str) -> bool:
    """Whether `handle`'s class (or a base) comes from `package`, without importing it."""
    return any(cls.__module__.startswith(package) for cls in type(handle).__mro__)


def library_of(handle: object) -> Library | None:
    """The library of a caller's transaction handle, or None for anything else."""
    if isinstance(handle, psycopg.Connection | psycopg.AsyncConnection):
        return "psycopg"
    return "sqlalchemy" if _defined_in(handle, "sqlalchemy.") else None


def _check_psycopg(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise NotInTransaction(
            "the connection's transaction has already failed; roll it back before sending"
        )
    if conn.autocommit and status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "the connection is in autocommit mode outside a transaction, so the message would "
            "commit on its own: call "
            + (
                "send_async inside `async with conn.transaction():`"
                if isinstance(conn, psycopg.AsyncConnection)
                else "send inside `with conn.transaction():`"
            )
        )


def _check_driver(driver_connection: object, kind: str) -> None:
    if not isinstance(driver_connection, psycopg.Connection | psycopg.AsyncConnection):
        raise UnsupportedTransaction(
            f"SQLAlchemy {kind} uses the driver {type(driver_connection).__module__}; outbox "
            "supports the psycopg 3 driver: create the engine with a postgresql+psycopg:// URL"
        )
    if driver_connection.autocommit:
        raise NotInTransaction(
            f"the SQLAlchemy {kind} uses AUTOCOMMIT isolation, so the message would commit on "
            "its own: send inside a transaction"
        )


def _unsupported(handle: object, verb: str) -> UnsupportedTransaction:
    name = f"{type(handle).__module__}.{type(handle).__name__}"
    if verb == "send":
        return UnsupportedTransaction(
            f"cannot send with a {name}; pass a {SUPPORTED_SYNC} "
            f"(or use send_async with a {SUPPORTED_ASYNC})"
        )
    return UnsupportedTransaction(
        f"cannot send_async with a {name}; pass a {SUPPORTED_ASYNC} "
        f"(or use send with a {SUPPORTED_SYNC})"
    )


def misuse(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> Misused | None:
    """What a callback did to its transaction's connection, if it left it unusable.

    A connection whose server side is lost (broken) is not a misuse: the statement that lost
    it raised already, or the next one will.
    """
    if conn.closed:
        if conn.broken:
            return None
        return Misused("the callback closed the database connection it was given")
    status = conn.info.transaction_status
    if status == TransactionStatus.IDLE:
        return Misused(
            "the callback ended the transaction it was given (COMMIT or ROLLBACK); the messages "
            "handled before it in that transaction are handled again"
        )
    if status == TransactionStatus.INERROR:
        return Misused(
            "a statement of the callback failed and the callback went on: the transaction is "
            "aborted (catch database errors inside a savepoint: conn.transaction())"
        )
    return None


def disconnects() -> tuple[type[Exception], ...]:
    """What a lost connection raises, in either library (not a statement's failure)."""
    from sqlalchemy.exc import OperationalError

    return (psycopg.OperationalError, OperationalError)


# -- sync ------------------------------------------------------------------------------------


class PsycopgSession:
    """A psycopg connection of the Handler's own (autocommit between its transactions)."""

    def __init__(self, url: str, application_name: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, application_name=application_name)
        self.backend_pid = self.conn.info.backend_pid

    @staticmethod
    def executor(handle: object) -> Execute:
        """How to run a statement in the caller's transaction `handle`, once it is checked."""
        if isinstance(handle, psycopg.AsyncConnection):
            raise UnsupportedTransaction(
                "psycopg.AsyncConnection is asynchronous: use `await broker.send_async(...)`"
            )
        if not isinstance(handle, psycopg.Connection):
            raise _unsupported(handle, "send")
        _check_psycopg(handle)
        # Rows as tuples whatever the caller's connection makes of them (`row_factory`).
        return handle.cursor(row_factory=tuple_row).execute

    @contextmanager
    def transaction(self, *, pipelined: bool = False) -> Iterator[tuple[Execute, Any]]:
        """One transaction: its statement runner, and the handle a callback receives."""
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
        misused = misuse(self.conn)
        if misused is not None:
            raise misused

    def flush(self, handle: Any) -> None:
        """Nothing to flush: psycopg writes go to the server as they are executed."""

    def close(self) -> None:
        self.conn.close()


class SqlAlchemySession:
    """A SQLAlchemy connection of the Handler's own; each transaction hands out a `Session`."""

    def __init__(self, url: str, application_name: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        self.engine = create_engine(
            sqlalchemy_url(url),
            poolclass=NullPool,
            connect_args={"application_name": application_name},
        )
        self.conn = self.engine.connect()
        self.backend_pid: int = self.conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]

    @staticmethod
    def executor(handle: object) -> Execute:
        """How to run a statement in the caller's `Connection` or `Session`, once checked."""
        if _defined_in(handle, "sqlalchemy.ext.asyncio"):
            raise UnsupportedTransaction(
                f"{type(handle).__name__} is asynchronous: use `await broker.send_async(...)`"
            )
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if isinstance(handle, Session):
            handle = handle.connection()
        if not isinstance(handle, Connection):
            raise _unsupported(handle, "send")
        _check_driver(handle.connection.driver_connection, "connection")
        return handle.exec_driver_sql

    @contextmanager
    def transaction(self, *, pipelined: bool = False) -> Iterator[tuple[Execute, Any]]:
        """One transaction: its statement runner, and the `Session` a callback receives."""
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
        return self.conn.invalidated or self.conn.closed

    def check(self) -> None:
        """Raise `Misused` if the callback left the transaction unusable (the psycopg
        connection under the session)."""
        raw = self.conn.connection.driver_connection
        misused = misuse(raw) if isinstance(raw, psycopg.Connection) else None
        if misused is not None:
            raise misused

    def flush(self, handle: Any) -> None:
        """Send the callback's ORM changes now, so that a failure is its own."""
        handle.flush()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


# -- async -----------------------------------------------------------------------------------


class AsyncPsycopgSession:
    """A psycopg `AsyncConnection` of the Handler's own."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.backend_pid = conn.info.backend_pid

    @classmethod
    async def open(cls, url: str, application_name: str) -> AsyncPsycopgSession:
        return cls(
            await psycopg.AsyncConnection.connect(
                url, autocommit=True, application_name=application_name
            )
        )

    @staticmethod
    async def executor(handle: object) -> AsyncExecute:
        """How to run a statement in the caller's `AsyncConnection`, once it is checked."""
        if isinstance(handle, psycopg.Connection):
            raise UnsupportedTransaction(
                "psycopg.Connection is synchronous: use `broker.send(...)`"
            )
        if not isinstance(handle, psycopg.AsyncConnection):
            raise _unsupported(handle, "send_async")
        _check_psycopg(handle)
        return handle.cursor(row_factory=tuple_row).execute

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[tuple[AsyncExecute, Any]]:
        async with self.conn.transaction():
            yield self.conn.execute, self.conn

    @property
    def broken(self) -> bool:
        """Whether the connection is lost (as opposed to a statement having failed)."""
        return self.conn.broken or self.conn.closed

    def check(self) -> None:
        """Raise `Misused` if the callback left the transaction unusable."""
        misused = misuse(self.conn)
        if misused is not None:
            raise misused

    async def close(self) -> None:
        await self.conn.close()


class AsyncSqlAlchemySession:
    """A SQLAlchemy `AsyncConnection` of the Handler's own; transactions hand out an
    `AsyncSession`."""

    def __init__(self, engine: Any, conn: Any, backend_pid: int) -> None:
        self.engine = engine
        self.conn = conn
        self.backend_pid = backend_pid

    @classmethod
    async def open(cls, url: str, application_name: str) -> AsyncSqlAlchemySession:
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        engine = create_async_engine(
            sqlalchemy_url(url),
            poolclass=NullPool,
            connect_args={"application_name": application_name},
        )
        conn = await engine.connect()
        raw = await conn.get_raw_connection()
        return cls(engine, conn, raw.driver_connection.info.backend_pid)  # type: ignore[union-attr]

    @staticmethod
    async def executor(handle: object) -> AsyncExecute:
        """How to run a statement in the caller's `AsyncConnection` or `AsyncSession`."""
        if not _defined_in(handle, "sqlalchemy.ext.asyncio"):
            from sqlalchemy.engine import Connection
            from sqlalchemy.orm import Session

            if isinstance(handle, Connection | Session):
                raise UnsupportedTransaction(
                    f"{type(handle).__name__} is synchronous: use `broker.send(...)`"
                )
            raise _unsupported(handle, "send_async")
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(handle, AsyncSession):
            handle = await handle.connection()
        if not isinstance(handle, AsyncConnection):
            raise _unsupported(handle, "send_async")
        raw = await handle.get_raw_connection()
        _check_driver(raw.driver_connection, "AsyncConnection")
        return handle.exec_driver_sql

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[tuple[AsyncExecute, Any]]:
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


Session = PsycopgSession | SqlAlchemySession
AsyncSession = AsyncPsycopgSession | AsyncSqlAlchemySession

_FLAVOURS: dict[tuple[Library, bool], Any] = {
    ("psycopg", False): PsycopgSession,
    ("sqlalchemy", False): SqlAlchemySession,
    ("psycopg", True): AsyncPsycopgSession,
    ("sqlalchemy", True): AsyncSqlAlchemySession,
}


def flavour(library: Library, asynchronous: bool) -> Any:
    """The one dispatch: the session class of a library, sync or async."""
    return _FLAVOURS[library, asynchronous]


def executor(handle: object) -> Execute:
    """How `send` runs a statement in the caller's sync transaction `handle` (checked)."""
    if type(handle) is psycopg.Connection:  # the usual handle, without the dispatch
        run: Execute = PsycopgSession.executor(handle)
        return run
    library = library_of(handle)
    if library is None:
        raise _unsupported(handle, "send")
    run = flavour(library, False).executor(handle)
    return run


async def fetch_one(result: Any) -> Any:
    """The first row of what an `AsyncExecute` returned: psycopg's async cursor fetches
    asynchronously, SQLAlchemy's async result is buffered (its fetch is not awaited)."""
    fetched = result.fetchone()
    return await fetched if inspect.isawaitable(fetched) else fetched


async def async_executor(handle: object) -> AsyncExecute:
    """How `send_async` runs a statement in the caller's async transaction `handle`."""
    library = library_of(handle)
    if library is None:
        raise _unsupported(handle, "send_async")
    run: AsyncExecute = await flavour(library, True).executor(handle)
    return run


def open_session(library: Library, url: str, application_name: str) -> Session:
    """A sync session of the Handler's own."""
    session: Session = flavour(library, False)(url, application_name)
    return session


async def open_async_session(library: Library, url: str, application_name: str) -> AsyncSession:
    """An async session of the Handler's own."""
    session: AsyncSession = await flavour(library, True).open(url, application_name)
    return session
