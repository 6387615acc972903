"""A jump in a partition's offsets is read again before anything is committed past it.

The local broker has been seen skipping a record at the head of a partition written by several
producers and giving it on a later read (outbox.kafka.continuity). The skip cannot be caused on
purpose, so the subscriber is told its partition starts two offsets before where the group
really resumes: on the real broker, its first records then jump, and it must seek back and
deliver the two records it was told are missing, in order, before the rest.
"""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from outbox.kafka.subscriber import KafkaSubscriber, consumer_config
from tests.integration.relay_helpers import TEST_CONSUMER_KAFKA


def test_a_jump_is_read_again_from_the_missing_offset(outbox_kafka_bootstrap: str) -> None:
    bootstrap = outbox_kafka_bootstrap
    topic, group = f"continuity-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for n in range(10):
        producer.produce(topic, value=b"%d" % n, partition=0)
        assert producer.flush(10) == 0
    # The group resumes at offset 5.
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    committer.close()

    subscriber = KafkaSubscriber(consumer_config(bootstrap, group, TEST_CONSUMER_KAFKA), [topic])
    start = subscriber.continuity.start
    told: list[tuple[tuple[str, int], int]] = []

    def start_two_early(partition: tuple[str, int], offset: int) -> None:
        told.append((partition, offset))
        start(partition, offset - 2 if offset >= 2 else offset)

    subscriber.continuity.start = start_two_early  # type: ignore[method-assign]
    got: list[int] = []
    try:
        for _ in range(200):
            batch = subscriber.poll(100, 0.2)
            got += [
                o
                for (t, p, o) in zip(batch.topics, batch.partitions, batch.offsets, strict=True)
                if (t, p) == (topic, 0)
            ]
            if len(got) >= 7:
                break
    finally:
        subscriber.close()
    assert ((topic, 0), 5) in told, "the committed offset is looked up at assignment"
    assert got == [3, 4, 5, 6, 7, 8, 9], "after the jump, the records from the missing offset on"
    assert subscriber.continuity.skipped == 1
