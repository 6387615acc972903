"""The relay -> transport -> inbox -> handler path on each transport (Kafka, the PostgreSQL log).

What depends on the transport: order per key (a key stays in one partition), a record
delivered twice is stored and handled once, a poison message goes dead while the rest flows.
The daemons run in threads of the test (tests/faults/ runs them as processes).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import psycopg

from outbox import Broker, Handlers, InboxMessage, Message
from outbox.core.batches import outgoing_batch
from outbox.core.envelope import StoredMessage
from outbox.core.ids import uuid7
from outbox.testing.plugin import DatabaseFactory, Drain

from .relay_helpers import RelayTransport, count, handler_thread, running, wait_for

broker = Broker()


def test_order_per_key_from_one_service_to_another(
    outbox_database_factory: DatabaseFactory, relay_transport: RelayTransport
) -> None:
    sender, receiver = outbox_database_factory(), outbox_database_factory()
    topic = relay_transport.topic(3)
    keys, rounds = 10, 30
    with psycopg.connect(sender) as conn:
        for n in range(rounds):
            with conn.transaction():
                broker.send_many(
                    conn,
                    [Message(topic, {"key": k, "n": n}, key=f"k{k}") for k in range(keys)],
                )
    seen: dict[int, list[int]] = defaultdict(list)
    partitions: dict[int, set[int | None]] = defaultdict(set)
    lock = threading.Lock()
    handlers = Handlers()

    @handlers.handler(topic)
    def record(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        with lock:
            seen[message.payload["key"]].append(message.payload["n"])
            partitions[message.payload["key"]].add(message.partition)

    consumer = relay_transport.consumer(receiver, [topic], f"g-{topic}", batch_size=50)
    with (
        running(relay_transport.producer(sender, batch_size=40)),
        running(consumer),
        handler_thread(receiver, handlers, concurrency=2),
    ):
        wait_for(
            lambda: count(receiver, "consumer_processed") == 300,
            60,
            "all handled",
        )
    assert count(sender) == 0
    assert consumer.received == consumer.stored == keys * rounds  # nothing delivered twice
    assert dict(seen) == {k: list(range(rounds)) for k in range(keys)}
    assert all(len(p) == 1 for p in partitions.values())


def _message(topic: str, n: int) -> StoredMessage:
    return StoredMessage(
        id=n,
        message_id=uuid7(),
        topic=topic,
        key=f"k{n % 3}".encode(),
        payload=b'{"n": %d}' % n,
        content_type="application/json",
        headers={},
        created_at=datetime.now(UTC),
        attempts=0,
    )


def test_a_record_delivered_twice_is_stored_and_handled_once(
    outbox_database_url: str, relay_transport: RelayTransport
) -> None:
    """A relay that lost its acknowledgement sends again: the log or the broker holds every
    record twice, the inbox stores and handles each message once."""
    topic = relay_transport.topic(3)
    batch = outgoing_batch([_message(topic, n) for n in range(20)])
    publisher = relay_transport.publisher()
    try:
        assert publisher.publish(batch) == [None] * 20
        assert publisher.publish(batch) == [None] * 20  # the resend
    finally:
        publisher.close()
    handled: list[int] = []
    handlers = Handlers()

    @handlers.handler(topic)
    def record(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        handled.append(message.payload["n"])

    url = outbox_database_url
    consumer = relay_transport.consumer(url, [topic], f"g-{topic}")
    with running(consumer), handler_thread(url, handlers):
        wait_for(lambda: consumer.received == 40, 60, "both copies received")
        wait_for(lambda: len(handled) == 20, 30, "every message handled")
    assert count(url, "consumer_processed") == 20
    assert count(url, "consumer_queue") == 0
    assert sorted(handled) == list(range(20))


def test_a_poison_message_goes_dead_and_the_others_flow(
    outbox_database_url: str, outbox_drain: Drain, relay_transport: RelayTransport
) -> None:
    topic = relay_transport.topic(3)
    url = outbox_database_url
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE effects (n int)")
    handlers = Handlers()

    @handlers.handler(topic, max_attempts=1)
    def record(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        # The effect is written in the handler's transaction: a callback that runs again
        # (its batch rolled back by the poison's failure) leaves it once.
        conn.execute("INSERT INTO effects VALUES (%s)", (message.payload.get("n"),))
        if message.payload.get("poison"):
            raise ValueError("poison message")

    with psycopg.connect(url) as conn, conn.transaction():
        broker.send(conn, topic, {"poison": True}, key="k0")
        broker.send_many(conn, [Message(topic, {"n": n}, key=f"k{n % 4}") for n in range(30)])
    result = outbox_drain(handlers, transport=relay_transport.endpoint)
    assert (result.relayed, result.stored, result.handled) == (31, 31, 30)
    assert [(d.topic, d.error) for d in result.dead] == [(topic, "ValueError: poison message")]
    # A dead message does not hold its key: the other messages of k0 were handled after it.
    with psycopg.connect(url) as conn:
        effects = sorted(r[0] for r in conn.execute("SELECT n FROM effects"))
    assert effects == list(range(30))
