"""The Consumer's loop over an in-memory inbox and the in-memory transport: no PostgreSQL, no
broker (the daemons speak to ports only, issue 25)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime

from outbox.core.batches import InboxBatch, OutgoingRecord, Quarantined, outgoing
from outbox.core.databases import Database
from outbox.core.envelope import StoredMessage
from outbox.daemons.consumer import Consumer, ConsumerConfig, Subscription
from outbox.memory import InMemoryTransport

URL = "postgresql://nobody@nowhere.invalid/inbox"


class DataError(Exception):
    """What a PEP 249 driver raises for a value it cannot store."""


class MemoryInbox:
    """`consumer_queue` in a dict: ordinary rows and dead ones, each once per message id. A
    payload in `refused` is refused for its data, as PostgreSQL refuses a bad value."""

    def __init__(self, refused: Sequence[bytes] = ()) -> None:
        self.rows: dict[str, tuple[str, bytes]] = {}
        self.dead: dict[str, str] = {}
        self.refused = set(refused)
        self.lock = threading.Lock()

    # InboxWriters and InboxWriter in one
    def __call__(self, url: str, schema: str, *, connect_timeout: float) -> MemoryInbox:
        return self

    def connect(self, *, checked: bool = False) -> MemorySession:
        return MemorySession(self)

    def check(
        self,
        *,
        wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        attempt: Callable[[], None] = lambda: None,
    ) -> None:
        attempt()


class MemorySession:
    def __init__(self, inbox: MemoryInbox) -> None:
        self.inbox = inbox
        self.usable = True

    def insert(
        self, batch: InboxBatch, meanwhile: Callable[[], None] | None = None
    ) -> Counter[str]:
        if meanwhile is not None:
            meanwhile()
        if self.inbox.refused & set(batch.payloads):
            raise DataError("invalid byte sequence")
        stored: Counter[str] = Counter()
        with self.inbox.lock:
            for message_id, topic, payload in zip(
                batch.message_ids, batch.topics, batch.payloads, strict=True
            ):
                if message_id not in self.inbox.rows:
                    self.inbox.rows[message_id] = (topic, payload)
                    stored[topic] += 1
        return stored

    def quarantine(self, records: Sequence[Quarantined]) -> Counter[str]:
        dead: Counter[str] = Counter()
        with self.inbox.lock:
            for record in records:
                if record.message_id not in self.inbox.dead:
                    self.inbox.dead[record.message_id] = record.reason
                    dead[record.topic] += 1
        return dead

    def close(self) -> None:
        self.usable = False


def message(topic: str, payload: bytes, message_id: uuid.UUID | None = None) -> OutgoingRecord:
    return outgoing(
        StoredMessage(
            id=0,
            message_id=message_id or uuid.uuid4(),
            topic=topic,
            key=b"k",
            payload=payload,
            content_type="application/json",
            headers={},
            created_at=datetime.now(UTC),
            attempts=0,
        )
    )


@contextmanager
def running(consumer: Consumer) -> Iterator[None]:
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        consumer.stop()
        thread.join(10)
        assert not thread.is_alive()


def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def consumer_of(transport: InMemoryTransport, inbox: MemoryInbox, **options: object) -> Consumer:
    return Consumer(
        ConsumerConfig(**options),  # type: ignore[arg-type]
        lambda: transport.subscriber(["orders"], "billing"),
        subscription=Subscription(group="billing", topics=["orders"]),
        inbox=inbox,
        database=Database("inbox", URL, "outbox"),
    )


def test_the_consumer_stores_each_record_once_and_commits_after_storing() -> None:
    transport = InMemoryTransport(default_partitions=2)
    transport.create_topic("orders", partitions=2)
    again = uuid.uuid4()
    records = [message("orders", f'{{"n": {n}}}'.encode()) for n in range(25)]
    records += [message("orders", b'{"n": "again"}', again)] * 2  # delivered twice
    assert transport.publisher().publish(records) == [None] * len(records)
    inbox = MemoryInbox()
    consumer = consumer_of(transport, inbox, batch_size=4)

    with running(consumer):
        until(lambda: transport.lag("billing", ["orders"]) == 0)

    assert len(inbox.rows) == 26
    assert inbox.rows[str(again)] == ("orders", b'{"n": "again"}')
    assert (consumer.received, consumer.stored, consumer.quarantined) == (27, 26, 0)


def test_a_record_refused_for_its_data_is_quarantined_and_the_others_stored() -> None:
    transport = InMemoryTransport(default_partitions=1)
    transport.create_topic("orders", partitions=1)
    poison = message("orders", b'{"poison": true}')
    records = [message("orders", f'{{"n": {n}}}'.encode()) for n in range(6)]
    records.insert(3, poison)
    assert transport.publisher().publish(records) == [None] * len(records)
    inbox = MemoryInbox(refused=[poison.payload])
    consumer = consumer_of(transport, inbox, batch_size=100)

    with running(consumer):
        until(lambda: transport.lag("billing", ["orders"]) == 0)

    assert len(inbox.rows) == 6 and str(poison.message_id) not in inbox.rows
    assert list(inbox.dead) == [str(poison.message_id)]
    assert inbox.dead[str(poison.message_id)].startswith("PostgreSQL refused the record: ")
    assert (consumer.stored, consumer.quarantined) == (6, 1)
