"""`outbox consumer --start earliest|latest|TIME`: where a new group starts, on the real broker.

Records are produced one per request into chosen partitions (Tansu reports a partition's end
wrongly after batched produce, and `latest` starts at that end).

Tansu answers offset 0 to every `offsets_for_times` request, whatever the time, so on Tansu the
time start is tested as far as it can be: the lookup is made for the partitions without a
committed offset only, they are positioned where the broker says, and committed partitions
resume at their commit. That the broker's answer is the first record at or after the time is
Apache Kafka's part, tested by the `kafka_only` test (skipped on Tansu). The positioning logic
itself (end of partition when no record is that recent, fallbacks) has unit tests with a fake
consumer in tests/unit/test_consumer_start.py.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Producer

from outbox.kafka.start import START_KEY
from tests.integration.relay_helpers import (
    TEST_CONSUMER_KAFKA,
    consumer_thread,
    count,
    spawn_consumer,
    wait_for,
)


def produce(
    bootstrap: str, topic: str, values: list[int], partition: int, at: datetime | None = None
) -> None:
    """One record per request into `partition`, value `{"n": N}`, timestamped `at` if given."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for n in values:
        extra = {} if at is None else {"timestamp": int(at.timestamp() * 1000)}
        producer.produce(topic, value=b'{"n": %d}' % n, partition=partition, **extra)
        assert producer.flush(10) == 0


