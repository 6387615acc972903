"""Consumer-group lag (`outbox.kafka.lag`) against the real broker.

Records are produced one per request (flushed each): Tansu reports a partition's end as the
base offset of its last record batch + 1, which is the true end only when batches hold one
record; Apache Kafka reports the true end whatever the batching.
"""

from __future__ import annotations

from confluent_kafka import Producer

from outbox.kafka.lag import lag_json, read_lag
from tests.integration.relay_helpers import consumer_thread, count, wait_for


def produce_one_by_one(bootstrap: str, topic: str, n: int, start: int = 0) -> None:
    """`n` records, each in its own batch, keys spread over the partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(start, start + n):
        producer.produce(topic, value=b'{"n": %d}' % i, key=f"k{i}".encode())
        assert producer.flush(10) == 0


def test_lag_is_the_end_of_each_partition_less_the_committed_offset(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    group = f"g-{outbox_topic}"
    produce_one_by_one(outbox_kafka_bootstrap, outbox_topic, 9)
    with consumer_thread(url, outbox_kafka_bootstrap, [outbox_topic], group=group):
        wait_for(lambda: count(url, "consumer_queue") == 9, 60, "the consumer to store 9")
    [caught_up] = read_lag(outbox_kafka_bootstrap, [group])
    assert caught_up.error is None, caught_up.error
    assert caught_up.total == 0
    assert sum(p.end for p in caught_up.partitions) == 9
    assert {p.topic for p in caught_up.partitions} == {outbox_topic}

    produce_one_by_one(outbox_kafka_bootstrap, outbox_topic, 5, start=9)  # not consumed
    [behind] = read_lag(outbox_kafka_bootstrap, [group])
    assert behind.total == 5
    assert behind.topics() == {outbox_topic: 5}
    doc = lag_json([behind])[0]
    assert doc["group"] == group and doc["total"] == 5 and doc["error"] is None
    assert sum(p["lag"] for p in doc["partitions"]) == 5
    assert all(p["lag"] == p["end"] - p["committed"] for p in doc["partitions"])

    assert group in [g.group for g in read_lag(outbox_kafka_bootstrap)], "every group listed"


def test_an_unknown_group_has_no_partitions(outbox_kafka_bootstrap: str) -> None:
    [lag] = read_lag(outbox_kafka_bootstrap, ["no-such-group-here"])
    assert lag.partitions == () and lag.total == 0
