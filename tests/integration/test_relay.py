"""The Producer relay against a real broker: volume and order, SIGKILL, SIGTERM, outages."""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict

import psycopg
import pytest

from outbox import Broker, Message
from outbox.testing.servers import Servers

from .relay_helpers import (
    consume,
    count,
    header,
    producer_thread,
    relay_until_empty,
    spawn_producer,
    wait_for,
)

broker = Broker()


def _send_sequenced(url: str, topic: str, total: int, keys: int, per_tx: int = 100) -> None:
    """Send `total` messages round-robin over `keys`, each payload carrying its key's sequence."""
    seq: dict[str, int] = defaultdict(int)
    with psycopg.connect(url) as conn:
        for start in range(0, total, per_tx):
            batch = []
            for i in range(start, min(start + per_tx, total)):
                key = f"key-{i % keys}"
                batch.append(Message(topic, {"key": key, "seq": seq[key]}, key=key))
                seq[key] += 1
            with conn.transaction():
                broker.send_many(conn, batch)


def _by_key(messages: list[object]) -> dict[str, list[int]]:
    result: dict[str, list[int]] = defaultdict(list)
    for m in messages:
        body = json.loads(m.value())  # type: ignore[attr-defined]
        assert m.key() == body["key"].encode()  # type: ignore[attr-defined]
        result[body["key"]].append(body["seq"])
    return result


def test_ten_thousand_messages_over_twenty_keys_arrive_in_order_per_key(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    _send_sequenced(outbox_database_url, outbox_topic, total=10_000, keys=20)
    relay_until_empty(outbox_database_url, outbox_kafka_bootstrap, timeout=120)

    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=10_000, timeout=60)
    assert len(messages) == 10_000
    by_key = _by_key(messages)
    assert len(by_key) == 20
    for key, seqs in by_key.items():
        assert seqs == list(range(500)), f"{key} out of order or incomplete"
    # One key, one partition: that is what keeps the order on the consuming side.
    partitions: dict[bytes, set[int]] = defaultdict(set)
    for m in messages:
        partitions[m.key()].add(m.partition())
    assert all(len(p) == 1 for p in partitions.values())


def test_sigkill_mid_batch_then_restart_loses_nothing(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    total = 20_000
    _send_sequenced(outbox_database_url, outbox_topic, total=total, keys=10, per_tx=1000)
    with psycopg.connect(outbox_database_url) as conn:
        expected_ids = {
            str(r[0]) for r in conn.execute("SELECT message_id FROM outbox.producer_queue")
        }

    with spawn_producer(
        outbox_database_url, outbox_kafka_bootstrap, "--batch-size", "500"
    ) as relay:
        wait_for(lambda: count(outbox_database_url) < total - 1000, 60, "the relay to start")
        relay.signal(signal.SIGKILL)
        relay.wait(10)
    left = count(outbox_database_url)
    assert 0 < left < total, "the kill should have landed mid-way"

    with spawn_producer(outbox_database_url, outbox_kafka_bootstrap) as restarted:
        wait_for(lambda: count(outbox_database_url) == 0, 120, "the queue to drain")
        restarted.signal(signal.SIGTERM)
        assert restarted.wait(30) == 0, restarted.output()

    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=total, timeout=60)
    seen = {header(m, "outbox-message-id").decode() for m in messages}  # type: ignore[union-attr]
    assert seen == expected_ids  # nothing lost; duplicates are allowed here
    assert len(messages) >= total


def test_sigterm_finishes_the_batch_and_exits_zero(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    _send_sequenced(outbox_database_url, outbox_topic, total=5000, keys=5, per_tx=1000)
    with spawn_producer(
        outbox_database_url, outbox_kafka_bootstrap, "--batch-size", "200"
    ) as relay:
        wait_for(lambda: count(outbox_database_url) < 5000, 60, "the relay to start")
        relay.signal(signal.SIGTERM)
        assert relay.wait(30) == 0, relay.output()
    left = count(outbox_database_url)
    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=5000 - left, timeout=30)
    # Every row deleted was delivered, and nothing delivered is still queued: the batch in
    # hand was finished, not abandoned.
    assert len(messages) == 5000 - left
    with psycopg.connect(outbox_database_url) as conn:
        queued = {str(r[0]) for r in conn.execute("SELECT message_id FROM outbox.producer_queue")}
    assert not queued & {header(m, "outbox-message-id").decode() for m in messages}  # type: ignore[union-attr]
    assert count(outbox_database_url, "relay_state") == 0


def test_messages_wait_while_the_broker_is_unreachable_then_arrive(
    outbox_servers: Servers,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
) -> None:
    kafka = outbox_servers.kafka
    if not hasattr(kafka, "pause"):
        pytest.skip("the broker in use cannot be paused")
    # Short delivery timeout, so the outage shows up as failed deliveries that get retried.
    options = {"kafka_config": {"message.timeout.ms": "1500"}, "poll_interval": 0.2}
    with producer_thread(outbox_database_url, outbox_kafka_bootstrap, **options) as relay:
        with psycopg.connect(outbox_database_url) as conn, conn.transaction():
            broker.send(conn, outbox_topic, {"before": True}, key="a")
        wait_for(lambda: count(outbox_database_url) == 0, 30, "the first message")
        try:
            kafka.pause()
        except NotImplementedError:
            pytest.skip("the broker in use cannot be paused")
        try:
            with psycopg.connect(outbox_database_url) as conn, conn.transaction():
                broker.send_many(
                    conn, [Message(outbox_topic, {"n": i}, key=f"k{i % 3}") for i in range(30)]
                )
            time.sleep(4)
            assert count(outbox_database_url) == 30, "nothing may be deleted while Kafka is down"
            wait_for(lambda: relay.failed > 0, 10, "a failed delivery to be recorded")
            retried = count(outbox_database_url, where="attempts > 0")
            assert retried > 0
        finally:
            kafka.resume()
        wait_for(lambda: count(outbox_database_url) == 0, 60, "the backlog after the outage")

    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=31, timeout=30)
    bodies = [json.loads(m.value()) for m in messages]
    assert {"before": True} in bodies
    assert {b["n"] for b in bodies if "n" in b} == set(range(30))
