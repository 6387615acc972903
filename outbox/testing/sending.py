"""What a block of code sent: `with sent(conn) as messages: ...`, for tests of the sending side.

`broker.send` writes a row of `producer_queue` in the caller's transaction; the relay deletes it
once delivered. With no relay running, the rows a block wrote are what it sent. `sent` notes
where `producer_queue`'s ids stand when the block starts and reads the rows written after, when
it ends, through the handle it was given: the caller's own transaction, still open, whose
uncommitted rows it sees (it never commits or rolls back a transaction it did not begin), or a
database URL, which sees what was committed.

Each row comes back as a `SentMessage`: topic, key, headers, message id, and the payload
decoded as the receiving handler would decode it, through the `Topic` when one is given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, TypeVar, overload
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from outbox.core.codecs import decoder, type_name
from outbox.core.errors import OutboxError, UnsupportedTransaction
from outbox.core.headers import CAUSATION_ID, CORRELATION_ID, from_json
from outbox.core.serializers import JsonSerializer, Serializer, decode_payload
from outbox.core.text import first_line
from outbox.core.topics import Topic, validate_topic
from outbox.postgres.queries import queries, quote_ident, validate_schema

P = TypeVar("P")

#: The handles `sent` reads through, besides a URL.
SUPPORTED = (
    "a postgresql:// URL, a psycopg Connection or AsyncConnection, or a SQLAlchemy "
    "Connection, Session, AsyncConnection or AsyncSession"
)


class PayloadUndecodable(OutboxError, AssertionError):
    """A message sent whose payload the receiver could not decode (as its content type, or as
    the Topic's payload type): raised when its `payload` is read."""


@dataclass(frozen=True, slots=True)
class SentMessage(Generic[P]):
    """One message a block wrote to `producer_queue`, as the relay will send it.

    `payload` is decoded as the receiving handler decodes it: through the `Topic`'s payload
    type when `sent` was given the Topic, else by its content type (the JSON value; str for
    text; bytes for `application/octet-stream`). When it cannot be, reading `payload` raises
    `PayloadUndecodable` saying why; `raw_payload` is always there.
    """

    message_id: UUID
    topic: str
    key: bytes | None
    raw_payload: bytes
    content_type: str
    headers: dict[str, str | bytes]
    #: When the message is due, for one sent with `deliver_at` or `delay` (the database's
    #: time); None for one due at once.
    deliver_at: datetime | None = None
    _payload: Any = field(default=None, repr=False)
    _error: str | None = field(default=None, repr=False)

    @property
    def payload(self) -> P:
        """The payload, decoded; `PayloadUndecodable` if the receiver could not decode it."""
        if self._error is not None:
            raise PayloadUndecodable(self._error)
        value: P = self._payload
        return value

    @property
    def correlation_id(self) -> UUID:
        """The conversation the message belongs to (its own id unless it inherited one)."""
        return _header_uuid(self.headers, CORRELATION_ID) or self.message_id

    @property
    def causation_id(self) -> UUID | None:
        """The id of the message whose handler sent this one, if a handler did."""
        return _header_uuid(self.headers, CAUSATION_ID)

    def __repr__(self) -> str:
        shown = f"<undecodable: {self._error}>" if self._error is not None else self._payload
        return (
            f"SentMessage(topic={self.topic!r}, key={self.key!r}, payload={shown!r}, "
            f"message_id={self.message_id})"
        )


def _header_uuid(headers: Mapping[str, str | bytes], name: str) -> UUID | None:
    value = headers.get(name)
    if not isinstance(value, str):
        return None
    try:
        return UUID(value)
    except ValueError:
        return None


class Sent(Generic[P]):
    """The messages a `with` (or `async with`) block sent, read when the block ends.

    A sequence of `SentMessage` in the order they were written; `payloads` lists their
    payloads and `one()` is the only one. Read it after the block: inside it, it raises.
    """

    def __init__(
        self,
        handle: object,
        topics: list[Topic[Any] | str] | None,
        schema: str,
        serializer: Serializer,
    ) -> None:
        self._handle = handle
        self._topics = topics
        self._schema = validate_schema(schema)
        self._sql = queries(self._schema)
        self._table = f"{quote_ident(self._schema)}.producer_queue"
        self._scheduled = f"{quote_ident(self._schema)}.producer_scheduled"
        self._serializer = serializer
        #: Where the sequences of producer_queue and producer_scheduled stood.
        self._mark: tuple[int, int] | None = None
        self._messages: list[SentMessage[P]] | None = None

    # -- the block ----------------------------------------------------------------------------

    def __enter__(self) -> Sent[P]:
        if _is_async(self._handle):
            raise UnsupportedTransaction(
                f"{type(self._handle).__name__} is asynchronous: use `async with sent(...)`"
            )
        self._mark = _marks(_read(self._handle, self._sql["sent_mark"], self._params()))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:  # a block that raised is not read: its transaction may be aborted
            self._keep(_read(self._handle, self._sql["sent_rows"], self._params()))

    async def __aenter__(self) -> Sent[P]:
        rows = await _read_async(self._handle, self._sql["sent_mark"], self._params())
        self._mark = _marks(rows)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self._keep(await _read_async(self._handle, self._sql["sent_rows"], self._params()))

    def _params(self) -> dict[str, Any]:
        after, after_scheduled = self._mark or (None, None)
        return {
            "table": self._table,
            "scheduled": self._scheduled,
            "after": after,
            "after_scheduled": after_scheduled,
        }

    def _keep(self, rows: list[tuple[Any, ...]]) -> None:
        wanted = _by_name(self._topics)
        messages: list[SentMessage[P]] = []
        for message_id, topic, key, payload, headers, content_type, deliver_at in rows:
            if wanted is not None and topic not in wanted:
                continue
            declared = wanted.get(topic) if wanted is not None else None
            raw = bytes(payload)
            stored = headers if isinstance(headers, dict) else json.loads(headers)
            value, error = _decode(message_id, topic, raw, content_type, declared, self._serializer)
            messages.append(
                SentMessage(
                    message_id=message_id,
                    topic=topic,
                    key=bytes(key) if key is not None else None,
                    raw_payload=raw,
                    content_type=content_type,
                    headers=from_json(stored),
                    deliver_at=deliver_at,
                    _payload=value,
                    _error=error,
                )
            )
        self._messages = messages

    # -- what was sent -------------------------------------------------------------------------

    @property
    def messages(self) -> list[SentMessage[P]]:
        """The messages sent, in the order they were written."""
        if self._messages is None:
            raise OutboxError(
                "what the block sent is read when it ends: look at it after the `with` block"
                if self._mark is not None
                else "use sent(...) as a context manager: `with sent(conn) as messages: ...`"
            )
        return list(self._messages)

    @property
    def payloads(self) -> list[P]:
        """The payloads sent, in order (`PayloadUndecodable` for one that cannot be read)."""
        return [m.payload for m in self.messages]

    def one(self) -> SentMessage[P]:
        """The one message sent; an AssertionError listing them when there are more or none."""
        messages = self.messages
        if len(messages) != 1:
            listed = "".join(f"\n  {m!r}" for m in messages)
            raise AssertionError(f"expected one message sent, got {len(messages)}{listed}")
        return messages[0]

    def __iter__(self) -> Iterator[SentMessage[P]]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: int) -> SentMessage[P]:
        return self.messages[index]

    def __repr__(self) -> str:
        if self._messages is None:
            return "<Sent: the block has not ended>"
        return f"<Sent: {len(self._messages)} messages>"


