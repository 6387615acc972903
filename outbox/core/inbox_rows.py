"""The rows of `consumer_queue` that the Handler and the inbox store pass each other: pure data."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID


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
