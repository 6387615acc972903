"""`--start` parsing and the positioning of a time start, with a fake consumer (no broker).

The broker-side behaviour is in tests/integration/test_consumer_start.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import OFFSET_END, OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from outbox.cli import build_parser, main
from outbox.core.errors import ConfigurationError
from outbox.kafka.start import (
    START_KEY,
    parse_start,
    split_start,
    subscribe_callbacks,
)


def test_parse_start_takes_the_two_words_and_times_with_an_offset() -> None:
    assert str(parse_start("earliest")) == "earliest"
    assert str(parse_start(" LATEST ")) == "latest"
    at = parse_start("2024-05-01T12:00:00+02:00")
    assert at.at == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert at.millis == int(datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp() * 1000)
    assert parse_start("2024-05-01T10:00:00Z") == at
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_start("2024-05-01T12:00:00")
    with pytest.raises(ValueError, match="expected earliest, latest or an ISO 8601 time"):
        parse_start("yesterday")
    for outside in ("9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"):
        with pytest.raises(ValueError, match="outside the range of times"):
            parse_start(outside)


def test_split_start_removes_the_key_and_sets_the_reset_policy() -> None:
    base = {"bootstrap.servers": "b:9092", "auto.offset.reset": "earliest"}
    assert split_start(base) == (base, None)
    settings, start = split_start({**base, START_KEY: "latest"})
    assert settings == {**base, "auto.offset.reset": "latest"} and str(start) == "latest"
    settings, start = split_start({**base, START_KEY: "2024-05-01T10:00:00Z"})
    assert START_KEY not in settings and settings["auto.offset.reset"] == "earliest"
    assert start is not None and start.at is not None
    with pytest.raises(ConfigurationError, match="--start: expected earliest"):
        split_start({**base, START_KEY: "soon"})


class FakeConsumer:
    """What the rebalance callbacks use of a confluent-kafka Consumer."""

    def __init__(self, committed: dict[int, int], times: dict[int, int]) -> None:
        self._committed = committed
        self._times = times
        self.looked_up: list[int] = []
        self.assigned: list[TopicPartition] | None = None
        self.fail_times = False
        self.committed_calls = 0

    def memberid(self) -> str:
        return "member-1"

    def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
        self.committed_calls += 1
        return [
            TopicPartition(p.topic, p.partition, self._committed.get(p.partition, OFFSET_INVALID))
            for p in partitions
        ]

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> Any:
        if self.fail_times:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        self.looked_up = [p.partition for p in partitions]
        return [TopicPartition(p.topic, p.partition, self._times[p.partition]) for p in partitions]

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = [TopicPartition("incremental", -1), *partitions]


def _assign(consumer: FakeConsumer, start: str | None, strategy: str = "range") -> None:
    settings = {"group.id": "g", "partition.assignment.strategy": strategy}
    callbacks = subscribe_callbacks(settings, None if start is None else parse_start(start))
    partitions = [TopicPartition("t", n, OFFSET_INVALID) for n in range(3)]
    callbacks["on_assign"](consumer, partitions)  # type: ignore[arg-type]


def test_a_time_positions_only_the_partitions_without_a_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    # Partition 0 has a commit; 1 has a record at the time (offset 7); 2 has none (-1).
    consumer = FakeConsumer(committed={0: 42}, times={1: 7, 2: -1})
    _assign(consumer, "2024-05-01T10:00:00Z")
    assert consumer.looked_up == [1, 2]
    assert consumer.assigned is not None
    assert [(p.partition, p.offset) for p in consumer.assigned] == [
        (0, 42),  # the committed offset
        (1, 7),
        (2, OFFSET_END),
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("joined consumer group g (member member-1, start 2024-05-01")
    assert "group g assigned t[0,1,2]" in messages
    assert any("t[2] has no committed offset; starts at the end" in m for m in messages)


def test_earliest_latest_and_a_failed_lookup_leave_the_assignment_to_librdkafka() -> None:
    for start in (None, "latest"):
        consumer = FakeConsumer(committed={}, times={})
        _assign(consumer, start)
        assert consumer.assigned is None and consumer.looked_up == []
    consumer = FakeConsumer(committed={}, times={})
    consumer.fail_times = True
    _assign(consumer, "2024-05-01T10:00:00Z")
    assert consumer.assigned is not None
    assert all(p.offset == OFFSET_INVALID for p in consumer.assigned), "auto.offset.reset decides"


def test_the_flag_defaults_to_its_variable_and_refuses_bad_values(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    required = ["consumer", "--topic", "t", "--group", "g"]
    assert build_parser().parse_args(required).start is None
    args = build_parser().parse_args([*required, "--start", "2024-05-01T12:00:00+02:00"])
    assert args.start == "2024-05-01T10:00:00+00:00"
    monkeypatch.setenv("OUTBOX_CONSUMER_START", "latest")
    assert build_parser().parse_args(required).start == "latest"
    monkeypatch.setenv("OUTBOX_CONSUMER_START", "tomorrow")
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(required)
    assert exit_info.value.code == 2
    assert "from OUTBOX_CONSUMER_START" in capsys.readouterr().err


def test_start_is_refused_with_the_postgres_log(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "consumer",
            "--database-url",
            "postgresql://nobody@127.0.0.1:1/none",
            "--transport",
            "postgres",
            "--log-url",
            "postgresql://nobody@127.0.0.1:1/none",
            "--topic",
            "t",
            "--group",
            "g",
            "--start",
            "latest",
        ]
    )
    assert code == 1
    assert "--start applies to Kafka only" in capsys.readouterr().err


def test_a_cooperative_group_gets_an_incremental_assignment() -> None:
    consumer = FakeConsumer(committed={}, times={0: 1, 1: 2, 2: 3})
    _assign(consumer, "2024-05-01T10:00:00Z", strategy="cooperative-sticky")
    assert consumer.assigned is not None and consumer.assigned[0].topic == "incremental"
    assert [p.offset for p in consumer.assigned[1:]] == [1, 2, 3]


def test_with_a_start_time_the_committed_offsets_are_read_once_for_both_uses() -> None:
    from outbox.kafka.continuity import Continuity

    continuity = Continuity()
    consumer = FakeConsumer(committed={0: 42}, times={1: 7, 2: -1})
    settings = {"group.id": "g", "partition.assignment.strategy": "range"}
    callbacks = subscribe_callbacks(settings, parse_start("2024-05-01T10:00:00Z"), continuity)
    partitions = [TopicPartition("t", n, OFFSET_INVALID) for n in range(3)]
    callbacks["on_assign"](consumer, partitions)  # type: ignore[arg-type]
    assert consumer.committed_calls == 1
    assert consumer.assigned is not None
    assert [(p.partition, p.offset) for p in consumer.assigned] == [
        (0, 42),
        (1, 7),
        (2, OFFSET_END),
    ]


def test_the_continuity_check_learns_where_each_assigned_partition_starts() -> None:
    from outbox.kafka.continuity import Continuity

    continuity = Continuity()
    consumer = FakeConsumer(committed={0: 42, 1: 7}, times={})
    callbacks = subscribe_callbacks({"group.id": "g"}, None, continuity)
    partitions = [TopicPartition("t", n, OFFSET_INVALID) for n in range(3)]
    callbacks["on_assign"](consumer, partitions)  # type: ignore[arg-type]

    class Rec:
        def __init__(self, partition: int, offset: int) -> None:
            self.p, self.o = partition, offset

        def topic(self) -> str:
            return "t"

        def partition(self) -> int:
            return self.p

        def offset(self) -> int:
            return self.o

    # 0 resumes at 42: 43 first is a jump; 1 at 7; 2 has no commit: whatever comes first.
    _, seek = continuity.admit([Rec(0, 43), Rec(1, 7), Rec(2, 100)])
    assert seek == {("t", 0): 42}
    callbacks["on_revoke"](consumer, partitions[:1])  # type: ignore[arg-type]
    kept, seek = continuity.admit([Rec(0, 500)])
    assert [r.o for r in kept] == [500] and seek == {}  # forgotten at revocation