@overload
def sent(
    handle: object,
    topic: Topic[P],
    *,
    schema: str = "outbox",
    serializer: Serializer | None = None,
) -> Sent[P]: ...


@overload
def sent(
    handle: object,
    topic: str | Iterable[str | Topic[Any]] | None = None,
    *,
    schema: str = "outbox",
    serializer: Serializer | None = None,
) -> Sent[Any]: ...


def sent(
    handle: object,
    topic: Topic[Any] | str | Iterable[str | Topic[Any]] | None = None,
    *,
    schema: str = "outbox",
    serializer: Serializer | None = None,
) -> Sent[Any]:
    """What the `with` (or `async with`) block sent: the rows it wrote to `producer_queue`.

    `handle` is what the block sends with, read through as it is: a psycopg `Connection` or
    `AsyncConnection`, a SQLAlchemy `Connection`, `Session`, `AsyncConnection` or
    `AsyncSession`. In an open transaction the rows are read in it, uncommitted ones too, and
    the transaction stays open and uncommitted; outside one, a transaction `sent` begins to read
    is rolled back (a `Session` with none reads through a new connection of its engine, leaving
    the session's objects as they are). A `postgresql://` URL reads what was committed.

    `topic` keeps the messages of one topic (a `Topic`: payloads decoded as its payload type, as
    the receiving handler gets them; a name: decoded by content type) or of several (a list);
    None keeps all. `schema` is the outbox schema (`Broker(schema=...)`), `serializer` the
    Broker's if it is not JSON.

    Run no relay meanwhile (it deletes the rows it delivers). The rows read are the ones written
    after the block began: on a database other sessions write to as well, their committed rows
    show too; give each test a database of its own (`outbox_database_url`). A block that raises
    is not read.
    """
    return Sent(handle, _wanted(topic), schema, serializer or JsonSerializer())


