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

from outbox.core.envelope import OutgoingMessage
from outbox.core.headers import to_json
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


def execute(tx: object, sql: str, params: dict[str, Any]) -> None:
    """Run one statement in the caller's synchronous transaction handle."""
    sessions.executor(tx)(sql, params)


async def execute_async(tx: object, sql: str, params: dict[str, Any]) -> None:
    """Run one statement in the caller's asynchronous transaction handle."""
    run = await sessions.async_executor(tx)
    await run(sql, params)


class Writer:
    """Writes composed messages to one schema's `producer_queue` in the caller's transaction."""

    def __init__(self, schema: str) -> None:
        sql = queries(schema)
        self._send, self._send_one = sql["send"], sql["send_one"]
        self._channel = channel(schema, "producer_queue")

    def write(self, tx: object, messages: Sequence[OutgoingMessage]) -> None:
        """Insert `messages` (one statement) with the caller's sync handle `tx`."""
        if len(messages) == 1:
            execute(tx, self._send_one, send_one_params(messages[0], self._channel))
        elif messages:
            execute(tx, self._send, send_params(messages, self._channel))

    async def write_async(self, tx: object, messages: Sequence[OutgoingMessage]) -> None:
        """`write` with the caller's async handle."""
        if len(messages) == 1:
            await execute_async(tx, self._send_one, send_one_params(messages[0], self._channel))
        elif messages:
            await execute_async(tx, self._send, send_params(messages, self._channel))
