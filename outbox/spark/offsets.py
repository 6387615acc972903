"""Kafka offsets for the Spark source: option parsing and offset resolution (no pyspark here).

Offsets are JSON the way Spark's own Kafka connector writes them, `{"topic": {"0": 42}}`, with
-2 for earliest and -1 for latest in the options. End offsets are exclusive.

**End offsets are verified, not trusted.** A broker's ListOffsets(latest) answer is taken as a
hint (the local Tansu broker answers the base offset of the last batch + 1 after a batched
produce). A consumer is assigned at the hint of each partition and waits for the first fetch
response: its high watermark (or, where a broker sends none, the partition-EOF position and the
last record read) gives the end. On a correct broker the fetch at the hint returns no record
and the end is the hint; on one that understates it, the fetch returns the records past the
hint and the end moves up to the real one. An overstated hint is kept: reading stops at a
partition EOF at or past the end, so a gap at the end (transaction markers) is not waited for.

**Times are verified too.** `offsets_for_times` gives, per partition, the earliest offset whose
timestamp is >= the time; the answer is taken as a lower bound (Tansu answers per batch) and
refined by reading forward to the first record whose timestamp is >= the time. No such record:
the end offset.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from outbox.core.errors import ConfigurationError, KafkaUnavailable
from outbox.core.topics import validate_topic
from outbox.kafka.publisher import client

log = logging.getLogger("outbox.spark.source")

#: A Kafka partition: (topic, partition number).
TP = tuple[str, int]
#: Offsets in the JSON/checkpoint shape: {"topic": {"0": 42}}.
OffsetsJson = dict[str, dict[str, int]]

EARLIEST = -2
LATEST = -1

#: librdkafka settings of every client of the source; user `kafka.*` options go over them.
CLIENT_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    # Brokers that answer an empty fetch only at this deadline (Tansu) would add it to every probe.
    "fetch.wait.max.ms": 25,
    "log_level": 3,
}


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends: earliest, latest, given offsets, or a time.

    kind "offsets": `values` maps partitions to offsets (-2 earliest, -1 latest);
    kind "times": `values` maps partitions to times (ms since the epoch);
    kind "time": every partition at `time_ms`.
    Partitions a spec does not name take the default of its side (earliest for a start,
    latest for an end).
    """

    kind: str
    values: Mapping[TP, int] = field(default_factory=dict)
    time_ms: int | None = None


