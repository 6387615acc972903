"""A Kafka source for PySpark 4 (Python Data Source API, confluent-kafka inside): `outbox_kafka`.

    spark.dataSource.register(KafkaDataSource)          # or outbox.spark.session.spark_session()
    df = (spark.read.format("outbox_kafka")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "orders.created")
          .load())
    # or: read_kafka(spark, "127.0.0.1:9092", ["orders.created"])

Columns, as Spark's own Kafka connector with `includeHeaders=true` (same names, types, order):

    key binary, value binary, topic string, partition int, offset bigint,
    timestamp timestamp, timestampType int (0 create time, 1 log-append time, -1 none),
    headers array<struct<key:string,value:binary>> (null when a record has none)

The outbox message id and created time are the headers `outbox-message-id` and
`outbox-created-at` (UTF-8 text); `content-type` is there too.

Options (names as Spark's Kafka connector spells them, so one options dict serves both):

- `kafka.bootstrap.servers` (required); any other `kafka.<name>` is passed to librdkafka
  (`kafka.security.protocol`, `kafka.sasl.mechanism`, ...).
- `subscribe`: comma-separated topics (all their partitions), or `assign`: JSON
  `{"topic": [0, 2]}` (only those partitions). Exactly one of them.
- `startingOffsets`: `earliest` (default), `latest`, or JSON `{"topic": {"0": 42}}` with -2 for
  earliest and -1 for latest; unnamed partitions start at earliest.
- `endingOffsets` (batch only): `latest` (default) or JSON as above (exclusive; -1 latest);
  unnamed partitions end at latest.
- `startingTimestamp` / `endingTimestamp`: milliseconds since the epoch, every partition: the
  first offset whose record timestamp is >= it (the end offset if there is none).
  `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp`: the same per partition, as JSON
  `{"topic": {"0": 1700000000000}}`. A timestamp option wins over the offsets option.
- `maxOffsetsPerTrigger` (streaming): at most this many offsets per micro-batch, shared among
  partitions in proportion to their backlog (ignored by Trigger.AvailableNow's last batch rule:
  the batches still stop at the offsets found when the query started).
- `pollTimeoutMs` (default 120000): a read task that gets no record for this long fails.
- `probeTimeoutMs` (default 10000): metadata and end-offset look-ups wait this long.

One input partition (one Spark task) per Kafka partition and offset range. Streaming offsets
live in Spark's checkpoint as `{"topic": {"partition": next offset}}`; partitions that appear
while a query runs are read from their earliest offset. End offsets are established by reading,
not by trusting the broker's "latest offset" answer: see `outbox.spark.offsets`. Records deleted
by retention before they were read are skipped silently.
"""

from __future__ import annotations

import json
import math
import weakref
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Consumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from outbox.core.errors import ConfigurationError, KafkaUnavailable
from outbox.kafka.continuity import Continuity
from outbox.kafka.publisher import client
from outbox.spark.offsets import (
    EOF,
    RECORD,
    TP,
    OffsetClient,
    SourceOptions,
    from_json,
    kind_of,
    parse_options,
    to_json,
    to_millis,
)

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
else:
    try:
        from pyspark.sql.streaming.datasource import (
            ReadAllAvailable,
            ReadLimit,
            ReadMaxRows,
            SupportsTriggerAvailableNow,
        )
    except ImportError:  # PySpark < 4.2: no admission control, maxOffsetsPerTrigger unused

        class ReadLimit:
            pass

        class ReadAllAvailable(ReadLimit):
            pass

        class ReadMaxRows(ReadLimit):
            def __init__(self, max_rows: int) -> None:
                self.max_rows = max_rows

        class SupportsTriggerAvailableNow:
            pass


__all__ = [
    "COLUMNS",
    "FORMAT",
    "SCHEMA",
    "KafkaDataSource",
    "KafkaRange",
    "kafka_options",
    "load_kafka",
    "read_kafka",
    "register",
]

#: Short name of the source for `spark.read.format(...)`.
FORMAT = "outbox_kafka"
HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(HEADER)),
    ]
)
COLUMNS = tuple(SCHEMA.fieldNames())
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        (
            "headers",
            pa.list_(
                pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
            ),
        ),
    ]
)
#: Offset specs that are not times.
OFFSET_KINDS = {"earliest", "latest", "offsets"}
#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 10_000


