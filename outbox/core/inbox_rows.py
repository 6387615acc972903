"""The rows of `consumer_queue` that the Handler and the inbox store pass each other, and the
message a claimed row becomes (`decode`): pure data."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from outbox.core.codecs import type_name
from outbox.core.envelope import InboxMessage
from outbox.core.errors import SerializationError
from outbox.core.headers import from_json
from outbox.core.serializers import BYTES, TEXT, JsonSerializer, Serializer, read_payload
from outbox.core.text import first_line


class Pending(NamedTuple):
    """A row due for handling: what a worker needs to order it, before or after claiming it."""

    id: int
    lane: int
    key: bytes | None
    topic: str


class Claimed(NamedTuple):
    """A pending row locked by a handler transaction, with what its message is made of."""

    id: int
    message_id: UUID
    topic: str
    key: bytes | None
    payload: bytes
    headers: Any
    content_type: str
    created_at: datetime
    received_at: datetime
    #: Attempts before this one.
    attempts: int
    partition: int | None
    offset: int | None


class FailedAttempt(NamedTuple):
    """What a failed attempt records: the error (storable text), and either a retry after
    `delay` seconds or, when `dead`, none."""

    id: int
    error: str
    dead: bool
    delay: float


class ClaimedBatch(NamedTuple):
    """The next rows of a worker's lanes, fetched and locked in one statement."""

    #: The rows to handle, in id order.
    rows: list[Pending]
    #: What each of them is made of, by row id.
    claimed: dict[int, Claimed]
    #: Every row taken, also those dropped as already handled (a redelivery): fewer than asked
    #: for means the lanes had no more rows due.
    taken: int


class Undecodable(Exception):
    """A message's payload cannot be decoded as its content type, or is not valid for its
    handler's payload type: no attempt can succeed, so the message is dead at once (not
    retried); the decoder's or validator's error is the cause, and in the text."""


def decode(
    claimed: Claimed, serializer: Serializer, payload_type: type[Any] | None = None
) -> InboxMessage[Any]:
    """The message a callback receives for a claimed row; `Undecodable` if its payload is not
    its content type, or (given a `payload_type`) does not validate as one."""
    return _message(claimed, serializer, payload_type, _plain_json(serializer, payload_type))


def decode_many(
    claimed: Iterable[Claimed], serializer: Serializer, payload_type: type[Any] | None = None
) -> tuple[list[InboxMessage[Any]], Exception | None]:
    """The messages of a batch's claimed rows, in order, built in one pass, each as `decode`
    builds it: all of them and None, or those before the first one that cannot be built and
    its error (`Undecodable`, or whatever else building it raised)."""
    plain = _plain_json(serializer, payload_type)
    messages: list[InboxMessage[Any]] = []
    append = messages.append
    for row in claimed:
        try:
            append(_message(row, serializer, payload_type, plain))
        except Exception as exc:
            return messages, exc
    return messages, None


#: Decodes a JSON document that starts at an index; that of `json.loads` (default settings).
_JSON = json.JSONDecoder()


def _plain_json(serializer: Serializer, payload_type: type[Any] | None) -> str | None:
    """The content type whose payloads `_message` may read with `_json_value`: the
    serializer's, when it is `JsonSerializer`'s own reading (`json.loads`) and no payload type
    validates them; else None."""
    if (
        payload_type is None
        and isinstance(serializer, JsonSerializer)
        and type(serializer).loads is JsonSerializer.loads
        and serializer.content_type not in (BYTES, TEXT)
    ):
        return serializer.content_type
    return None


def _json_value(payload: bytes) -> Any:
    """`json.loads(payload)` for the common payload, UTF-8 without a BOM or surrounding
    whitespace, without its per-call work (detecting the encoding, matching whitespace on both
    sides): about a third of its cost for a payload of 100 bytes. `_SLOW` for anything else,
    a payload that is not valid JSON included, which `read_payload` then reads (and words
    its error) as it always did: this never accepts a payload `json.loads` refuses, and what
    it accepts it decodes alike (the same scanner, at the same start)."""
    try:
        text = payload.decode()
        value, end = _JSON.raw_decode(text)
    except Exception:  # not UTF-8, not JSON, nested too deeply: the slow path says which
        return _SLOW
    return value if end == len(text) else _SLOW


#: `_json_value`'s answer for a payload it leaves to `read_payload`.
_SLOW: Any = object()


def _message(
    claimed: Claimed, serializer: Serializer, payload_type: type[Any] | None, plain: str | None
) -> InboxMessage[Any]:
    """`decode`, with `_plain_json`'s answer for its serializer and payload type."""
    payload = bytes(claimed.payload)
    content_type = claimed.content_type
    decoded = _json_value(payload) if content_type == plain else _SLOW
    if decoded is _SLOW:
        try:
            decoded = read_payload(payload_type, payload, content_type, serializer)
        except SerializationError as exc:  # not of its content type
            raise Undecodable(
                f"cannot decode the payload as {content_type!r}: {first_line(exc)}"
            ) from exc
        except Exception as exc:  # PayloadInvalid; anything a model's own validator raises
            raise Undecodable(
                f"the payload of topic {claimed.topic!r} is not a valid "
                f"{type_name(payload_type)}: {exc}"
            ) from exc
    key = claimed.key
    headers = claimed.headers
    # Positional: a third cheaper than by keyword (the fields of InboxMessage, in order).
    return InboxMessage(
        claimed.message_id,
        claimed.topic,
        bytes(key) if key is not None else None,
        decoded,
        payload,
        content_type,
        from_json(headers) if headers is not None else {},
        claimed.attempts + 1,
        claimed.created_at,
        claimed.received_at,
        claimed.partition,
        claimed.offset,
    )
