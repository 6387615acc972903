"""The `outbox_kafka` source against the real broker: exact contents, offsets, times, streams."""

from __future__ import annotations

import tempfile
import threading
import uuid
from typing import Any

import pytest

from outbox.core.errors import ConfigurationError, OutboxError
from outbox.spark.offsets import OffsetClient, parse_options

from .records import Batch, Sent, outbox_records, produce

pytestmark = pytest.mark.spark


def _rows(frame: Any) -> dict[tuple[int, int], tuple[Any, ...]]:
    """(partition, offset) -> (key, value, headers) of every row; fails on a duplicate."""
    rows: dict[tuple[int, int], tuple[Any, ...]] = {}
    for r in frame.collect():
        position = (r["partition"], r["offset"])
        assert position not in rows, f"row {position} read twice"
        headers = [(h["key"], bytes(h["value"])) for h in r["headers"] or []]
        key = bytes(r["key"]) if r["key"] is not None else None
        value = bytes(r["value"]) if r["value"] is not None else None
        rows[position] = (key, value, headers)
    return rows


def _expected(batch: Batch) -> dict[tuple[int, int], tuple[Any, ...]]:
    return {s.position: (s.key, s.value, s.headers) for s in batch.sent}


def _mixed_records() -> list[Sent]:
    """Outbox messages plus the awkward cases: no key, no value, no headers, binary headers."""
    records = outbox_records(1500)
    records += [
        Sent(key=None, value=b"no key", headers=[("h", b"\x00\xff")], message_id=None),
        Sent(key=b"k", value=None, headers=[], message_id=None),
        Sent(key=b"k", value=b"two headers", headers=[("a", b"1"), ("a", b"2")], message_id=None),
    ]
    return records + outbox_records(1500, start=1500)


def test_end_offsets_are_right_after_a_batched_produce(
    outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    batch = produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(3000))
    options = parse_options(
        {"kafka.bootstrap.servers": outbox_kafka_bootstrap, "subscribe": outbox_topic}
    )
    client = OffsetClient(options)
    try:
        tps = client.partitions()
        ends = client.latest(tps)
        hints = {tp: high for tp, (_low, high) in client.watermarks(tps).items()}
    finally:
        client.close()
    assert ends == {(outbox_topic, p): end for p, end in batch.ends().items()}
    assert all(hints[tp] <= ends[tp] for tp in tps)  # the broker's answer is a hint at most


def test_batch_read_gives_exactly_what_was_produced(
    spark: Any, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    from outbox.spark.source import COLUMNS, read_kafka

    batch = produce(outbox_kafka_bootstrap, outbox_topic, _mixed_records())
    frame = read_kafka(spark, outbox_kafka_bootstrap, [outbox_topic])

    assert tuple(frame.columns) == COLUMNS
    assert _rows(frame) == _expected(batch)
    assert frame.rdd.getNumPartitions() == 3  # one task per Kafka partition
    first = frame.where("offset = 0").limit(1).collect()[0]
    assert first["topic"] == outbox_topic
    assert first["timestampType"] == 0
    assert first["timestamp"] is not None


def test_batch_read_of_an_offset_range(
    spark: Any, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    from outbox.spark.source import read_kafka

    batch = produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(900))
    frame = read_kafka(
        spark,
        outbox_kafka_bootstrap,
        {outbox_topic: [1]},
        starting={outbox_topic: {1: 10}},
        ending={outbox_topic: {1: 25}},
    )
    expected = {s.position: (s.key, s.value, s.headers) for s in batch.sent if s.partition == 1}
    assert _rows(frame) == {pos: row for pos, row in expected.items() if 10 <= pos[1] < 25}


def test_batch_read_by_time_finds_the_first_record_at_or_after_each_time(
    spark: Any, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    from datetime import UTC, datetime

    from outbox.spark.source import read_kafka

    base = 1_800_000_000_000  # ms; three groups of records, a minute apart
    records = outbox_records(600)
    stamps = [base + (i // 200) * 60_000 + i for i in range(600)]
    batch = produce(outbox_kafka_bootstrap, outbox_topic, records, timestamps=stamps)

    since = datetime.fromtimestamp((base + 60_000) / 1000, UTC)
    until = datetime.fromtimestamp((base + 120_000) / 1000, UTC)
    frame = read_kafka(spark, outbox_kafka_bootstrap, [outbox_topic], starting=since, ending=until)

    middle = {s.position for s in batch.sent[200:400]}
    assert set(_rows(frame)) == middle


def test_stream_reads_everything_once_in_capped_batches_and_resumes(
    spark: Any, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    from outbox.spark.source import read_kafka

    first = produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(1500))
    seen: list[tuple[int, int]] = []
    sizes: list[int] = []
    lock = threading.Lock()

    def collect(frame: Any, _batch_id: int) -> None:
        rows = frame.select("partition", "offset").collect()
        with lock:
            seen.extend((r["partition"], r["offset"]) for r in rows)
            sizes.append(len(rows))

    checkpoint = tempfile.mkdtemp(prefix="outbox-source-")

    def run() -> None:
        frame = read_kafka(
            spark,
            outbox_kafka_bootstrap,
            [outbox_topic],
            streaming=True,
            max_offsets_per_trigger=500,
        )
        query = (
            frame.writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert not query.isActive
        assert query.exception() is None

    run()
    assert sorted(seen) == sorted(s.position for s in first.sent)
    assert len(sizes) >= 3 and max(sizes) <= 500 + 2  # rounding gives a partition at most +1

    second = produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(300, start=1500))
    seen.clear()
    run()  # from the checkpoint: only the new records
    assert sorted(seen) == sorted(s.position for s in second.sent)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "h:1"}, "exactly one of 'subscribe' or 'assign'"),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "assign": '{"t": [0]}'},
            "exactly one of",
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "{"}, "JSON"),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": '{"t": 3}'},
            'must look like {"topic": {"0": 42}}',
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "endingOffsets": "earliest"},
            "cannot",
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingTimestamp": "x"}, "milli"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"}, ">= 1"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "bad topic"}, "bad topic"),
    ],
)
def test_bad_source_options_are_refused_with_a_clear_message(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OutboxError) as raised:
        parse_options(options)
    assert message in str(raised.value)


def test_a_missing_topic_or_partition_is_named(
    outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    for options, message in [
        ({"subscribe": missing}, f"topic {missing!r} does not exist"),
        ({"assign": f'{{"{outbox_topic}": [7]}}'}, "has no partition 7"),
    ]:
        client = OffsetClient(
            parse_options({"kafka.bootstrap.servers": outbox_kafka_bootstrap, **options})
        )
        try:
            with pytest.raises(ConfigurationError) as raised:
                client.partitions()
        finally:
            client.close()
        assert message in str(raised.value)