class KafkaRange(InputPartition):
    """The offsets [start, end) of one Kafka partition: one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


def read_range(options: SourceOptions, rng: KafkaRange) -> Iterator[pa.RecordBatch]:
    """The records of one range as Arrow batches, each once and in offset order; fails if the
    range cannot be read in time.

    A jump in the offsets is read again from the missing offset (outbox.kafka.continuity: a
    broker can hand out a record before the one behind it is readable); a record delivered
    twice is kept once.
    """
    consumer = client(Consumer, options.client_config())
    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    continuity = Continuity()
    continuity.start((rng.topic, rng.partition), rng.start)
    rows = _Columns()
    position = rng.start
    try:
        while position < rng.end:
            got = _consume_some(consumer, options.poll_timeout, rng, position)
            kinds = [kind_of(m) for m in got]  # once: a transient error is logged as it is read
            _, seek = continuity.admit([m for m, k in zip(got, kinds, strict=True) if k == RECORD])
            for (topic, partition), offset in seek.items():
                consumer.seek(TopicPartition(topic, partition, offset))
            for message, kind in zip(got, kinds, strict=True):
                offset = message.offset() or 0
                if seek and kind == RECORD and offset > position:
                    # One partition, read without a hole up to `position`: the first record
                    # past it is the jump, read again from the missing offset.
                    break
                if kind == EOF and offset >= rng.end:
                    position = rng.end
                elif kind == RECORD and position <= offset < rng.end:
                    rows.add(message)
                    position = offset + 1
                elif kind == RECORD and offset >= rng.end:
                    position = rng.end
            if len(rows) >= ARROW_BATCH_ROWS:
                yield rows.batch()
                rows = _Columns()
        if len(rows):
            yield rows.batch()
    finally:
        consumer.close()


def _consume_some(consumer: Consumer, timeout: float, rng: KafkaRange, position: int) -> list[Any]:
    """The next messages; raises when nothing arrives for `timeout` seconds."""
    waited = 0.0
    while True:
        got = consumer.consume(min(ARROW_BATCH_ROWS, max(rng.end - position, 1)), 0.5)
        if got:
            return got
        waited += 0.5
        if waited >= timeout:
            raise KafkaUnavailable(
                f"could not read offsets {position}..{rng.end - 1} of {rng.topic}/"
                f"{rng.partition} within {timeout:g}s (pollTimeoutMs)"
            )


class _Columns:
    """Columns of the records collected for one Arrow batch."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: Any) -> None:
        key, value = message.key(), message.value()
        self.keys.append(key.encode() if isinstance(key, str) else key)
        self.values.append(value.encode() if isinstance(value, str) else value)
        self.topics.append(message.topic())
        self.partitions.append(message.partition())
        self.offsets.append(message.offset())
        kind, millis = message.timestamp()
        if kind == TIMESTAMP_NOT_AVAILABLE:
            self.timestamps.append(None)
            self.types.append(-1)
        else:
            self.timestamps.append(millis * 1000)
            self.types.append(0 if kind == TIMESTAMP_CREATE_TIME else 1)
        headers = message.headers()
        self.headers.append(
            [{"key": name, "value": v.encode() if isinstance(v, str) else v} for name, v in headers]
            if headers
            else None
        )

    def batch(self) -> pa.RecordBatch:
        arrays = [
            self.keys,
            self.values,
            self.topics,
            self.partitions,
            self.offsets,
            self.timestamps,
            self.types,
            self.headers,
        ]
        return pa.RecordBatch.from_arrays(
            [pa.array(a, type=f.type) for a, f in zip(arrays, ARROW_SCHEMA, strict=True)],
            schema=ARROW_SCHEMA,
        )


def _read(options: SourceOptions, partition: Any) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, KafkaRange):  # Spark's placeholder for "no partitions"
        return iter(())
    return read_range(options, partition)


