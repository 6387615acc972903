"""The Spark source's range reader against a scripted client: a jump in the offsets is read
again from the missing offset, and a record delivered twice is kept once."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, TopicPartition

pytest.importorskip("pyspark")

from outbox.spark import source
from outbox.spark.offsets import parse_options


class Msg:
    def __init__(self, offset: int, eof: bool = False) -> None:
        self._offset, self._eof = offset, eof

    def error(self) -> Any:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def offset(self) -> int:
        return self._offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1_700_000_000_000

    def headers(self) -> None:
        return None


class ScriptedConsumer:
    """Answers `consume` from a script keyed by the position it was assigned or sought to."""

    script: ClassVar[dict[int, list[list[Msg]]]] = {}
    seeks: ClassVar[list[int]] = []

    def __init__(self, config: Any) -> None:
        self.answers: list[list[Msg]] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.answers = list(self.script[partitions[0].offset])

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append(partition.offset)
        self.answers = list(self.script[partition.offset])

    def consume(self, n: int, timeout: float) -> list[Msg]:
        return self.answers.pop(0) if self.answers else []

    def close(self) -> None:
        pass


def read(monkeypatch: pytest.MonkeyPatch, script: dict[int, list[list[Msg]]]) -> list[int]:
    ScriptedConsumer.script, ScriptedConsumer.seeks = script, []
    monkeypatch.setattr(source, "Consumer", ScriptedConsumer)
    options = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    batches = list(source.read_range(options, source.KafkaRange("t", 0, 10, 14)))
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_a_jump_is_read_again_from_the_missing_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    script = {
        # offset 12 not readable yet: the broker hands out 13, then says the partition ends
        10: [[Msg(10), Msg(11), Msg(13), Msg(14, eof=True)]],
        12: [[Msg(12), Msg(13), Msg(14, eof=True)]],
    }
    assert read(monkeypatch, script) == [10, 11, 12, 13]
    assert ScriptedConsumer.seeks == [12]


def test_a_record_delivered_twice_is_kept_once(monkeypatch: pytest.MonkeyPatch) -> None:
    script = {10: [[Msg(10), Msg(11), Msg(11)], [Msg(12), Msg(13), Msg(14, eof=True)]]}
    assert read(monkeypatch, script) == [10, 11, 12, 13]


def test_a_hole_read_three_times_is_the_logs_own(monkeypatch: pytest.MonkeyPatch) -> None:
    script = {10: [[Msg(10), Msg(11)], [Msg(13), Msg(14, eof=True)]], 12: [[Msg(13)]]}
    assert read(monkeypatch, script) == [10, 11, 13]
    assert ScriptedConsumer.seeks == [12, 12]


def test_a_record_delivered_twice_before_a_jump(monkeypatch: pytest.MonkeyPatch) -> None:
    script = {
        10: [[Msg(10), Msg(10), Msg(11), Msg(13), Msg(14, eof=True)]],
        12: [[Msg(12), Msg(13), Msg(14, eof=True)]],
    }
    assert read(monkeypatch, script) == [10, 11, 12, 13]
    assert ScriptedConsumer.seeks == [12]
