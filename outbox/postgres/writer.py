"""Writes messages with the caller's connection, inside the caller's transaction.

Nothing here commits, opens a connection or runs DDL. Supported handles: psycopg 3 `Connection`
and `AsyncConnection`; SQLAlchemy `Connection`, `Session`, `AsyncConnection` and `AsyncSession`
on the psycopg driver (`postgresql+psycopg://`), checked and run by `sessions` (the dispatch
the Handler's transactions share).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

import psycopg

from outbox.core.envelope import OutgoingMessage
from outbox.core.errors import DuplicateMessageId, SchemaNotMigrated
from outbox.core.headers import to_json
from outbox.core.text import first_line
from outbox.postgres import sessions
from outbox.postgres.queries import channel, queries


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


def _taken(message_ids: Sequence[Any]) -> str:
    shown = ", ".join(str(m) for m in message_ids[:5])
    more = f" and {len(message_ids) - 5} more" if len(message_ids) > 5 else ""
    return f"{shown}{more}"


def duplicate(message_ids: Sequence[Any]) -> DuplicateMessageId:
    """The error for a batch of which `message_ids` are still waiting in the queue."""
    ids = _taken(message_ids) or "(sent by a transaction that has committed since)"
    return DuplicateMessageId(
        f"message id {ids} is already in producer_queue (sent and not yet relayed): "
        "each message needs an id of its own; nothing of this send was written"
    )


class Writer:
    """Writes composed messages to one schema's `producer_queue` in the caller's transaction.

    A message id that a row still waiting in the queue has (committed, or sent by another
    transaction that then commits) raises `DuplicateMessageId` and writes nothing, without
    aborting the caller's transaction: the statement skips the id rather than violating the
    unique index, and a batch's other rows are deleted again.
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema
        sql = queries(schema)
        self._send, self._send_one = sql["send"], sql["send_one"]
        self._undo = sql["send_undo"]
        self._channel = channel(schema, "producer_queue")

    def write(self, tx: object, messages: Sequence[OutgoingMessage]) -> None:
        """Insert `messages` (one statement) with the caller's sync handle `tx`."""
        if not messages:
            return
        run = sessions.executor(tx)
        try:
            if len(messages) == 1:
                row = run(self._send_one, send_one_params(messages[0], self._channel)).fetchone()
            else:
                row = run(self._send, send_params(messages, self._channel)).fetchone()
        except Exception as exc:
            missing = self._not_migrated(exc)
            if missing is None:
                raise
            raise missing from exc
        if row[0] != len(messages):
            ours = self._ours(row)
            if ours:
                run(self._undo, {"message_ids": ours})
            raise duplicate([m.message_id for m in messages if m.message_id not in ours])

    async def write_async(self, tx: object, messages: Sequence[OutgoingMessage]) -> None:
        """`write` with the caller's async handle."""
        if not messages:
            return
        run = await sessions.async_executor(tx)
        try:
            if len(messages) == 1:
                result = await run(self._send_one, send_one_params(messages[0], self._channel))
            else:
                result = await run(self._send, send_params(messages, self._channel))
        except Exception as exc:
            missing = self._not_migrated(exc)
            if missing is None:
                raise
            raise missing from exc
        row = await _maybe_await(result.fetchone())
        if row[0] != len(messages):
            ours = self._ours(row)
            if ours:
                await run(self._undo, {"message_ids": ours})
            raise duplicate([m.message_id for m in messages if m.message_id not in ours])

    @staticmethod
    def _ours(row: Any) -> list[Any]:
        """The ids a batch `send` inserted when it could not insert them all (`send_one`
        inserts one or none: nothing to undo)."""
        return list(row[1] or []) if len(row) > 2 else []

    def _not_migrated(self, exc: Exception) -> SchemaNotMigrated | None:
        """The error to raise instead of `exc` when the statement failed because the queue's
        table or one of its columns is missing (psycopg's own, or wrapped by SQLAlchemy)."""
        cause = getattr(exc, "orig", None) or exc
        if not isinstance(cause, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
            return None
        return SchemaNotMigrated(
            f"{self.schema}.producer_queue is missing or from an older outbox in this database "
            f"({first_line(cause)}): run `outbox migrate --schema {self.schema}`, or check "
            "Broker(schema=...); the transaction is aborted"
        )


async def _maybe_await(value: Any) -> Any:
    """A psycopg async cursor's fetch is awaited; a SQLAlchemy async result's is not."""
    return await value if inspect.isawaitable(value) else value