def stored(url: str) -> set[int]:
    """The `n` of every stored record."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT convert_from(payload, 'UTF8')::jsonb->>'n' FROM outbox.consumer_queue"
        ).fetchall()
    return {int(r[0]) for r in rows}


def _assigned(caplog: pytest.LogCaptureFixture, group: str) -> bool:
    return any(f"group {group} assigned" in r.getMessage() for r in caplog.records)


def test_latest_skips_what_was_there_and_logs_join_assign_and_revoke(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    group = f"g-{topic}"
    for partition in range(3):
        produce(bootstrap, topic, [partition], partition)  # before the group exists
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    config = {**TEST_CONSUMER_KAFKA, START_KEY: "latest"}
    with consumer_thread(url, bootstrap, [topic], group=group, kafka_config=config):
        wait_for(lambda: _assigned(caplog, group), 30, "the group to be joined")
        time.sleep(1)  # the fetch positions are resolved (to the ends) after the assignment
        for partition in range(3):
            produce(bootstrap, topic, [10 + partition], partition)
        wait_for(lambda: count(url, "consumer_queue") >= 3, 30, "the 3 new records")
        time.sleep(0.5)
        assert stored(url) == {10, 11, 12}, "the records from before the group are skipped"
    messages = [r.getMessage() for r in caplog.records]
    # Said before the wait: what the consumer waits for while the group forms.
    joining = next(
        i for i, m in enumerate(messages) if m.startswith(f"joining consumer group {group}")
    )
    assert "session.timeout.ms" in messages[joining]
    joined = next(m for m in messages if m.startswith(f"joined consumer group {group}"))
    assert "start latest" in joined
    # The first assignment says how many partitions, after how long.
    (first,) = [m for m in messages if m.startswith(f"group {group} assigned")]
    assert re.fullmatch(
        rf"group {group} assigned 3 partitions after \d+\.\d s: {topic}\[0,1,2\]", first
    )
    assert messages.index(first) > joining
    assert f"group {group} revoked {topic}[0,1,2]" in messages, "close leaves the group"


def test_a_committed_partition_resumes_at_its_commit_whatever_start_says(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    group = f"g-{topic}"
    produce(bootstrap, topic, [1, 2], partition=0)
    with consumer_thread(url, bootstrap, [topic], group=group):  # earliest: commits partition 0
        wait_for(lambda: count(url, "consumer_queue") == 2, 30, "the first 2 records")
    produce(bootstrap, topic, [3, 4], partition=0)  # while the group is away
    produce(bootstrap, topic, [5], partition=1)  # a partition the group never committed

    caplog.set_level(logging.INFO, logger="outbox.consumer")
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    config = {**TEST_CONSUMER_KAFKA, START_KEY: future}
    with consumer_thread(url, bootstrap, [topic], group=group, kafka_config=config):
        wait_for(lambda: count(url, "consumer_queue") >= 4, 30, "the 2 records of partition 0")
        time.sleep(0.5)
    assert {1, 2, 3, 4} <= stored(url), "partition 0 resumed at its commit"
    messages = [r.getMessage() for r in caplog.records]
    lookups = [m for m in messages if "has no committed offset" in m]
    assert {m.split()[2] for m in lookups} == {f"{topic}[1]", f"{topic}[2]"}, (
        "the time is looked up for the partitions without a commit only"
    )
    # Apache Kafka: no record of partition 1 is that recent, so it starts at its end and 5 is
    # skipped; Tansu answers offset 0 to every lookup, so there 5 is read.


def test_the_flag_and_its_variable_reach_the_daemon(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    produce(bootstrap, topic, [1], partition=0)
    with spawn_consumer(url, bootstrap, topic, f"g-{topic}", "--start", "latest") as daemon:
        wait_for(lambda: "assigned" in daemon.output(), 30, "the assignment")
        time.sleep(1)
        produce(bootstrap, topic, [2], partition=0)
        wait_for(lambda: count(url, "consumer_queue") == 1, 30, "the new record")
        assert stored(url) == {2}
        assert f"joined consumer group g-{topic}" in daemon.output()
        assert "start latest" in daemon.output()
    env = {"OUTBOX_CONSUMER_START": "2024-05-01T12:00:00+02:00"}
    with spawn_consumer(url, bootstrap, topic, f"h-{topic}", env=env) as daemon:
        wait_for(lambda: "assigned" in daemon.output(), 30, "the assignment")
        assert "start 2024-05-01T10:00:00+00:00" in daemon.output(), daemon.output()


@pytest.mark.kafka_only  # Tansu answers offset 0 to every offsets_for_times request
def test_a_time_start_reads_from_the_first_record_at_or_after_it(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    now = datetime.now(UTC)
    produce(bootstrap, topic, [1, 2], partition=0, at=now - timedelta(hours=2))
    produce(bootstrap, topic, [3, 4], partition=0, at=now - timedelta(minutes=1))
    produce(bootstrap, topic, [5], partition=1, at=now - timedelta(hours=2))  # only old ones
    start = (now - timedelta(hours=1)).isoformat()
    config = {START_KEY: start}  # real Kafka: its own session timeouts
    with consumer_thread(url, bootstrap, [topic], kafka_config=config):
        wait_for(lambda: count(url, "consumer_queue") >= 2, 60, "the 2 recent records")
        produce(bootstrap, topic, [6], partition=1)  # partition 1 started at its end
        wait_for(lambda: count(url, "consumer_queue") >= 3, 60, "the record after the end")
        time.sleep(0.5)
    assert stored(url) == {3, 4, 6}


def test_a_topic_created_after_the_consumer_subscribed_is_read_within_seconds(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    """Starting the Consumer before anything was ever produced to its topic is the natural
    deployment order; librdkafka's default metadata refresh (5 minutes) held the first
    message that long."""
    import uuid

    url, bootstrap = outbox_database_url, outbox_kafka_bootstrap
    topic = f"late.{uuid.uuid4().hex[:12]}"
    # The usual session timeout: the group is joined (about half of it) before the topic
    # exists, and nothing but the metadata refresh tells the consumer about it afterwards.
    config = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
    with consumer_thread(url, bootstrap, [topic], group=f"g-{topic}", kafka_config=config):
        time.sleep(4)  # subscribed to a topic the broker does not know yet
        produce(bootstrap, topic, [1], 0)  # the broker creates it on this first produce
        wait_for(lambda: count(url, "consumer_queue") >= 1, 30, "the new topic's record")
    assert stored(url) == {1}