def _wanted(
    topic: Topic[Any] | str | Iterable[str | Topic[Any]] | None,
) -> list[Topic[Any] | str] | None:
    """The topics to keep (None: all), checked."""
    if topic is None:
        return None
    given: list[Any] = [topic] if isinstance(topic, Topic | str) else list(topic)
    for item in given:
        if isinstance(item, str):
            validate_topic(item)
        elif not isinstance(item, Topic):
            raise TypeError(
                f"sent(topic=...) takes a Topic, a topic name or a list of them, got "
                f"{type(item).__name__}"
            )
    return given


def _by_name(wanted: list[Topic[Any] | str] | None) -> dict[str, Topic[Any] | None] | None:
    """The topics to keep by the name each answers to when the block ends (a Topic a test
    runs under another name, by that name), with their declarations."""
    if wanted is None:
        return None
    found: dict[str, Topic[Any] | None] = {}
    for item in wanted:
        if isinstance(item, Topic):
            found[item.name] = item
        else:
            found.setdefault(item, None)
    return found


def _decode(
    message_id: UUID,
    topic: str,
    raw: bytes,
    content_type: str,
    declared: Topic[Any] | None,
    serializer: Serializer,
) -> tuple[Any, str | None]:
    """(the payload, None), or (None, why it cannot be read) as the receiver would find it."""
    where = f"message {message_id} on {topic!r} ({content_type}, {len(raw)} bytes: {_head(raw)})"
    try:
        value = decode_payload(raw, content_type, serializer)
    except Exception as exc:  # SerializationError; UnicodeDecodeError for text
        return None, f"{where}: cannot decode the payload as {content_type!r}: {first_line(exc)}"
    payload_type = declared.payload if declared is not None else None
    if payload_type is None:
        return value, None
    try:
        return decoder(payload_type)(value), None
    except Exception as exc:  # PayloadInvalid; a model's own validator; an unresolvable type
        return None, f"{where}: not a valid {type_name(payload_type)}: {exc}"


def _head(raw: bytes, limit: int = 60) -> str:
    shown = repr(raw[:limit])
    return shown + ("…" if len(raw) > limit else "")


