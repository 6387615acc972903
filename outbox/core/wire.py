"""The wire form of a message, shared by every transport: the header list a record carries.

Outgoing, a record carries outbox's own headers (message id, creation time, content type) and
then the user's; incoming, a record's headers give back the message id, creation time, content
type and user headers, and a record without outbox's headers (a foreign producer's) gets a
deterministic id. Kafka, the PostgreSQL log and the in-memory transport all use this codec, so
the inbox row of a message is the same whichever transport carried it. Pure code, no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from outbox.core.envelope import InboxRow, StoredMessage
from outbox.core.errors import InvalidHeaders
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID, from_json
from outbox.core.lanes import lane_for
from outbox.core.serializers import BYTES
from outbox.core.text import first_line, is_storable, storable

#: Namespace of the deterministic ids given to messages without an outbox message id.
FOREIGN_NAMESPACE = uuid.UUID("6f1c0d2a-6a53-4c57-9a51-0d7b5b0b7e11")

#: Headers as a record carries them out: (name, value) in order; str values go out as UTF-8.
WireHeaders = list[tuple[str, str | bytes | None]]
#: Headers as a record arrives with them (bytes from a broker; str or None are accepted).
RawHeaders = Iterable[tuple[str, bytes | str | None]]
#: Reads a record's own timestamp (ms since the epoch, or None) from what the transport passed
#: as the record's `timestamp`; called only when outbox's creation time header is missing.
TimestampOf = Callable[[Any], "int | None"]


def given_millis(timestamp: Any) -> int | None:
    """The default `TimestampOf`: the timestamp passed is already milliseconds (or None)."""
    return timestamp  # type: ignore[no-any-return]


# -- outgoing --------------------------------------------------------------------------------


def own_headers(message_id: str, created_at: str, content_type: str) -> WireHeaders:
    """outbox's own headers of a record, in the order every transport sends them."""
    return [(MESSAGE_ID, message_id), (CREATED_AT, created_at), (CONTENT_TYPE, content_type)]


def message_headers(message: StoredMessage) -> WireHeaders:
    """The headers of a message: outbox's own, then the user's."""
    headers = own_headers(
        str(message.message_id), message.created_at.isoformat(), message.content_type
    )
    headers.extend(message.headers.items())
    return headers


