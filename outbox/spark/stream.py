"""`outbox spark consumer`: a Structured Streaming job, Kafka topics -> a service's inbox.

Each micro-batch is stored by `outbox.spark.inbox.write_inbox` (idempotent on the message id,
then the Handler's NOTIFY), on the executors. Kafka offsets live in the checkpoint only: no
consumer group is joined and nothing is committed to Kafka. A batch that ran (wholly or in
part) before a crash runs again after the restart, and its rows meet the unique message id.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from outbox.core.errors import ConfigurationError
from outbox.core.numbers import check_fields
from outbox.core.topics import validate_topic
from outbox.postgres.connection import check_database, connect
from outbox.spark.inbox import InboxTarget, StoreCounts, write_inbox
from outbox.spark.offsets import OffsetClient, parse_options
from outbox.spark.source import Position, kafka_options, read_kafka

log = logging.getLogger("outbox.spark.consumer")


@dataclass(frozen=True)
class StreamConfig:
    """Settings of one `outbox spark consumer` job; validated at construction."""

    database_url: str
    kafka_bootstrap: str
    topics: Sequence[str]
    checkpoint: str
    schema: str = "outbox"
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    #: Seconds between micro-batch starts; 0 starts the next as soon as one ends.
    trigger_interval: float = 1.0
    #: Read what is there at start (in batches of max_offsets_per_trigger), then stop.
    available_now: bool = False
    max_offsets_per_trigger: int | None = None
    #: Where a new checkpoint starts: earliest, latest, or group:NAME (the offsets a consumer
    #: group committed, e.g. the Consumer daemon's, to take over from it).
    starting_offsets: str = "earliest"
    #: "python" (the outbox_kafka source) or "kafka" (Spark's JVM connector).
    connector: str = "python"
    transaction_rows: int = 10_000

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ConfigurationError("a checkpoint location is required (--checkpoint)")
        if not self.topics:
            raise ConfigurationError("at least one --topic is required")
        for topic in self.topics:
            validate_topic(topic)
        check_fields(
            self,
            {
                "trigger_interval": "seconds_or_zero",
                "max_offsets_per_trigger": "count",
                "transaction_rows": "count",
            },
            optional=("max_offsets_per_trigger",),
        )
        if self.starting_offsets not in ("earliest", "latest") and not self.takeover_group:
            raise ConfigurationError(
                "starting offsets must be earliest, latest or group:NAME, got "
                f"{self.starting_offsets!r}"
            )
        if self.connector not in ("python", "kafka"):
            raise ConfigurationError(
                f"connector must be 'python' or 'kafka', got {self.connector!r}"
            )
        self.target  # noqa: B018 - validates the database URL, schema, transaction size
        self.source_options()

    @property
    def takeover_group(self) -> str | None:
        """The consumer group whose committed offsets a new checkpoint starts from, if any."""
        prefix, sep, group = self.starting_offsets.partition(":")
        return group.strip() or None if sep and prefix == "group" else None

    @property
    def target(self) -> InboxTarget:
        return InboxTarget(self.database_url, self.schema, self.transaction_rows)

    def source_options(self) -> dict[str, str]:
        """The Kafka source's options (also checks them)."""
        if not self.kafka_bootstrap:
            raise ConfigurationError("kafka bootstrap servers are not set (--kafka-bootstrap)")
        return kafka_options(
            self.kafka_bootstrap,
            list(self.topics),
            starting="earliest" if self.takeover_group else self.starting_offsets,
            ending=None,
            max_offsets_per_trigger=self.max_offsets_per_trigger,
            kafka_config=self.kafka_config,
        )


def check(config: StreamConfig) -> None:
    """Fail fast, with one clear error: database unreachable or not migrated, topic missing."""
    check_database(
        lambda: connect(config.database_url, timeout=10, application_name="outbox-spark"),
        config.schema,
    )
    client = OffsetClient(parse_options(config.source_options()))
    try:
        client.partitions()
    finally:
        client.close()