def _marks(rows: list[tuple[Any, ...]]) -> tuple[int, int]:
    return int(rows[0][0]), int(rows[0][1])


# -- reading through the caller's handle ------------------------------------------------------


def _defined_in(handle: object, package: str) -> bool:
    return any(cls.__module__.startswith(package) for cls in type(handle).__mro__)


def _is_async(handle: object) -> bool:
    return isinstance(handle, psycopg.AsyncConnection) or _defined_in(
        handle, "sqlalchemy.ext.asyncio"
    )


def _libpq_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and scheme.startswith(("postgresql+", "postgres+")):
        return f"postgresql://{rest}"
    return url


def _unsupported(handle: object) -> UnsupportedTransaction:
    name = f"{type(handle).__module__}.{type(handle).__name__}"
    return UnsupportedTransaction(f"sent() cannot read through a {name}; give it {SUPPORTED}")


def _read(handle: object, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a read-only statement through the caller's sync `handle` (see `sent`)."""
    if isinstance(handle, str):
        with psycopg.connect(_libpq_url(handle), autocommit=True) as conn:
            return conn.cursor(row_factory=tuple_row).execute(statement, params).fetchall()
    if isinstance(handle, psycopg.Connection):
        begins = not handle.autocommit and (
            handle.info.transaction_status == TransactionStatus.IDLE
        )
        rows = handle.cursor(row_factory=tuple_row).execute(statement, params).fetchall()
        if begins:
            handle.rollback()  # the transaction this read began; nothing of the caller's
        return rows
    if not _defined_in(handle, "sqlalchemy."):
        raise _unsupported(handle)
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.orm import Session

    if isinstance(handle, Session):
        if handle.in_transaction():
            return _read(handle.connection(), statement, params)
        bind = handle.get_bind()
        if isinstance(bind, Engine):
            with bind.connect() as conn:
                return _read(conn, statement, params)
        return _read(bind, statement, params)
    if isinstance(handle, Connection):
        begins = not handle.in_transaction()
        rows = [tuple(row) for row in handle.exec_driver_sql(statement, params).fetchall()]
        if begins:
            handle.rollback()
        return rows
    raise _unsupported(handle)


async def _read_async(
    handle: object, statement: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """`_read` for `async with`: an async handle, or a sync one (read as `_read` does)."""
    if isinstance(handle, str):
        conn = await psycopg.AsyncConnection.connect(_libpq_url(handle), autocommit=True)
        async with conn:
            cursor = await conn.cursor(row_factory=tuple_row).execute(statement, params)
            return await cursor.fetchall()
    if isinstance(handle, psycopg.AsyncConnection):
        begins = not handle.autocommit and (
            handle.info.transaction_status == TransactionStatus.IDLE
        )
        cursor = await handle.cursor(row_factory=tuple_row).execute(statement, params)
        rows = await cursor.fetchall()
        if begins:
            await handle.rollback()
        return rows
    if not _defined_in(handle, "sqlalchemy.ext.asyncio"):
        return _read(handle, statement, params)
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    if isinstance(handle, AsyncSession):
        if handle.in_transaction():
            return await _read_async(await handle.connection(), statement, params)
        bind = handle.bind
        if isinstance(bind, AsyncEngine):
            async with bind.connect() as own:
                return await _read_async(own, statement, params)
        if isinstance(bind, AsyncConnection):
            return await _read_async(bind, statement, params)
        raise UnsupportedTransaction(
            "sent() reads an AsyncSession outside a transaction through its bind, and this one "
            "has none (bound per table or mapper): begin the session's transaction first"
        )
    if isinstance(handle, AsyncConnection):
        begins = not handle.in_transaction()
        result = await handle.exec_driver_sql(statement, params)
        rows = [tuple(row) for row in result.fetchall()]
        if begins:
            await handle.rollback()
        return rows
    raise _unsupported(handle)


__all__ = ["PayloadUndecodable", "Sent", "SentMessage", "sent"]
