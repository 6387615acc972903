"""Writes messages with the caller's connection, inside the caller's transaction.

Nothing here commits, opens a connection or runs DDL. Supported handles: psycopg 3 `Connection`
and `AsyncConnection`; SQLAlchemy `Connection`, `Session`, `AsyncConnection` and `AsyncSession`
on the psycopg driver (`postgresql+psycopg://`), checked and run by `sessions` (the dispatch
the Handler's transactions share).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from outbox.core.envelope import OutgoingMessage
from outbox.core.errors import DuplicateMessageId, SchemaNotMigrated
from outbox.core.headers import to_json
from outbox.core.schedule import Due
from outbox.core.text import first_line
from outbox.postgres import sessions
from outbox.postgres.lanes import lock_class
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


def send_later_params(
    messages: Sequence[OutgoingMessage], dues: Sequence[Due | None], channel: str
) -> dict[str, Any]:
    """Bind parameters of the `send_later` statement: `send`'s and each message's due time."""
    params = send_params(messages, channel)
    params["deliver_ats"] = [None if d is None else d.at for d in dues]
    params["delays"] = [None if d is None else d.delay for d in dues]
    return params


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


def send_one_generated_params(message: OutgoingMessage) -> dict[str, Any]:
    """Bind parameters of `send_one_generated`, or without `headers` (none to send) of
    `send_one_generated_no_headers`; the channel is in the statement."""
    params = {
        "message_id": message.message_id,
        "topic": message.topic,
        "key": message.key,
        "payload": message.payload,
        "content_type": message.content_type,
        "lane": message.lane,
    }
    if message.headers:
        params["headers"] = json.dumps(to_json(message.headers))
    return params


def channel_literal(channel: str) -> str:
    """`channel` as an SQL string literal (a channel name is made of a validated schema name,
    a queue's name and a hex digest: no quote, no `%` that psycopg would read as a
    placeholder; checked all the same)."""
    if "'" in channel or "%" in channel or "\\" in channel:
        raise ValueError(f"channel {channel!r} cannot be written as a literal here")
    return f"'{channel}'"


def duplicate(message_ids: Sequence[Any]) -> DuplicateMessageId:
    """The error for a send of which `message_ids` are still waiting in the queue."""
    shown = ", ".join(str(m) for m in message_ids[:5])
    more = f" and {len(message_ids) - 5} more" if len(message_ids) > 5 else ""
    return DuplicateMessageId(
        f"message id {shown}{more} is already in producer_queue or producer_scheduled (sent "
        "and not yet relayed): "
        "each message needs an id of its own; nothing of this send was written"
    )


class Writer:
    """Writes composed messages to one schema's `producer_queue` in the caller's transaction.

    A message id given by the caller that a row still waiting in the queue has (committed, or
    sent by another transaction that then commits) raises `DuplicateMessageId` and writes
    nothing, without aborting the caller's transaction: the statement skips the id rather than
    violating the unique index, and a batch's other rows are deleted again. A write whose ids
    `compose` generated all (`OutgoingMessage.id_generated`) skips that check, the costliest
    part of the statement beyond a plain INSERT: no row can have such an id.
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema
        sql = queries(schema)
        self._send, self._send_one = sql["send"], sql["send_one"]
        self._send_generated = sql["send_generated"]
        # The wake-up's channel is fixed per schema: written in, not bound on every send.
        literal = channel_literal(channel(schema, "producer_queue"))
        self._send_one_generated = sql["send_one_generated"].replace("{channel}", literal)
        self._send_one_generated_no_headers = sql["send_one_generated_no_headers"].replace(
            "{channel}", literal
        )
        self._undo = sql["send_undo"]
        self._send_later, self._later_undo = sql["send_later"], sql["send_later_undo"]
        self._cancel = sql["cancel"]
        self._lock_class = lock_class(schema, "producer_queue")
        self._channel = channel(schema, "producer_queue")

    def write(
        self,
        tx: object,
        messages: Sequence[OutgoingMessage],
        dues: Sequence[Due | None] | None = None,
    ) -> None:
        """Insert `messages` (one statement) with the caller's sync handle `tx`; each due at
        its `dues` entry (None: now)."""
        if not messages:
            return
        run = sessions.executor(tx)
        sql, params, undo = self._statement(messages, dues)
        try:
            result = run(sql, params)
            if undo is None:
                return  # inserted (or the statement failed): no row to read
            row = result.fetchone()
        except Exception as exc:
            missing = self._not_migrated(exc)
            if missing is None:
                raise
            raise missing from exc
        if row[0] == len(messages):
            return
        refused = self._refused(row, messages)
        if refused is not None:
            ours, error = refused
            if ours:
                run(undo, {"message_ids": ours})
            raise error

    async def write_async(
        self,
        tx: object,
        messages: Sequence[OutgoingMessage],
        dues: Sequence[Due | None] | None = None,
    ) -> None:
        """`write` with the caller's async handle."""
        if not messages:
            return
        run = await sessions.async_executor(tx)
        sql, params, undo = self._statement(messages, dues)
        try:
            result = await run(sql, params)
            if undo is None:
                return  # inserted (or the statement failed): no row to read
            row = await sessions.fetch_one(result)
        except Exception as exc:
            missing = self._not_migrated(exc)
            if missing is None:
                raise
            raise missing from exc
        refused = self._refused(row, messages)
        if refused is not None:
            ours, error = refused
            if ours:
                await run(undo, {"message_ids": ours})
            raise error

    def _cancel_params(self, message_id: Any) -> dict[str, Any]:
        return {"message_id": message_id, "lock_class": self._lock_class}

    def cancel(self, tx: object, message_id: Any) -> bool:
        """Delete the scheduled message `message_id` in `tx`'s transaction: whether it was
        there (then it never leaves)."""
        try:
            row = sessions.executor(tx)(self._cancel, self._cancel_params(message_id)).fetchone()
        except Exception as exc:
            missing = self._not_migrated(exc)
            if missing is None:
                raise
            raise missing from exc
        return bool(row[0])

    async def cancel_async(self, tx: object, message_id: Any) -> bool:
        """`cancel` with the caller's async handle."""
        run = await sessions.async_executor(tx)
        try:
            row = await sessions.fetch_one(await run(self._cancel, self._cancel_params(message_id)))
        except Exception as exc:
            missing = self._not_migrated(exc)
            if missing is None:
                raise
            raise missing from exc
        return bool(row[0])

    def _statement(
        self, messages: Sequence[OutgoingMessage], dues: Sequence[Due | None] | None = None
    ) -> tuple[str, dict[str, Any], str | None]:
        """The statement, its parameters and the statement undoing a refused batch (None: the
        statement returns no row, and refuses nothing without failing): `send_later` when a
        message has a due time; else `send_one` for one message (plain VALUES), `send` for a
        batch, and their `_generated` forms, without the conflict check, when `compose`
        generated every id."""
        if dues is not None and any(d is not None for d in dues):
            params = send_later_params(messages, dues, self._channel)
            return self._send_later, params, self._later_undo
        generated = all(m.id_generated for m in messages)
        if len(messages) == 1:
            message = messages[0]
            if generated:
                sql = (
                    self._send_one_generated
                    if message.headers
                    else self._send_one_generated_no_headers
                )
                return sql, send_one_generated_params(message), None
            return self._send_one, send_one_params(message, self._channel), self._undo
        sql = self._send_generated if generated else self._send
        return sql, send_params(messages, self._channel), self._undo

    @staticmethod
    def _refused(
        row: Any, messages: Sequence[OutgoingMessage]
    ) -> tuple[list[Any], DuplicateMessageId] | None:
        """None when every message was inserted; else the ids the statement did insert (a
        batch's, to delete again: `send_one` inserts one or none) and the error naming the
        others."""
        if row[0] == len(messages):
            return None
        ours = list(row[1] or []) if len(row) > 2 else []
        return ours, duplicate([m.message_id for m in messages if m.message_id not in ours])

    def _not_migrated(self, exc: Exception) -> SchemaNotMigrated | None:
        """`SchemaNotMigrated` for the statement's error `exc` when the queue's table or one of
        its columns is missing (psycopg's own error, or wrapped by SQLAlchemy); else None."""
        cause = getattr(exc, "orig", None) or exc
        if not isinstance(cause, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
            return None
        return SchemaNotMigrated(
            f"{self.schema}.producer_queue is missing or from an older outbox in this "
            f"database ({first_line(cause)}): run `outbox migrate --schema {self.schema}`, "
            "or check Broker(schema=...); the transaction is aborted"
        )