@dataclass(frozen=True)
class SourceOptions:
    """The options of the `outbox_kafka` source, parsed and validated."""

    kafka_config: Mapping[str, str]
    subscribe: tuple[str, ...]
    assign: Mapping[str, tuple[int, ...]]
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    poll_timeout: float
    probe_timeout: float

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic read, subscribed or assigned."""
        return self.subscribe or tuple(self.assign)

    @property
    def bootstrap(self) -> str:
        return self.kafka_config["bootstrap.servers"]

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings of a reading client (never in a consumer group)."""
        return {
            **CLIENT_DEFAULTS,
            "group.id": f"outbox-spark-{uuid.uuid4().hex[:12]}",
            **self.kafka_config,
        }


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the source's options (names as Spark's Kafka connector spells them)."""
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    kafka_config = {k[len("kafka.") :]: v for k, v in lowered.items() if k.startswith("kafka.")}
    if "bootstrap" in lowered:
        kafka_config.setdefault("bootstrap.servers", lowered["bootstrap"])
    if not kafka_config.get("bootstrap.servers"):
        raise ConfigurationError("the Kafka source needs option kafka.bootstrap.servers")
    subscribe = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
    assign = _parse_assign(lowered.get("assign"))
    if bool(subscribe) == bool(assign):
        raise ConfigurationError("the Kafka source needs exactly one of 'subscribe' or 'assign'")
    for topic in subscribe:
        validate_topic(topic)
    return SourceOptions(
        kafka_config=kafka_config,
        subscribe=subscribe,
        assign=assign,
        starting=_side(lowered, "starting", "earliest"),
        ending=_side(lowered, "ending", "latest"),
        max_offsets_per_trigger=_positive(lowered, "maxoffsetspertrigger"),
        poll_timeout=(_positive(lowered, "polltimeoutms") or 120_000) / 1000,
        probe_timeout=(_positive(lowered, "probetimeoutms") or 10_000) / 1000,
    )


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"option {name} must be an integer, got {text!r}") from None
    if value < 1:
        raise ConfigurationError(f"option {name} must be >= 1, got {value}")
    return value


def _parse_assign(text: str | None) -> dict[str, tuple[int, ...]]:
    if not text:
        return {}
    parsed = _json(text, "assign")
    if not isinstance(parsed, dict) or not all(
        isinstance(v, list) and all(isinstance(p, int) and p >= 0 for p in v)
        for v in parsed.values()
    ):
        raise ConfigurationError(f'option assign must look like {{"topic": [0, 1]}}, got {text}')
    for topic in parsed:
        validate_topic(topic)
    return {topic: tuple(sorted(set(parts))) for topic, parts in parsed.items()}


def _json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigurationError(f"option {name} is not valid JSON: {text!r}") from None


def _side(options: Mapping[str, str], side: str, default: str) -> OffsetSpec:
    """startingTimestamp > startingOffsetsByTimestamp > startingOffsets (Spark's order)."""
    if options.get(f"{side}timestamp"):
        text = options[f"{side}timestamp"]
        try:
            return OffsetSpec("time", time_ms=int(text))
        except ValueError:
            raise ConfigurationError(
                f"option {side}Timestamp must be milliseconds since the epoch, got {text!r}"
            ) from None
    if options.get(f"{side}offsetsbytimestamp"):
        name = f"{side}OffsetsByTimestamp"
        return OffsetSpec("times", _partition_map(options[f"{side}offsetsbytimestamp"], name, 0))
    text = options.get(f"{side}offsets", default).strip()
    if text.lower() in ("earliest", "latest"):
        if side == "ending" and text.lower() == "earliest":
            raise ConfigurationError("option endingOffsets cannot be 'earliest'")
        return OffsetSpec(text.lower())
    return OffsetSpec("offsets", _partition_map(text, f"{side}Offsets", EARLIEST))


def _partition_map(text: str, name: str, minimum: int) -> dict[TP, int]:
    parsed = _json(text, name)
    shape = f'option {name} must look like {{"topic": {{"0": 42}}}}, got {text}'
    if not isinstance(parsed, dict):
        raise ConfigurationError(shape)
    result: dict[TP, int] = {}
    for topic, partitions in parsed.items():
        validate_topic(topic)
        if not isinstance(partitions, dict):
            raise ConfigurationError(shape)
        for partition, value in partitions.items():
            if not str(partition).isdigit() or not isinstance(value, int) or value < minimum:
                raise ConfigurationError(shape)
            result[(topic, int(partition))] = value
    return result


def to_json(offsets: Mapping[TP, int]) -> OffsetsJson:
    """The checkpoint form of offsets."""
    result: OffsetsJson = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_json(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    """Invert `to_json`."""
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in (offsets or {}).items()
        for partition, offset in partitions.items()
    }


def to_millis(moment: datetime | int) -> int:
    """Milliseconds since the epoch of a timezone-aware datetime (or of an int, unchanged)."""
    if isinstance(moment, int):
        return moment
    if moment.tzinfo is None:
        raise ConfigurationError(f"time {moment.isoformat()} has no timezone")
    return int(moment.timestamp() * 1000)


class OffsetClient:
    """Driver-side Kafka look-ups of the source: partitions, earliest, verified latest, times."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        try:
            self._consumer = client(Consumer, options.client_config())
        except KafkaException as exc:
            raise ConfigurationError(f"bad Kafka setting for the source: {exc}") from None

    def close(self) -> None:
        """Close the Kafka client."""
        self._consumer.close()

    def partitions(self) -> list[TP]:
        """The partitions read: every partition of each subscribed topic, or those assigned."""
        found: list[TP] = []
        for topic in self.options.topics:
            known = self._topic_partitions(topic)
            wanted = self.options.assign.get(topic)
            if wanted is None:
                found.extend((topic, p) for p in known)
                continue
            missing = sorted(set(wanted) - set(known))
            if missing:
                raise ConfigurationError(
                    f"topic {topic!r} has no partition {missing[0]} (it has {len(known)})"
                )
            found.extend((topic, p) for p in wanted)
        return found

    def _topic_partitions(self, topic: str) -> list[int]:
        timeout = self.options.probe_timeout
        try:
            metadata = self._consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"no Kafka broker answered at {self.options.bootstrap} within {timeout:g}s: {exc}"
            ) from None
        entry = metadata.topics.get(topic)
        if entry is None or entry.error is not None or not entry.partitions:
            raise ConfigurationError(f"topic {topic!r} does not exist on {self.options.bootstrap}")
        return sorted(entry.partitions)

    def watermarks(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        """(low, high) as the broker answers ListOffsets; the high one is only a hint."""
        result = {}
        for topic, partition in tps:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self.options.probe_timeout, cached=False
            )
            result[(topic, partition)] = (max(low, 0), max(high, 0))
        return result

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """The first offset still present in each partition."""
        return {tp: low for tp, (low, _high) in self.watermarks(tps).items()}

    def latest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Verified end offsets (exclusive): see the module docstring."""
        hints = {tp: high for tp, (_low, high) in self.watermarks(tps).items()}
        if not hints:
            return {}
        ends = dict(hints)
        pending = set(hints)
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in hints.items()])
        deadline = time.monotonic() + self.options.probe_timeout
        try:
            while pending and time.monotonic() < deadline:
                message = self._consumer.poll(0.1)
                if message is None:
                    continue
                kind = kind_of(message)
                tp = (message.topic() or "", message.partition() or 0)
                if kind == SKIP or tp not in pending:
                    continue
                if kind == EOF:
                    ends[tp] = max(ends[tp], message.offset() or 0)
                    pending.discard(tp)
                    continue
                ends[tp] = max(ends[tp], (message.offset() or 0) + 1, self._fetched_high(tp))
                pending.discard(tp)
        finally:
            self._consumer.unassign()
        if pending:
            log.warning(
                "no fetch answer within %.1fs for %s; using the broker's latest offset",
                self.options.probe_timeout,
                sorted(pending),
            )
        return ends

    def _fetched_high(self, tp: TP) -> int:
        """The high watermark of the last fetch response of a partition (-1 if none)."""
        _low, high = self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
        return high if high is not None and high >= 0 else -1

    def for_times(self, times: Mapping[TP, int], ends: Mapping[TP, int]) -> dict[TP, int]:
        """Per partition, the first offset whose record timestamp is >= the time, or the end."""
        query = [TopicPartition(t, p, ms) for (t, p), ms in times.items()]
        if not query:
            return {}
        answers = self._consumer.offsets_for_times(query, timeout=self.options.probe_timeout)
        hints: dict[TP, int] = {}
        for answer in answers:
            tp = (answer.topic, answer.partition)
            if answer.error is not None:
                raise KafkaUnavailable(f"offsets_for_times failed for {tp}: {answer.error}")
            hint = answer.offset
            hints[tp] = ends[tp] if hint is None or hint < 0 else min(hint, ends[tp])
        return self._refine_times(times, hints, ends)

    def _refine_times(
        self, times: Mapping[TP, int], hints: Mapping[TP, int], ends: Mapping[TP, int]
    ) -> dict[TP, int]:
        """Read forward from each hint to the first record at or after its time."""
        result = dict(hints)
        pending = {tp for tp, hint in hints.items() if hint < ends[tp]}
        if not pending:
            return result
        self._consumer.assign([TopicPartition(t, p, hints[(t, p)]) for t, p in pending])
        deadline = time.monotonic() + self.options.poll_timeout
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(
                        f"could not read {sorted(pending)} within {self.options.poll_timeout:g}s"
                    )
                for message in self._consumer.consume(500, 0.1):
                    kind = kind_of(message)
                    tp = (message.topic() or "", message.partition() or 0)
                    if kind == SKIP or tp not in pending:
                        continue
                    offset = message.offset() or 0
                    if kind == EOF or offset >= ends[tp]:
                        result[tp] = ends[tp]
                        pending.discard(tp)
                    elif _timestamp_ms(message) >= times[tp]:
                        result[tp] = offset
                        pending.discard(tp)
        finally:
            self._consumer.unassign()
        return result

    def committed(self, group: str, tps: Sequence[TP]) -> dict[TP, int]:
        """The offsets a consumer group committed (earliest where it committed none).

        Asks as a member would, without joining the group: its members are not disturbed.
        """
        config = {**self.options.client_config(), "group.id": group}
        consumer = client(Consumer, config)
        try:
            answers = consumer.committed(
                [TopicPartition(t, p) for t, p in tps], timeout=self.options.probe_timeout
            )
        except KafkaException as exc:
            raise KafkaUnavailable(f"cannot read the offsets of group {group!r}: {exc}") from None
        finally:
            consumer.close()
        lows = self.earliest(tps)
        result = {}
        for answer in answers:
            tp = (answer.topic, answer.partition)
            offset = answer.offset
            result[tp] = offset if offset is not None and offset >= 0 else lows[tp]
        return result

    def resolve(self, spec: OffsetSpec, tps: Sequence[TP], *, start: bool) -> dict[TP, int]:
        """Offsets of `tps` for one side of a read (start or end), each in [earliest, end]."""
        ends = self.latest(tps)
        lows = self.earliest(tps)
        default = lows if start else ends
        if spec.kind == "earliest":
            return {tp: lows[tp] for tp in tps}
        if spec.kind == "latest":
            return {tp: ends[tp] for tp in tps}
        if spec.kind == "offsets":
            _check_named(spec.values, tps)
            result = {}
            for tp in tps:
                value = spec.values.get(tp)
                if value is None:
                    result[tp] = default[tp]
                elif value == EARLIEST:
                    result[tp] = lows[tp]
                elif value == LATEST:
                    result[tp] = ends[tp]
                else:
                    result[tp] = min(max(value, lows[tp]), ends[tp])
            return result
        if spec.kind == "time":
            assert spec.time_ms is not None
            return self.for_times({tp: spec.time_ms for tp in tps}, ends)
        _check_named(spec.values, tps)
        found = self.for_times({tp: ms for tp, ms in spec.values.items() if tp in tps}, ends)
        return {tp: found.get(tp, default[tp]) for tp in tps}


def _check_named(values: Mapping[TP, int], tps: Sequence[TP]) -> None:
    unknown = sorted(set(values) - set(tps))
    if unknown:
        topic, partition = unknown[0]
        raise ConfigurationError(f"offsets name partition {partition} of {topic!r}, not read")


RECORD, EOF, SKIP = "record", "eof", "skip"


def kind_of(message: Message) -> str:
    """RECORD, EOF (end of a partition for now), or SKIP (a transient error, logged).

    A fatal error raises.
    """
    error = message.error()
    if error is None:
        return RECORD
    if error.code() == KafkaError._PARTITION_EOF:
        return EOF
    if error.fatal():
        raise KafkaException(error)
    log.warning("kafka: %s", error.str())
    return SKIP


def _timestamp_ms(message: Message) -> int:
    _kind, millis = message.timestamp()
    return int(millis)
