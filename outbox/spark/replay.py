"""`outbox spark replay`: re-inject a range of a topic into a service's inbox.

The range is given by offsets (`--from-offset` / `--to-offset`, each either N for every
partition or P:N for partition P; the end is exclusive) or by time (`--since` / `--until`, the
records whose timestamp is in [since, until)). It is read as a Spark batch job with the
`outbox_kafka` source and stored with the inbox insert of the Consumer daemon: a message still
in the inbox (pending, or processed within the dedup window) is skipped, and the counts say so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from outbox.core.errors import ConfigurationError
from outbox.core.topics import validate_topic
from outbox.spark.inbox import InboxTarget, StoreCounts, write_inbox
from outbox.spark.offsets import OffsetClient, parse_options
from outbox.spark.source import Position, kafka_options, load_kafka

#: Offsets of a replay bound: partition -> offset; the key None means every partition.
Bound = Mapping[int | None, int]
_OFFSET = re.compile(r"(?:(\d+):)?(\d+)")


def parse_offsets(values: Sequence[str], flag: str) -> dict[int | None, int]:
    """`N` (every partition) or `P:N` (partition P), each at most once."""
    result: dict[int | None, int] = {}
    for text in values:
        match = _OFFSET.fullmatch(text.strip())
        if match is None:
            raise ConfigurationError(
                f"{flag} {text!r} is not an offset: use N (every partition) or P:N (partition P)"
            )
        partition = int(match[1]) if match[1] is not None else None
        if partition in result:
            which = "every partition" if partition is None else f"partition {partition}"
            raise ConfigurationError(f"{flag} is given twice for {which}")
        result[partition] = int(match[2])
    return result


def parse_time(text: str | None, flag: str) -> datetime | None:
    """An ISO 8601 time; without a timezone it is UTC."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"{flag} {text!r} is not an ISO 8601 time (e.g. 2026-11-26T10:00:00+00:00)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ReplayConfig:
    """One replay: a topic range and the inbox it goes to; validated at construction."""

    database_url: str
    kafka_bootstrap: str
    topic: str
    schema: str = "outbox"
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    from_offsets: Bound = field(default_factory=dict)
    to_offsets: Bound = field(default_factory=dict)
    since: datetime | None = None
    until: datetime | None = None
    transaction_rows: int = 10_000

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        if not self.kafka_bootstrap:
            raise ConfigurationError("kafka bootstrap servers are not set (--kafka-bootstrap)")
        InboxTarget(self.database_url, self.schema, self.transaction_rows)
        by_offset = bool(self.from_offsets or self.to_offsets)
        by_time = self.since is not None or self.until is not None
        if by_offset and by_time:
            raise ConfigurationError(
                "give the range by offsets (--from-offset/--to-offset) or by time "
                "(--since/--until), not both"
            )
        if not by_offset and not by_time:
            raise ConfigurationError("give a range: --from-offset/--to-offset or --since/--until")
        for moment in (self.since, self.until):
            if moment is not None and moment.tzinfo is None:
                raise ConfigurationError(f"time {moment.isoformat()} has no timezone")
        if self.since and self.until and self.since >= self.until:
            raise ConfigurationError(
                f"--since {self.since.isoformat()} is not before --until {self.until.isoformat()}"
            )
        self._check_offset_order()

    def _check_offset_order(self) -> None:
        for partition in set(self.from_offsets) | set(self.to_offsets):
            start = _bound(self.from_offsets, partition)
            end = _bound(self.to_offsets, partition)
            if start is not None and end is not None and start > end:
                where = "every partition" if partition is None else f"partition {partition}"
                raise ConfigurationError(
                    f"--from-offset {start} is after --to-offset {end} for {where}"
                )

    @property
    def target(self) -> InboxTarget:
        return InboxTarget(self.database_url, self.schema, self.transaction_rows)

    def named_partitions(self) -> set[int]:
        """Partitions the offsets name one by one."""
        return {p for p in (*self.from_offsets, *self.to_offsets) if p is not None}


def _bound(bound: Bound, partition: int | None) -> int | None:
    value = bound.get(partition)
    return bound.get(None) if value is None else value


def source_options(config: ReplayConfig) -> dict[str, str]:
    """The source options of the replay, checked against the topic's partitions on Kafka."""
    base = kafka_options(
        config.kafka_bootstrap,
        [config.topic],
        kafka_config=config.kafka_config,
    )
    client = OffsetClient(parse_options(base))
    try:
        partitions = [p for _topic, p in client.partitions()]
    finally:
        client.close()
    missing = sorted(config.named_partitions() - set(partitions))
    if missing:
        raise ConfigurationError(
            f"topic {config.topic!r} has no partition {missing[0]} (it has {len(partitions)})"
        )
    every = None in config.from_offsets or None in config.to_offsets
    chosen = (
        partitions if every or not config.named_partitions() else sorted(config.named_partitions())
    )
    starting: Position = "earliest"
    ending: Position = "latest"
    if config.since is not None:
        starting = config.since
    if config.until is not None:
        ending = config.until
    if config.from_offsets:
        starting = _offsets(config.topic, config.from_offsets, chosen, default=-2)
    if config.to_offsets:
        ending = _offsets(config.topic, config.to_offsets, chosen, default=-1)
    return kafka_options(
        config.kafka_bootstrap,
        {config.topic: chosen},
        starting=starting,
        ending=ending,
        kafka_config=config.kafka_config,
    )


def _offsets(
    topic: str, bound: Bound, partitions: Sequence[int], default: int
) -> dict[str, dict[int, int]]:
    values = {}
    for p in partitions:
        value = _bound(bound, p)
        values[p] = default if value is None else value
    return {topic: values}


def replay(spark: SparkSession, config: ReplayConfig, options: Mapping[str, str]) -> StoreCounts:
    """Read the range (`options` from `source_options`) and store it in the inbox."""
    return write_inbox(load_kafka(spark, options), config.target)


def report(config: ReplayConfig, counts: StoreCounts) -> str:
    """The lines `outbox spark replay` prints."""
    return (
        f"replayed {config.topic} into schema {config.schema}\n"
        f"read      {counts.received}\n"
        f"inserted  {counts.stored}\n"
        f"skipped   {counts.skipped} (already in the inbox)\n"
    )


def run_replay(config: ReplayConfig, master: str | None) -> StoreCounts:
    """The whole job as `outbox spark replay` runs it: check, read, store; the counts.

    Checks the topic's partitions and the database before Spark starts. A session that
    already exists in this process is used and left running; one started here is stopped.
    """
    from outbox.postgres.connection import check_database, connect
    from outbox.spark.session import session_running, spark_session

    options = source_options(config)
    check_database(
        lambda: connect(config.database_url, timeout=10, application_name="outbox-spark"),
        config.schema,
    )
    existing = session_running()
    spark = spark_session(master, "outbox-spark-replay")
    try:
        return replay(spark, config, options)
    finally:
        if not existing:
            spark.stop()
