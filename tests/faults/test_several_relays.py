"""Several producer and handler processes on one database: each row once, per-key order kept,
on both transports (Kafka and the log kept in PostgreSQL)."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest

from outbox import Broker, Message

from ..integration import inbox_app
from ..integration.relay_helpers import (
    RelayTransport,
    count,
    spawn_consumer,
    spawn_handler,
    spawn_producer,
    wait_for,
)

pytestmark = pytest.mark.faults
APP = "tests.integration.inbox_app:handlers"


def _lane_owners(url: str) -> int:
    """How many sessions hold lanes (advisory locks) in this database."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_database d "
            "ON d.oid = l.database WHERE d.datname = current_database() "
            "AND l.locktype = 'advisory' AND l.granted"
        ).fetchone()
    return int(row[0]) if row else 0


def _where_they_are(
    sender: str, receiver: str, transport: RelayTransport, topic: str, total: int
) -> str:
    """Where the messages of a run that did not finish are: each stage's count, and the
    consumer group's place in each partition (forensics for a timeout)."""
    lines = [
        f"sent {total}; sender: producer_queue {count(sender, 'producer_queue')}, "
        f"producer_dead {count(sender, 'producer_dead')}",
        f"topic: {len(transport.records(topic, expected=total, timeout=10))} records",
        f"receiver: consumer_queue {count(receiver, 'consumer_queue')}, processed "
        f"{count(receiver, 'consumer_processed')}, dead "
        f"{count(receiver, 'consumer_queue', 'dead_at IS NOT NULL')}",
    ]
    with psycopg.connect(receiver) as conn:
        lines.append(
            "receiver relay_state: " + repr(conn.execute("SELECT * FROM relay_state").fetchall())
        )
    if not transport.is_log:
        from confluent_kafka import Consumer as KafkaConsumer
        from confluent_kafka import TopicPartition

        reader = KafkaConsumer({"bootstrap.servers": transport.endpoint, "group.id": "g-several"})
        try:
            partitions = [TopicPartition(topic, p) for p in range(3)]
            committed = reader.committed(partitions, timeout=10)
            marks = [reader.get_watermark_offsets(p, timeout=10) for p in partitions]
            lines.append(
                "group g-several committed: "
                + ", ".join(
                    f"p{c.partition}={c.offset} (high {m[1]})"
                    for c, m in zip(committed, marks, strict=True)
                )
            )
        finally:
            reader.close()
    return "\n".join(lines)


def test_three_producers_and_three_handlers_keep_per_key_order_end_to_end(
    outbox_database_factory: Any, relay_transport: RelayTransport
) -> None:
    sender, receiver = outbox_database_factory(), outbox_database_factory()
    outbox_topic = relay_transport.topic()
    endpoint = relay_transport.endpoint
    with psycopg.connect(receiver) as conn:
        conn.execute(inbox_app.SCHEMA)
    keys, total = 30, 3000
    env = {"INBOX_APP_TOPIC": outbox_topic}
    producers = [spawn_producer(sender, endpoint, "--batch-size", "100", env=env) for _ in range(3)]
    handlers = [
        spawn_handler(receiver, APP, "--concurrency", "2", "--batch-size", "50", env=env)
        for _ in range(3)
    ]
    consumer = spawn_consumer(receiver, endpoint, outbox_topic, "g-several", env=env)
    daemons = [*producers, *handlers, consumer]
    try:
        # Give every relay time to register, so the lanes are shared from the start.
        wait_for(
            lambda: count(sender, "relay_state") == 3 and count(receiver, "relay_state") == 3,
            30,
            "three producers and three handlers to register",
        )
        # ... and until they have shared the lanes out (each rebalances every 2 s).
        wait_for(
            lambda: _lane_owners(sender) == 3 and _lane_owners(receiver) == 3,
            30,
            "the lanes to be spread over three producers and three handlers",
        )
        seq: dict[str, int] = defaultdict(int)
        broker = Broker()
        with psycopg.connect(sender) as conn:
            for start in range(0, total, 100):
                batch = []
                for i in range(start, start + 100):
                    key = f"key-{i % keys}"
                    batch.append(Message(outbox_topic, {"key": key, "seq": seq[key]}, key=key))
                    seq[key] += 1
                with conn.transaction():
                    broker.send_many(conn, batch)
                time.sleep(0.01)  # a stream of commits, not one backlog
        try:
            wait_for(
                lambda: count(receiver, "consumer_processed") == total,
                180,
                "every message handled",
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n{_where_they_are(sender, receiver, relay_transport, outbox_topic, total)}"
                + "".join(f"\n--- {d.args[0]}:\n{d.output()[-3000:]}" for d in daemons)
            ) from None
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            assert daemon.wait(60) == 0, daemon.output()
            daemon.close()

    # The topic: each key in one partition, in send order (duplicates would be allowed, and
    # none are expected without a crash).
    records = relay_transport.records(outbox_topic, expected=total, timeout=60)
    on_topic: dict[str, list[int]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in records:
        body = json.loads(record.value)
        on_topic[body["key"]].append(body["seq"])
        partitions[body["key"]].add(record.partition)
    assert len({r.message_id for r in records}) == total
    assert all(seqs == list(range(total // keys)) for seqs in on_topic.values())
    assert all(len(p) == 1 for p in partitions.values())

    # Handlers: each message once, and per key in order of handling.
    with psycopg.connect(receiver) as conn:
        rows = conn.execute("SELECT message_id, body FROM effects ORDER BY seq").fetchall()
    assert max(Counter(r[0] for r in rows).values()) == 1
    handled: dict[str, list[int]] = defaultdict(list)
    for _mid, body in rows:
        data = json.loads(body)
        handled[data["key"]].append(data["seq"])
    assert handled == {f"key-{k}": list(range(total // keys)) for k in range(keys)}
