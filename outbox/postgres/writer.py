"""Writes messages with the caller's connection, inside the caller's transaction.

Nothing here commits, opens a connection or runs DDL. Supported handles: psycopg 3 `Connection`
and `AsyncConnection`; SQLAlchemy `Connection`, `Session`, `AsyncConnection` and `AsyncSession`
on the psycopg driver (`postgresql+psycopg://`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from outbox.core.envelope import OutgoingMessage
from outbox.core.errors import NotInTransaction, UnsupportedTransaction
from outbox.core.headers import to_json

SUPPORTED_SYNC = "psycopg.Connection, sqlalchemy Connection or Session"
SUPPORTED_ASYNC = "psycopg.AsyncConnection, sqlalchemy AsyncConnection or AsyncSession"


def send_params(messages: Sequence[OutgoingMessage], channel: str) -> dict[str, Any]:
    """Bind parameters of the `send` statement for a batch of messages."""
    return {
        "message_ids": [m.message_id for m in messages],
        "topics": [m.topic for m in messages],
        "keys": [m.key for m in messages],
        "payloads": [m.payload for m in messages],
        "headers": [json.dumps(to_json(m.headers)) for m in messages],
        "content_types": [m.content_type for m in messages],
        "lanes": [m.lane for m in messages],
        "channel": channel,
    }


def send_one_params(message: OutgoingMessage, channel: str) -> dict[str, Any]:
    """Bind parameters of the `send_one` statement."""
    return {
        "message_id": message.message_id,
        "topic": message.topic,
        "key": message.key,
        "payload": message.payload,
        "headers": json.dumps(to_json(message.headers)) if message.headers else "{}",
        "content_type": message.content_type,
        "lane": message.lane,
        "channel": channel,
    }


def _check_psycopg(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise NotInTransaction(
            "the connection's transaction has already failed; roll it back before sending"
        )
    if conn.autocommit and status == TransactionStatus.IDLE:
        raise NotInTransaction(
            "the connection is in autocommit mode outside a transaction, so the message would "
            "commit on its own: call send inside `with conn.transaction():`"
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


def _is_sqlalchemy(tx: object) -> bool:
    """True for SQLAlchemy objects (and subclasses), without importing SQLAlchemy otherwise."""
    return any(cls.__module__.startswith("sqlalchemy.") for cls in type(tx).__mro__)


def execute(tx: object, sql: str, params: dict[str, Any]) -> None:
    """Run one statement with a synchronous transaction handle."""
    if isinstance(tx, psycopg.Connection):
        _check_psycopg(tx)
        tx.execute(sql, params)
        return
    if _is_sqlalchemy(tx):
        _execute_sqlalchemy(tx, sql, params)
        return
    if isinstance(tx, psycopg.AsyncConnection):
        raise UnsupportedTransaction(
            "psycopg.AsyncConnection is asynchronous: use `await broker.send_async(...)`"
        )
    raise UnsupportedTransaction(
        f"cannot send with a {type(tx).__module__}.{type(tx).__name__}; "
        f"pass a {SUPPORTED_SYNC} (or use send_async with a {SUPPORTED_ASYNC})"
    )


def _is_sqlalchemy_async(tx: object) -> bool:
    """True for SQLAlchemy's asyncio objects, without importing `sqlalchemy.ext.asyncio`
    (which needs greenlet, absent from a plain install: the sync path must not import it)."""
    return any(cls.__module__.startswith("sqlalchemy.ext.asyncio") for cls in type(tx).__mro__)


def _execute_sqlalchemy(tx: object, sql: str, params: dict[str, Any]) -> None:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(tx, Session):
        tx = tx.connection()
    if isinstance(tx, Connection):
        _check_driver(tx.connection.driver_connection, "connection")
        tx.exec_driver_sql(sql, params)
        return
    if _is_sqlalchemy_async(tx):
        raise UnsupportedTransaction(
            f"{type(tx).__name__} is asynchronous: use `await broker.send_async(...)`"
        )
    raise UnsupportedTransaction(
        f"cannot send with a {type(tx).__module__}.{type(tx).__name__}; "
        f"pass a {SUPPORTED_SYNC} (or use send_async with a {SUPPORTED_ASYNC})"
    )


async def execute_async(tx: object, sql: str, params: dict[str, Any]) -> None:
    """Run one statement with an asynchronous transaction handle."""
    if isinstance(tx, psycopg.AsyncConnection):
        _check_psycopg(tx)
        await tx.execute(sql, params)
        return
    if _is_sqlalchemy(tx):
        await _execute_sqlalchemy_async(tx, sql, params)
        return
    if isinstance(tx, psycopg.Connection):
        raise UnsupportedTransaction("psycopg.Connection is synchronous: use `broker.send(...)`")
    raise UnsupportedTransaction(
        f"cannot send_async with a {type(tx).__module__}.{type(tx).__name__}; "
        f"pass a {SUPPORTED_ASYNC} (or use send with a {SUPPORTED_SYNC})"
    )


async def _execute_sqlalchemy_async(tx: object, sql: str, params: dict[str, Any]) -> None:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    if isinstance(tx, AsyncSession):
        tx = await tx.connection()
    if isinstance(tx, AsyncConnection):
        raw = await tx.get_raw_connection()
        _check_driver(raw.driver_connection, "AsyncConnection")
        await tx.exec_driver_sql(sql, params)
        return
    if isinstance(tx, Connection | Session):
        raise UnsupportedTransaction(f"{type(tx).__name__} is synchronous: use `broker.send(...)`")
    raise UnsupportedTransaction(
        f"cannot send_async with a {type(tx).__module__}.{type(tx).__name__}; "
        f"pass a {SUPPORTED_ASYNC} (or use send with a {SUPPORTED_SYNC})"
    )
