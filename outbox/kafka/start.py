"""Where a new consumer group starts reading, and the log lines of joins and rebalances.

`outbox consumer --start earliest|latest|<ISO 8601 time>` decides what a group reads from a
partition it has never committed an offset for; a partition with a committed offset always
resumes there, whatever `--start` says.

- `earliest` (the default): the oldest record the broker still keeps (`auto.offset.reset`).
- `latest`: only the records produced after the group joined (`auto.offset.reset=latest`).
- a time, e.g. `2024-05-01T12:00:00Z`: the first record whose timestamp is at or after it,
  found with `offsets_for_times` when the partition is assigned (`on_assign`); a partition with
  no record that recent starts at its end. The time must name its offset (`Z`, `+02:00`).

The start position travels from the command line to the subscriber inside the librdkafka
settings, under `START_KEY` (a key librdkafka does not know): `split_start` takes it out before
a client is made. `subscribe_callbacks` gives the `on_assign`/`on_revoke`/`on_lost` callbacks
of `Consumer.subscribe`: they log, at INFO, the group joined and each assignment and
revocation (the first with how long the join took: `JoinWatch` says what the consumer waits for
while it joins, at once and every `JoinWatch.EVERY` seconds until then), seek a time start,
and tell the subscriber's offset continuity check (outbox.kafka.continuity) where each assigned
partition starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from outbox.core.errors import ConfigurationError
from outbox.kafka.continuity import Continuity

__all__ = [
    "START_KEY",
    "JoinWatch",
    "StartPosition",
    "parse_start",
    "split_start",
    "subscribe_callbacks",
]

log = logging.getLogger("outbox.consumer")

#: The librdkafka-settings key that carries `--start` to the subscriber (removed before use).
START_KEY = "outbox.start"
#: Seconds the `on_assign` callback waits for committed offsets and for `offsets_for_times`.
LOOKUP_TIMEOUT = 10.0
#: What a partition without a committed offset reports as its committed offset.
_NO_OFFSET = -1001  # confluent_kafka.OFFSET_INVALID
#: The offsets of an assigned partition that mean "where the group committed" (OFFSET_INVALID,
#: OFFSET_STORED).
_RESUMES = (_NO_OFFSET, -1000)
#: librdkafka's default session.timeout.ms (CONFIGURATION.md, librdkafka 2.x).
SESSION_TIMEOUT_MS = 45000


class JoinWatch:
    """What a consumer waits for while it joins its group, said at INFO: once when it
    subscribes, then at most once every `EVERY` seconds until its first assignment, whose
    line says how long the join took. A join is not silent, however long the broker holds it.

    Thread-safety: the caller's polling thread only (librdkafka runs the rebalance callbacks
    inside `poll`)."""

    EVERY = 5.0

    def __init__(
        self, settings: Mapping[str, Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.group = str(settings.get("group.id", ""))
        try:
            self.session_timeout_ms = int(settings.get("session.timeout.ms", SESSION_TIMEOUT_MS))
        except (TypeError, ValueError):  # librdkafka refuses it when the client is made
            self.session_timeout_ms = SESSION_TIMEOUT_MS
        self._clock = clock
        self._began: float | None = None
        self._next = 0.0
        #: Seconds the join took; None until the first assignment.
        self.took: float | None = None

    def begin(self) -> None:
        """The consumer subscribed: say what it now waits for."""
        self._began = self._clock()
        self._next = self._began + self.EVERY
        log.info(
            "joining consumer group %s (waiting for its partition assignment: the group "
            "coordinator holds a join until the group's members have rejoined, for one gone "
            "without leaving up to its session.timeout.ms, %d ms for this consumer, and a new "
            "group for the broker's group.initial.rebalance.delay.ms)",
            self.group,
            self.session_timeout_ms,
        )

    def waiting(self) -> None:
        """Called on each poll: while no assignment came, a line every `EVERY` seconds."""
        if self._began is None or self.took is not None:
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.EVERY
        log.info(
            "still joining consumer group %s after %.0f s: no partition assigned yet "
            "(session.timeout.ms=%d)",
            self.group,
            now - self._began,
            self.session_timeout_ms,
        )

    def assigned(self) -> float | None:
        """The first assignment came: the seconds the join took (None after the first, or
        before `begin`)."""
        if self._began is None or self.took is not None:
            return None
        self.took = self._clock() - self._began
        return self.took


@dataclass(frozen=True, slots=True)
class StartPosition:
    """`earliest`, `latest`, or a time (`at`, timezone-aware)."""

    kind: str
    at: datetime | None = None

    def __str__(self) -> str:
        return self.at.isoformat() if self.at is not None else self.kind

    @property
    def millis(self) -> int:
        """The time as milliseconds since the epoch (what Kafka timestamps are)."""
        assert self.at is not None
        return int(self.at.timestamp() * 1000)


EARLIEST = StartPosition("earliest")
LATEST = StartPosition("latest")


def parse_start(text: str) -> StartPosition:
    """`earliest`, `latest` or an ISO 8601 time with its offset; ValueError otherwise."""
    word = text.strip().lower()
    if word == "earliest":
        return EARLIEST
    if word == "latest":
        return LATEST
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"expected earliest, latest or an ISO 8601 time such as 2024-05-01T12:00:00Z, "
            f"got {text!r}"
        ) from None
    if at.tzinfo is None:
        raise ValueError(
            f"the time {text!r} has no UTC offset: add one (Z for UTC, or e.g. +02:00) so that "
            "it names one instant"
        )
    try:
        return StartPosition("time", at.astimezone(UTC))
    except OverflowError:  # 9999-12-31T23:59:59-14:00, say: past the last UTC instant
        raise ValueError(
            f"the time {text!r} is outside the range of times (years 1 to 9999 in UTC)"
        ) from None


def split_start(config: Mapping[str, Any]) -> tuple[dict[str, Any], StartPosition | None]:
    """The librdkafka settings without `START_KEY`, and the start position it held (or None).

    `latest` and `earliest` become `auto.offset.reset`; a time leaves the reset policy as it is
    (it is used only for a partition whose timestamp lookup fails).
    """
    settings = dict(config)
    raw = settings.pop(START_KEY, None)
    if raw is None:
        return settings, None
    if isinstance(raw, StartPosition):
        start = raw
    else:
        try:
            start = parse_start(str(raw))
        except ValueError as exc:
            raise ConfigurationError(f"--start: {exc}") from None
    if start.at is None:
        settings["auto.offset.reset"] = start.kind
    return settings, start


def _names(partitions: Sequence[TopicPartition]) -> str:
    """`topic[0,1,2], other[0]`, or `nothing`."""
    by_topic: dict[str, list[int]] = {}
    for p in partitions:
        by_topic.setdefault(p.topic, []).append(p.partition)
    if not by_topic:
        return "nothing"
    return ", ".join(
        f"{topic}[{','.join(str(n) for n in sorted(numbers))}]"
        for topic, numbers in sorted(by_topic.items())
    )


class _Rebalance:
    """The state of the rebalance callbacks of one subscriber."""

    def __init__(
        self,
        group: str,
        start: StartPosition | None,
        *,
        cooperative: bool,
        continuity: Continuity | None = None,
        watch: JoinWatch | None = None,
    ) -> None:
        self.group = group
        self.start = start
        #: Incremental rebalancing (`cooperative-sticky`): `incremental_assign`, not `assign`.
        self.cooperative = cooperative
        self.joined = False
        #: Told where each assigned partition starts, and which partitions went.
        self.continuity = continuity
        #: Told of the first assignment.
        self.watch = watch

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not self.joined:
            self.joined = True
            log.info(
                "joined consumer group %s (member %s, start %s for partitions never committed)",
                self.group,
                _member_id(consumer),
                self.start or EARLIEST,
            )
        took = self.watch.assigned() if self.watch is not None else None
        if took is None:
            log.info("group %s assigned %s", self.group, _names(partitions))
        else:
            log.info(
                "group %s assigned %d partition%s after %.1f s: %s",
                self.group,
                len(partitions),
                "" if len(partitions) == 1 else "s",
                took,
                _names(partitions),
            )
        if self.start is None or self.start.at is None or not partitions:
            self._expect(consumer, partitions)
            return
        positioned = self._seek_time(consumer, partitions, self.start)
        self._expect(consumer, positioned)
        if self.cooperative:
            consumer.incremental_assign(positioned)
        else:
            consumer.assign(positioned)

    def _expect(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Tell `continuity` where each partition starts: its sought offset, else the offset
        the group committed (the one the client resumes from)."""
        if self.continuity is None or not partitions:
            return
        starts = {(p.topic, p.partition): p.offset for p in partitions}
        # Only a partition left to resume where the group committed needs the lookup; one sent
        # to its beginning or end by `--start` has no known first offset (whatever comes first).
        unknown = [TopicPartition(p.topic, p.partition) for p in partitions if p.offset in _RESUMES]
        if unknown:
            try:
                for c in consumer.committed(unknown, timeout=LOOKUP_TIMEOUT):
                    if c.error is None:
                        starts[c.topic, c.partition] = c.offset
            except KafkaException as exc:
                log.warning(
                    "group %s: cannot read committed offsets (%s); the first records of %s "
                    "are not checked for a skipped offset",
                    self.group,
                    exc,
                    _names(unknown),
                )
        for partition, offset in starts.items():
            self.continuity.start(partition, offset)

    def _seek_time(
        self, consumer: Consumer, partitions: list[TopicPartition], start: StartPosition
    ) -> list[TopicPartition]:
        """`partitions`, those without a committed offset set to the first record at `start`."""
        try:
            committed = consumer.committed(
                [TopicPartition(p.topic, p.partition) for p in partitions],
                timeout=LOOKUP_TIMEOUT,
            )
        except KafkaException as exc:
            log.warning(
                "group %s: cannot read committed offsets (%s); partitions start by "
                "auto.offset.reset",
                self.group,
                exc,
            )
            return partitions
        # A partition the group committed is assigned at its committed offset (where the
        # client would resume anyway), so that `_expect` need not ask for it a second time.
        known = {
            (c.topic, c.partition): c.offset for c in committed if c.error is None and c.offset >= 0
        }
        fresh = [
            TopicPartition(c.topic, c.partition, start.millis)
            for c in committed
            if c.offset < 0 and c.error is None
        ]
        if not fresh:
            return _at(partitions, known)
        try:
            found = consumer.offsets_for_times(fresh, timeout=LOOKUP_TIMEOUT)
        except KafkaException as exc:
            log.warning(
                "group %s: cannot find the offsets at %s (%s); partitions start by "
                "auto.offset.reset",
                self.group,
                start,
                exc,
            )
            return partitions
        offsets = {
            (f.topic, f.partition): (f.offset if f.offset >= 0 else OFFSET_END)
            for f in found
            if f.error is None
        }
        for (topic, partition), offset in sorted(offsets.items()):
            log.info(
                "group %s: %s[%d] has no committed offset; starts at %s (first record at or "
                "after %s)",
                self.group,
                topic,
                partition,
                "the end" if offset == OFFSET_END else f"offset {offset}",
                start,
            )
        return _at(partitions, {**known, **offsets})

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        del consumer
        log.info("group %s revoked %s", self.group, _names(partitions))
        self._forget(partitions)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        del consumer
        self._forget(partitions)
        log.warning(
            "group %s lost %s (the session expired; another member may have them)",
            self.group,
            _names(partitions),
        )

    def _forget(self, partitions: list[TopicPartition]) -> None:
        if self.continuity is not None:
            self.continuity.forget((p.topic, p.partition) for p in partitions)


