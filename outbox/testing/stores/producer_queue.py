"""`producer_queue` in memory (`MemoryOutbox`): what `Broker.send` writes and the Producer's
sessions fetch, settle and dead-letter, as `producer_fetch`, `producer_next_retry`,
`producer_delete` and `producer_fail` do."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn

from outbox.core.batches import OutgoingRecord
from outbox.core.envelope import DEFAULT_MAX_MESSAGE_BYTES, OutgoingMessage, compose
from outbox.core.errors import DuplicateMessageId
from outbox.core.headers import to_json
from outbox.core.serializers import JsonSerializer, Serializer
from outbox.core.topics import Topic
from outbox.ports import RelayStores, RelayTarget
from outbox.testing.stores import values
from outbox.testing.stores.relays import MemoryRelaySession, Relays
from outbox.testing.stores.values import (
    as_uuid,
    integer,
    jsonb,
    jsonb_text,
    text,
    timestamp,
)


@dataclass
class OutboxRow:
    """A row of the in-memory `producer_queue` (or, once dead, of its `producer_dead`)."""

    record: OutgoingRecord
    lane: int
    #: When it may be fetched again (`time.monotonic()`), after a failed delivery.
    due: float = 0.0
    error: str | None = None


class Rows:
    """What a fetch returns (`outbox.ports.FetchedRows`): read at once, nothing is pipelined."""

    def __init__(self, rows: list[OutgoingRecord]) -> None:
        self.rows = rows

    def fetchall(self) -> list[OutgoingRecord]:
        return self.rows

    def fetchone(self) -> OutgoingRecord | None:
        return self.rows[0] if self.rows else None


class MemoryOutbox:
    """One `producer_queue` (and its `producer_dead`) in memory, for any number of relays."""

    def __init__(
        self,
        *,
        serializer: Serializer | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        #: Held by a session's `transaction()` for its whole block (re-entrant).
        self.lock = threading.RLock()
        #: The rows waiting to be delivered, by row id.
        self.rows: dict[int, OutboxRow] = {}
        #: The rows that can never be delivered (`producer_dead`), by row id.
        self.dead: dict[int, OutboxRow] = {}
        #: Statements run by the relays' sessions (fetch, delete, fail).
        self.statements = 0
        self.relays = Relays()
        self.serializer: Serializer = serializer or JsonSerializer()
        self.max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)
        #: The waiting rows by message id (the unique index of `producer_queue`).
        self._waiting: dict[str, int] = {}

    # -- what the code under test does ---------------------------------------------------------

    def send(
        self,
        topic: str | Topic[Any],
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: uuid.UUID | str | None = None,
    ) -> uuid.UUID:
        """Write one message as `Broker.send` would have, committed at once; its id.

        Validated and encoded as `Broker.send` does (a `Topic`'s payload checked and its key
        derived), without the trace context and causation headers it adds.
        """
        if isinstance(topic, Topic):
            topic.check(payload)
            if key is None:
                key = topic.key_of(payload)
            topic = topic.name
        message = compose(
            topic,
            payload,
            key=key,
            headers=headers,
            message_id=message_id,
            serializer=self.serializer,
            max_message_bytes=self.max_message_bytes,
        )
        self.write([message])
        return message.message_id

    def write(self, messages: Sequence[OutgoingMessage]) -> None:
        """Insert composed messages at once, as the Broker's writer does in a transaction that
        commits: `DuplicateMessageId` if a message id is one a row still waiting has (or is
        given twice), `DataError` for a value PostgreSQL would refuse; then nothing is
        written."""
        now = timestamp(datetime.now(UTC))
        rows: list[OutboxRow] = []
        for message in messages:
            stored = to_json(message.headers)
            headers = jsonb(json.dumps(stored), "headers") if stored else None
            record = OutgoingRecord(
                id=0,
                topic=text(message.topic, "topic"),
                key=message.key,
                payload=message.payload,
                message_id=str(as_uuid(message.message_id)),
                created_at=now,
                content_type=text(message.content_type, "content type"),
                headers=None if headers is None else jsonb_text(headers),
                attempts=0,
            )
            rows.append(OutboxRow(record, integer(message.lane, 16, "lane")))
        with self.lock:
            spelt = [row.record.message_id for row in rows]
            taken = [m for n, m in enumerate(spelt) if m in self._waiting or m in spelt[:n]]
            if taken:
                raise DuplicateMessageId(
                    f"message id {', '.join(taken[:5])} is already in producer_queue (sent and "
                    "not yet relayed): each message needs an id of its own; nothing of this "
                    "send was written"
                )
            for row in rows:
                row_id = next(self._ids)
                row.record = row.record._replace(id=row_id)
                self.rows[row_id] = row
                self._waiting[row.record.message_id] = row_id
        self.relays.wake_if_sleeping()

    def find(self, message_id: uuid.UUID | str) -> OutboxRow | None:
        """The row of a message, waiting or dead; None once it was delivered."""
        spelt = str(message_id)
        with self.lock:
            row_id = self._waiting.get(spelt)
            if row_id is not None:
                return self.rows[row_id]
            return next((r for r in self.dead.values() if r.record.message_id == spelt), None)

    def _forget(self, row_id: int) -> OutboxRow | None:
        """Take a row out of the waiting ones (`lock` held)."""
        row = self.rows.pop(row_id, None)
        if row is not None:
            self._waiting.pop(row.record.message_id, None)
        return row

    def _restore(self, rows: dict[int, OutboxRow], dead: dict[int, OutboxRow]) -> None:
        """Put the queue back as it was (a transaction rolled back; `lock` held)."""
        self.rows.clear()
        self.rows.update(sorted(rows.items()))
        self.dead.clear()
        self.dead.update(sorted(dead.items()))
        self._waiting = {row.record.message_id: i for i, row in self.rows.items()}

    def database(self, relay_id: str | None = None) -> MemoryOutboxDatabase:
        """The `QueueDatabase` a Producer reaches this queue through (one relay's)."""
        return MemoryOutboxDatabase(self, relay_id or uuid.uuid4().hex)

    def stores(self) -> RelayStores:
        """Relay stores whose Producers use this queue; a Handler given them is refused."""

        def outbox(target: RelayTarget) -> MemoryOutboxDatabase:
            if target.kind != "producer":
                raise ValueError(f"a MemoryOutbox serves producers, not a {target.kind!r}")
            return self.database(target.relay_id)

        def inbox(target: RelayTarget) -> NoReturn:
            raise ValueError("a MemoryOutbox has no consumer_queue: use MemoryInbox.stores()")

        return RelayStores(outbox=outbox, inbox=inbox)

    # -- what the sessions do (as producer_fetch, producer_next_retry) ---------------------------

    def fetch(self, lanes: list[int], limit: int, exclude: list[int]) -> list[OutgoingRecord]:
        """The next rows of `lanes` that may go out now, in id order, less `exclude`: a key's
        rows after its earliest retrying row wait for it (rows without a key never wait)."""
        wanted, skipped, now = set(lanes), set(exclude), time.monotonic()
        out: list[OutgoingRecord] = []
        retrying: set[tuple[int, bytes]] = set()
        with self.lock:
            self.statements += 1
            for row_id in sorted(self.rows):
                row = self.rows[row_id]
                if row.lane not in wanted or limit <= len(out):
                    continue
                key = row.record.key
                if key is not None and (row.lane, key) in retrying:
                    continue
                if key is not None and row.record.attempts > 0:
                    retrying.add((row.lane, key))  # the key's later rows wait behind it
                if row.due <= now and row_id not in skipped:
                    out.append(row.record)
        return out

    def next_due(self, lanes: list[int]) -> float | None:
        """Seconds until the earliest retrying row of a key of `lanes` is due (negative: due),
        or None: a key's later retrying rows wait for its first whatever their own time."""
        wanted, first = set(lanes), dict[object, float]()
        with self.lock:
            for row_id in sorted(self.rows):
                row = self.rows[row_id]
                if row.lane in wanted and row.record.attempts > 0:
                    key = row.record.key
                    first.setdefault((row.lane, key) if key is not None else row_id, row.due)
        return min(first.values()) - time.monotonic() if first else None


class MemoryOutboxSession(MemoryRelaySession):
    """The Producer's session on a `MemoryOutbox` (an `outbox.ports.OutboxSession`)."""

    def __init__(self, queue: MemoryOutbox, relay_id: str) -> None:
        super().__init__(queue.relays, relay_id)
        self.queue = queue

    def fetch(self, lanes: list[int], limit: int, exclude: list[int]) -> Rows:
        self._live()
        return Rows(self.queue.fetch(lanes, limit, exclude))

    def next_due(self, lanes: list[int]) -> float | None:
        self._live()
        return self.queue.next_due(lanes)

    def promote(self, lanes: list[int], limit: int) -> tuple[int, float | None]:
        """Nothing is ever scheduled in memory (`MemoryOutbox.send` has no due time)."""
        self._live()
        return 0, None

    def delete(self, ids: Sequence[int]) -> None:
        self._live()
        with self.queue.lock:
            self.queue.statements += 1
            for row_id in ids:
                self.queue._forget(row_id)

    def fail(
        self, ids: Sequence[int], errors: Sequence[str], delays: Sequence[float | None]
    ) -> None:
        self._live()
        failures = list(zip(ids, errors, delays, strict=True))
        for _, error, delay in failures:
            text(error, "error")
            if delay is not None:
                values.delay(delay)
        now = time.monotonic()
        with self.queue.lock:
            self.queue.statements += 1
            for row_id, error, delay in failures:
                row = self.queue.rows.get(row_id)
                if row is None:
                    continue  # delivered or dead meanwhile: nothing to record
                record = row.record._replace(attempts=row.record.attempts + 1)
                if delay is None:
                    self.queue._forget(row_id)
                    self.queue.dead[row_id] = replace(row, record=record, error=error)
                else:
                    self.queue.rows[row_id] = replace(
                        row, record=record, error=error, due=now + delay
                    )

    def pipeline(self) -> AbstractContextManager[object]:
        return nullcontext()

    @contextmanager
    def transaction(self) -> Iterator[object]:
        """The block's statements apply together or not at all (an exception undoes them);
        other sessions wait for it to end."""
        self._live()
        with self.queue.lock:
            # Rows are replaced, never changed in place: the dicts' copies are the snapshot.
            rows, dead = dict(self.queue.rows), dict(self.queue.dead)
            try:
                yield self
            except BaseException:
                self.queue._restore(rows, dead)
                raise


class MemoryOutboxDatabase:
    """The `QueueDatabase` of a `MemoryOutbox`: always reachable and migrated."""

    def __init__(self, queue: MemoryOutbox, relay_id: str) -> None:
        self.queue = queue
        self.relay_id = relay_id

    def connect(self) -> MemoryOutboxSession:
        return MemoryOutboxSession(self.queue, self.relay_id)

    def check(self, wait: float, stopping: Callable[[], bool], attempt: Callable[[], None]) -> None:
        attempt()
