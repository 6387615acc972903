"""Read the audit's columns of a service's `consumer_queue` into Spark, in parallel, without JDBC.

A PySpark Python data source (`outbox_inbox`): the driver finds the table's id range once
(`inbox_bounds`, which also checks the schema revision), the range is split into input
partitions, and each executor reads its ids through a psycopg server-side cursor as Arrow
record batches. Only message_id, topic, created_at, processed_at, dead_at and handled_count are
read: never payloads or headers. The option `url` holds the database URL: `explain()` does not
show a Python data source's options, and where Spark logs options it redacts those named like
`url` (`spark.sql.redaction.options.regex`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from outbox.core.errors import DatabaseUnavailable
from outbox.postgres.migrate import check_schema
from outbox.postgres.spark_inbox import audit_rows, id_bounds

#: The columns the reader yields, as a Spark DDL schema.
INBOX_SCHEMA = (
    "message_id string, topic string, created_at timestamp, processed_at timestamp, "
    "dead_at timestamp, handled_count int"
)
#: Rows fetched per round trip of the server-side cursor, and per Arrow batch.
FETCH_ROWS = 20_000
#: Ids per input partition, roughly (ids are dense but retention leaves a gap at the start).
IDS_PER_PARTITION = 500_000
MAX_PARTITIONS = 64


@dataclass(frozen=True)
class IdRange(InputPartition):
    """The inclusive id range one input partition reads."""

    first_id: int
    last_id: int


def inbox_bounds(url: str, schema: str, *, connect_timeout: float = 10.0) -> tuple[int, int] | None:
    """The (min, max) id of `consumer_queue`, or None when empty; checks the schema revision.

    Raises DatabaseUnavailable, SchemaNotMigrated or SchemaTooNew with one clear line.
    """
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(connect_timeout)))
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {first}") from None
    with conn:
        check_schema(conn, schema)
        return id_bounds(conn, schema)


def split_ids(first_id: int, last_id: int, partitions: int) -> list[IdRange]:
    """Split [first_id, last_id] into at most `partitions` contiguous, non-empty ranges."""
    span = last_id - first_id + 1
    count = max(1, min(partitions, span))
    step = -(-span // count)  # ceiling division
    return [
        IdRange(start, min(start + step - 1, last_id))
        for start in range(first_id, last_id + 1, step)
    ]


def default_partitions(first_id: int, last_id: int) -> int:
    """How many input partitions for an id range: one per IDS_PER_PARTITION ids, at most 64."""
    return max(1, min(MAX_PARTITIONS, -(-(last_id - first_id + 1) // IDS_PER_PARTITION)))


class InboxSource(DataSource):
    """`spark.read.format("outbox_inbox")`: the audit columns of one consumer_queue.

    Options: url, schema, topics (JSON list), since and until (ISO 8601, created_at range,
    until excluded), first_id and last_id (from `inbox_bounds`), partitions.
    """

    @classmethod
    def name(cls) -> str:
        return "outbox_inbox"

    def schema(self) -> str:
        return INBOX_SCHEMA

    def reader(self, schema: Any) -> InboxReader:
        return InboxReader(dict(self.options))


class InboxReader(DataSourceReader):
    """Reads one id range per partition through a server-side cursor."""

    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["url"]
        self.schema = options.get("schema", "outbox")
        self.topics: list[str] = json.loads(options["topics"])
        self.since = datetime.fromisoformat(options["since"])
        self.until = datetime.fromisoformat(options["until"])
        self.first_id = int(options["first_id"])
        self.last_id = int(options["last_id"])
        self.partition_count = int(options.get("partitions", "1"))

    def partitions(self) -> Sequence[IdRange]:
        return split_ids(self.first_id, self.last_id, self.partition_count)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches of the partition's rows (none are kept in memory at once)."""
        import pyarrow as pa

        assert isinstance(partition, IdRange), partition

        arrow_schema = pa.schema(
            [
                ("message_id", pa.string()),
                ("topic", pa.string()),
                ("created_at", pa.timestamp("us", tz="UTC")),
                ("processed_at", pa.timestamp("us", tz="UTC")),
                ("dead_at", pa.timestamp("us", tz="UTC")),
                ("handled_count", pa.int32()),
            ]
        )
        params = {
            "first_id": partition.first_id,
            "last_id": partition.last_id,
            "topics": self.topics,
            "since": self.since,
            "until": self.until,
        }
        with psycopg.connect(self.url, application_name="outbox-spark-audit") as conn:
            for rows in audit_rows(conn, self.schema, params, FETCH_ROWS):
                columns = list(zip(*rows, strict=True))
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(values, type=field.type)
                        for values, field in zip(columns, arrow_schema, strict=True)
                    ],
                    schema=arrow_schema,
                )
