"""The rows of `consumer_queue` that the Handler and the inbox store pass each other, and the
message a claimed row becomes (`decode`): pure data."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from outbox.core.codecs import type_name
from outbox.core.envelope import InboxMessage
from outbox.core.errors import SerializationError
from outbox.core.headers import from_json
from outbox.core.serializers import Serializer, read_payload
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
    payload = bytes(claimed.payload)
    try:
        decoded = read_payload(payload_type, payload, claimed.content_type, serializer)
    except SerializationError as exc:  # not of its content type
        raise Undecodable(
            f"cannot decode the payload as {claimed.content_type!r}: {first_line(exc)}"
        ) from exc
    except Exception as exc:  # PayloadInvalid; anything a model's own validator raises
        raise Undecodable(
            f"the payload of topic {claimed.topic!r} is not a valid "
            f"{type_name(payload_type)}: {exc}"
        ) from exc
    return InboxMessage(
        id=claimed.message_id,
        topic=claimed.topic,
        key=bytes(claimed.key) if claimed.key is not None else None,
        payload=decoded,
        raw_payload=payload,
        content_type=claimed.content_type,
        headers=from_json(claimed.headers) if claimed.headers is not None else {},
        attempt=claimed.attempts + 1,
        created_at=claimed.created_at,
        received_at=claimed.received_at,
        partition=claimed.partition,
        offset=claimed.offset,
    )