def starting_position(config: StreamConfig) -> Position:
    """Where a new checkpoint starts; a takeover group's offsets are looked up now."""
    group = config.takeover_group
    if group is None:
        return config.starting_offsets
    client = OffsetClient(parse_options(config.source_options()))
    try:
        offsets = client.committed(group, client.partitions())
    finally:
        client.close()
    log.info("a new checkpoint starts where group %r committed: %s", group, offsets)
    result: dict[str, dict[int, int]] = {}
    for (topic, partition), offset in offsets.items():
        result.setdefault(topic, {})[partition] = offset
    return result


class InboxStream:
    """The streaming job in this process: start it, watch its counts, stop it."""

    def __init__(self, spark: SparkSession, config: StreamConfig) -> None:
        self.spark = spark
        self.config = config
        self.query: StreamingQuery | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: Totals since start, and how many micro-batches were stored.
        self.counts = StoreCounts()
        self.batches = 0

    def start(self) -> StreamingQuery:
        """Start the query (from its checkpoint, if there is one)."""
        config = self.config
        frame = read_kafka(
            self.spark,
            config.kafka_bootstrap,
            list(config.topics),
            starting=starting_position(config),
            streaming=True,
            max_offsets_per_trigger=config.max_offsets_per_trigger,
            kafka_config=config.kafka_config,
            connector=config.connector,
        )
        writer = (
            frame.writeStream.queryName(f"outbox-inbox-{config.schema}")
            .foreachBatch(self._store)
            .option("checkpointLocation", config.checkpoint)
        )
        if config.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            interval = f"{int(config.trigger_interval * 1000)} milliseconds"
            writer = writer.trigger(processingTime=interval)
        self.query = writer.start()
        return self.query

    def _store(self, frame: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        counts = write_inbox(frame, self.config.target)
        with self._lock:
            self.counts += counts
            self.batches += 1
        log.info(
            "batch %d: received=%d stored=%d in %.2fs",
            batch_id,
            counts.received,
            counts.stored,
            time.monotonic() - started,
        )

    def request_stop(self) -> None:
        """Ask `run` to stop after the micro-batch in hand (safe from a signal handler)."""
        self._stop.set()

    def stop(self, grace: float = 30.0) -> None:
        """Stop the query, letting the micro-batch in hand finish for up to `grace` seconds."""
        query = self.query
        if query is None or not query.isActive:
            return
        deadline = time.monotonic() + grace
        while query.isActive and _trigger_active(query) and time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()

    def run(self) -> None:
        """Start, and wait until the query ends (available-now) or `request_stop()`."""
        query = self.start()
        try:
            while not self._stop.is_set():
                if query.awaitTermination(1):
                    break
        finally:
            self.stop()
        error = query.exception()
        if error is not None:
            raise error
        log.info(
            "spark consumer stopped: batches=%d received=%d stored=%d",
            self.batches,
            self.counts.received,
            self.counts.stored,
        )


def _trigger_active(query: StreamingQuery) -> bool:
    status: dict[str, Any] = query.status
    return bool(status.get("isTriggerActive"))


def run_stream(
    config: StreamConfig, master: str | None, *, stop_on_signals: bool = False
) -> StoreCounts:
    """The whole job as `outbox spark consumer` runs it: check, stream until stopped; totals.

    With `stop_on_signals`, SIGTERM and SIGINT stop it after the micro-batch in hand. A session
    that already exists in this process is used and left running; one started here is stopped.
    """
    from outbox.spark.session import session_running, spark_session

    check(config)
    existing = session_running()
    spark = spark_session(master, "outbox-spark-consumer")
    job = InboxStream(spark, config)
    if stop_on_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda _signum, _frame: job.request_stop())
    try:
        job.run()
    finally:
        if not existing:
            spark.stop()
    return job.counts