def _at(
    partitions: list[TopicPartition], offsets: dict[tuple[str, int], int]
) -> list[TopicPartition]:
    """`partitions`, each at its offset in `offsets` where it has one."""
    return [
        TopicPartition(p.topic, p.partition, offsets.get((p.topic, p.partition), p.offset))
        for p in partitions
    ]


def _member_id(consumer: Consumer) -> str:
    try:
        return consumer.memberid() or "?"
    except (KafkaException, RuntimeError):
        return "?"


def subscribe_callbacks(
    settings: Mapping[str, Any],
    start: StartPosition | None,
    continuity: Continuity | None = None,
    watch: JoinWatch | None = None,
) -> dict[str, Callable[[Consumer, list[TopicPartition]], None]]:
    """The `on_assign`, `on_revoke` and `on_lost` keyword arguments of `Consumer.subscribe`
    for a consumer of these librdkafka `settings` (its group, its assignment strategy); they
    keep `continuity` told of each partition's start and departure, and `watch` of the first
    assignment."""
    strategy = str(settings.get("partition.assignment.strategy", ""))
    rebalance = _Rebalance(
        str(settings.get("group.id", "")),
        start,
        cooperative="cooperative" in strategy,
        continuity=continuity,
        watch=watch,
    )
    return {
        "on_assign": rebalance.on_assign,
        "on_revoke": rebalance.on_revoke,
        "on_lost": rebalance.on_lost,
    }