def stored_headers(text: str) -> dict[str, str | bytes]:
    """User headers from their stored JSON text (`to_json`); `InvalidHeaders` if not that form."""
    try:
        stored = json.loads(text)
        if not isinstance(stored, dict):
            raise TypeError(f"a JSON object was expected, got {type(stored).__name__}")
        headers = from_json(stored)
    except Exception as exc:  # KeyError, TypeError, binascii.Error, ...
        raise InvalidHeaders(
            f"stored headers are not outbox's form ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    return headers


def as_bytes(headers: Iterable[tuple[str, str | bytes | None]]) -> list[tuple[str, bytes]]:
    """Headers with every value as bytes (str as UTF-8, None as empty), as a broker keeps them."""
    return [
        (name, value.encode() if isinstance(value, str) else (value or b""))
        for name, value in headers
    ]


# -- incoming --------------------------------------------------------------------------------


def decode_record(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    headers: RawHeaders,
    timestamp_ms: int | None,
) -> InboxRow:
    """The inbox row of a record in outbox's wire format, from whichever transport.

    outbox's own headers give the message id, creation time and content type; a record
    without them (a foreign producer's) gets a deterministic id (`foreign_id`), the record's
    timestamp and the raw-bytes content type. A record that cannot be stored as an ordinary
    row (a header name PostgreSQL cannot hold, a content type that is not storable text) is
    marked: `quarantine` says why, `raw_headers` has its headers as received, and its user
    headers are empty and its content type raw bytes.
    """
    return decode(topic, partition, offset, key, value, headers, timestamp_ms, given_millis)


def decode(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    headers: RawHeaders,
    timestamp: Any,
    timestamp_of: TimestampOf,
) -> InboxRow:
    """`decode_record`, positional (it runs once per record); `timestamp_of(timestamp)` is
    called only if the creation time header or the outbox message id is missing."""
    if not isinstance(headers, list | tuple):  # UnreadableHeaders is a tuple: kept
        headers = list(headers)
    raw_id, raw_created, content_type, user_headers, problem = split_headers(headers)
    message_id = parse_id(header_text(raw_id)) or foreign_id(
        topic, partition, offset, timestamp_of(timestamp), key, value, headers
    )
    created = creation_time(raw_created, timestamp, timestamp_of)
    if problem is not None:
        # Positional, in field order: a quarter cheaper than keywords for this frozen dataclass.
        return InboxRow(
            message_id, topic, key, value, {}, BYTES, lane_for(key, message_id), created,
            partition, offset, problem, raw_json(headers),
        )  # fmt: skip
    return InboxRow(
        message_id,
        topic,
        key,
        value,
        user_headers or {},
        BYTES if content_type is None else content_type,
        lane_for(key, message_id),
        created,
        partition,
        offset,
    )


def creation_time(raw: Any, timestamp: Any, timestamp_of: TimestampOf) -> datetime:
    """The outbox created-time header; else the record's own timestamp; else now."""
    created = parse_time(header_text(raw))
    if created is not None:
        return created
    millis = timestamp_of(timestamp)
    if millis is not None:
        try:
            return datetime.fromtimestamp(millis / 1000, UTC)
        except (ValueError, OverflowError, OSError):
            pass  # a timestamp no datetime can hold: a foreign producer's garbage
    return datetime.now(UTC)


def foreign_id(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: RawHeaders,
) -> uuid.UUID:
    """The deterministic id of a record that carries no outbox message id.

    uuid5 (FOREIGN_NAMESPACE) of "topic/partition/offset/timestamp/digest": the timestamp in
    milliseconds (-1 when the record has none) and the hex SHA-256 of the record's key, value
    and headers, each framed as `<byte length>:<bytes>` (`-` for a missing key or value),
    headers in order, name then value (docs/decisions/0008-foreign-record-identity.md).
    A redelivery of the same record gets the same id; another record at the same offset
    (the topic re-created, offsets restarted) gets another. `outbox.spark.audit.foreign_id`
    computes the same.
    """
    parts = [_framed(key), _framed(value)]
    for name, header_value in headers:
        parts.append(_framed(raw_bytes(name)))
        parts.append(_framed(None if header_value is None else raw_bytes(header_value)))
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    millis = -1 if timestamp_ms is None else timestamp_ms
    return uuid.uuid5(FOREIGN_NAMESPACE, f"{topic}/{partition}/{offset}/{millis}/{digest}")


def _framed(data: bytes | None) -> bytes:
    return b"-" if data is None else b"%d:%b" % (len(data), data)


def raw_bytes(value: str | bytes) -> bytes:
    """A header name or value as bytes: str as UTF-8 (lone surrogates kept, as surrogatepass)."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)


def raw_json(headers: RawHeaders) -> str:
    """Every header as the JSON of `[[base64 name, base64 value or null], ...]`."""
    return json.dumps(
        [
            [
                base64.b64encode(raw_bytes(name)).decode(),
                None if value is None else base64.b64encode(raw_bytes(value)).decode(),
            ]
            for name, value in headers
        ]
    )


def from_raw_json(raw: str | list[Any]) -> tuple[tuple[bytes, bytes | None], ...]:
    """The reverse of `raw_json`: every header as (name, value or None) bytes, from the JSON
    text or the list it is (psycopg reads a jsonb column as one). ValueError (a
    `binascii.Error`, a JSON error) or TypeError for what `raw_json` did not write."""
    pairs: list[Any] = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(pairs, list):
        raise TypeError(f"headers as stored are a list of pairs, not {type(pairs).__name__}")
    return tuple(
        (base64.b64decode(name), None if value is None else base64.b64decode(value))
        for name, value in pairs
    )


def text_or_bytes(value: bytes | str | None) -> str | bytes:
    """A header value as it is stored: text when it is storable UTF-8 text, else bytes."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value if is_storable(value) else value.encode("utf-8", "surrogatepass")
    if b"\x00" in value:  # PostgreSQL's jsonb cannot hold NUL as text
        return bytes(value)
    try:
        return value.decode()
    except UnicodeDecodeError:
        return bytes(value)


class UnreadableHeaders(tuple):  # type: ignore[type-arg]
    """No headers: the client could not give a record's headers (confluent-kafka's
    `Message.headers()` raised, as it may for a name that is not UTF-8); `reason` says why. The
    record is quarantined with what can be read of it."""

    reason: str

    @classmethod
    def because(cls, exc: BaseException) -> UnreadableHeaders:
        """Empty headers remembering why they could not be read."""
        headers = cls()
        headers.reason = storable(
            f"the record's headers cannot be read: {type(exc).__name__}: {first_line(exc)}"
        )
        return headers


#: What `split_headers` holds for one of outbox's own headers before the record names it.
_ABSENT: Any = object()


def split_headers(
    headers: RawHeaders,
) -> tuple[Any, Any, str | None, dict[str, str | bytes] | None, str | None]:
    """(message id, created time, content type as text, user headers or None, why the record
    must be quarantined or None) of a record's headers.

    Only a name that is not ASCII or holds NUL is looked at more closely: the usual record pays
    for two quick tests per header. A name that comes twice (Kafka allows it) quarantines the
    record: a row keeps one value per name, and which one should hold cannot be chosen (two
    content types, two ids), so the record is kept dead with every header as received.
    """
    raw_id = raw_created = raw_type = _ABSENT
    user_headers: dict[str, str | bytes] | None = None
    problem: str | None = None
    repeated: Any = None
    for name, header_value in headers:
        if name == MESSAGE_ID:
            if raw_id is not _ABSENT:
                repeated = name
            raw_id = header_value
        elif name == CREATED_AT:
            if raw_created is not _ABSENT:
                repeated = name
            raw_created = header_value
        elif name == CONTENT_TYPE:
            if raw_type is not _ABSENT:
                repeated = name
            raw_type = header_value
        else:
            if (type(name) is not str or not name.isascii() or "\x00" in name) and not (
                isinstance(name, str) and is_storable(name)
            ):
                problem = f"header name {storable(repr(name))} cannot be stored (NUL or not UTF-8)"
            if user_headers is None:
                user_headers = {}
            elif name in user_headers:
                repeated = name
            user_headers[name] = text_or_bytes(header_value)
    if raw_id is _ABSENT:
        raw_id = None
    if raw_created is _ABSENT:
        raw_created = None
    if raw_type is _ABSENT:
        raw_type = None
    if repeated is not None and problem is None:
        problem = (
            f"header {storable(repr(repeated))} comes more than once: a row keeps one value "
            "per name, and which one holds cannot be chosen"
        )
    content_type = header_text(raw_type)
    if raw_type is not None and (
        content_type is None
        or "\x00" in content_type
        or (type(raw_type) is not bytes and not is_storable(content_type))
    ):  # bytes decoded as UTF-8 need only the NUL test
        problem = problem or (
            f"content-type header {storable(repr(raw_type))} is not storable text "
            f"(NUL or not UTF-8)"
        )
    if type(headers) is UnreadableHeaders:
        problem = headers.reason
    return raw_id, raw_created, content_type, user_headers, problem


def parse_id(text: str | None) -> uuid.UUID | None:
    """The message id header as a UUID; None when absent or not a UUID."""
    if text is None:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def header_text(value: bytes | str | None) -> str | None:
    """A header value as text; None when absent or not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time (UTC when it has no offset), in UTC; None when absent, unreadable, or
    outside years 1-9999 in UTC (PostgreSQL would store such a time, but psycopg could not
    read it back: the Handler would stop on the row)."""
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return None