class KafkaBatchReader(DataSourceReader):
    """Batch reads: offsets resolved once, on the driver, when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[KafkaRange]:
        client = OffsetClient(self.options)
        try:
            tps = client.partitions()
            starts = client.resolve(self.options.starting, tps, start=True)
            ends = client.resolve(self.options.ending, tps, start=False)
        finally:
            client.close()
        by_offsets = {self.options.starting.kind, self.options.ending.kind} <= OFFSET_KINDS
        for tp in tps:
            # Times need not grow with offsets: a time range may resolve to nothing.
            if starts[tp] > ends[tp] and by_offsets:
                raise ConfigurationError(
                    f"{tp[0]}/{tp[1]}: the starting offset {starts[tp]} is after the ending "
                    f"offset {ends[tp]}"
                )
        return [
            KafkaRange(t, p, starts[(t, p)], ends[(t, p)])
            for t, p in tps
            if ends[(t, p)] > starts[(t, p)]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads: offsets in the checkpoint, end offsets verified at each trigger."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: OffsetClient | None = None
        self._target: dict[TP, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the driver's Kafka client does not travel.
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> OffsetClient:
        if self._client is None:
            self._client = OffsetClient(self.options)
        return self._client

    def initialOffset(self) -> dict[str, Any]:
        tps = self.client.partitions()
        return to_json(self.client.resolve(self.options.starting, tps, start=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.options.max_offsets_per_trigger
        return ReadMaxRows(cap) if cap else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.client.latest(self.client.partitions())

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        tps = self.client.partitions()
        ends = self.client.latest(tps)
        if self._target is not None:
            ends = {tp: min(o, self._target[tp]) for tp, o in ends.items() if tp in self._target}
        if start is None:  # PySpark < 4.2 asks without a start: no cap possible
            return to_json(ends)
        begin = from_json(start)
        new = [tp for tp in ends if tp not in begin]
        if new:
            begin.update(self.client.earliest(new))
        for tp, offset in begin.items():
            ends[tp] = max(ends.get(tp, offset), offset)  # never behind the start
        if isinstance(limit, ReadMaxRows):
            ends = cap_offsets(begin, ends, int(limit.max_rows))
        return to_json(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRange]:
        begin, stop = from_json(start), from_json(end)
        new = [tp for tp in stop if tp not in begin]
        if new:
            begin.update(self.client.earliest(new))
        return [
            KafkaRange(t, p, begin[(t, p)], offset)
            for (t, p), offset in sorted(stop.items())
            if offset > begin[(t, p)]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets are Spark's checkpoint, not a consumer group's."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def cap_offsets(begin: Mapping[TP, int], ends: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """End offsets moved back so that at most about `limit` offsets are read in all.

    Shared in proportion to each partition's backlog, as Spark's connector does; a partition
    with a backlog always advances by at least one offset.
    """
    sizes = {tp: max(end - begin.get(tp, end), 0) for tp, end in ends.items()}
    total = sum(sizes.values())
    if total <= limit:
        return dict(ends)
    capped = {}
    for tp, end in ends.items():
        share = limit * sizes[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        capped[tp] = min(end, begin.get(tp, end) + step)
    return capped


class KafkaDataSource(DataSource):
    """The `outbox_kafka` data source: Kafka records with their headers, batch and streaming."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> KafkaBatchReader:
        return KafkaBatchReader(parse_options(self.options))

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(parse_options(self.options))


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Make `format("outbox_kafka")` known to a session (once per session)."""
    if spark not in _registered:
        spark.dataSource.register(KafkaDataSource)
        _registered.add(spark)


#: A position in topics: "earliest", "latest", {topic: {partition: offset}}, or a time.
Position = str | Mapping[str, Mapping[int, int]] | datetime


def kafka_options(
    bootstrap: str,
    topics: Sequence[str] | Mapping[str, Sequence[int]],
    *,
    starting: Position = "earliest",
    ending: Position | None = "latest",
    max_offsets_per_trigger: int | None = None,
    kafka_config: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Source options, valid for `outbox_kafka` and for Spark's `kafka` format alike."""
    options = {"kafka.bootstrap.servers": bootstrap}
    options.update({f"kafka.{k}": str(v) for k, v in (kafka_config or {}).items()})
    if isinstance(topics, Mapping):
        options["assign"] = json.dumps({t: sorted(ps) for t, ps in topics.items()})
    else:
        if isinstance(topics, str):
            raise ConfigurationError("topics must be a list of names, not one string")
        options["subscribe"] = ",".join(topics)
    options.update(_position("starting", starting))
    if ending is not None:
        options.update(_position("ending", ending))
    if max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    parse_options(options)  # fail here, with the same message, rather than inside Spark
    return options


def _position(side: str, position: Position) -> dict[str, str]:
    if isinstance(position, datetime):
        return {f"{side}Timestamp": str(to_millis(position))}
    if isinstance(position, str):
        return {f"{side}Offsets": position}
    return {
        f"{side}Offsets": json.dumps(
            {t: {str(p): int(o) for p, o in ps.items()} for t, ps in position.items()}
        )
    }


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    topics: Sequence[str] | Mapping[str, Sequence[int]],
    *,
    starting: Position = "earliest",
    ending: Position = "latest",
    streaming: bool = False,
    max_offsets_per_trigger: int | None = None,
    kafka_config: Mapping[str, str] | None = None,
    options: Mapping[str, str] | None = None,
    connector: str = "python",
) -> DataFrame:
    """A DataFrame of Kafka records (columns `COLUMNS`), batch or streaming.

    `topics`: names (every partition) or {topic: [partitions]}. `connector="python"` uses this
    module's source; `connector="kafka"` uses Spark's JVM connector (the
    `spark-sql-kafka-0-10` package must be on the cluster), with the same options and columns.
    `options` adds raw source options (e.g. {"probeTimeoutMs": "5000"}).
    """
    settings = kafka_options(
        bootstrap,
        topics,
        starting=starting,
        ending=None if streaming else ending,
        max_offsets_per_trigger=max_offsets_per_trigger,
        kafka_config=kafka_config,
    )
    settings.update(options or {})
    return load_kafka(spark, settings, streaming=streaming, connector=connector)


def load_kafka(
    spark: SparkSession,
    options: Mapping[str, str],
    *,
    streaming: bool = False,
    connector: str = "python",
) -> DataFrame:
    """A DataFrame of Kafka records from ready-made source options (see `kafka_options`)."""
    settings = dict(options)
    if connector == "python":
        register(spark)
        source = spark.readStream if streaming else spark.read
        return source.format(FORMAT).options(**settings).load()
    if connector == "kafka":
        for own in ("probeTimeoutMs", "pollTimeoutMs"):
            settings.pop(own, None)
        jvm = spark.readStream if streaming else spark.read
        frame: DataFrame = jvm.format("kafka").options(**settings, includeHeaders="true").load()
        return frame.select(*COLUMNS)
    raise ConfigurationError(f"connector must be 'python' or 'kafka', got {connector!r}")
