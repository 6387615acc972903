"""Kafka records (rows of the `outbox_kafka` source) -> a service's `consumer_queue`, on Spark.

Contract, the same as the Consumer daemon's: each record becomes the row `to_inbox_row` makes
of it (a record without an outbox message id gets the same foreign id; a record that cannot be
an ordinary row is quarantined: stored dead with its reason and raw headers), stored once per
message id (`INSERT ... ON CONFLICT (message_id) DO NOTHING`), followed by the
same NOTIFY when a Handler sleeps. The Handler cannot tell which relay stored a row.

Each Spark task writes its own share on the executor, in transactions of at most
`transaction_rows` records: COPY into a staging table, then one insert from it
(`outbox.postgres.spark_inbox.store_rows`). A task that fails and runs again, a micro-batch
that runs again after a restart, or a replay meet the unique message id and store nothing
twice.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
)
from pyspark.sql import DataFrame

from outbox.core.errors import ConfigurationError
from outbox.kafka.subscriber import InboxRow, to_inbox_row
from outbox.postgres.queries import validate_schema
from outbox.postgres.spark_inbox import store_rows

#: Schema of what each task reports back to the driver.
COUNTS_SCHEMA = "received long, stored long"
#: Spark's timestampType -> confluent-kafka's timestamp kind.
_TIMESTAMP_KINDS = {0: TIMESTAMP_CREATE_TIME, 1: TIMESTAMP_LOG_APPEND_TIME}


@dataclass(frozen=True)
class InboxTarget:
    """A service's inbox: its database, its outbox schema, and the transaction size."""

    database_url: str
    schema: str = "outbox"
    transaction_rows: int = 10_000
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        if self.transaction_rows < 1:
            raise ConfigurationError(f"transaction_rows must be >= 1, got {self.transaction_rows}")


@dataclass(frozen=True)
class StoreCounts:
    """Records received from Kafka, and rows stored (the others were already there)."""

    received: int = 0
    stored: int = 0

    @property
    def skipped(self) -> int:
        return self.received - self.stored

    def __add__(self, other: StoreCounts) -> StoreCounts:
        return StoreCounts(self.received + other.received, self.stored + other.stored)


def inbox_rows(batch: pa.RecordBatch) -> Iterator[InboxRow]:
    """The inbox rows of an Arrow batch of source rows, converted as the Consumer daemon does."""
    columns = batch.to_pydict()
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds
    for i in range(batch.num_rows):
        kind = _TIMESTAMP_KINDS.get(columns["timestampType"][i], TIMESTAMP_NOT_AVAILABLE)
        micros = stamps[i]
        headers = columns["headers"][i] or []
        message = Message(
            topic=columns["topic"][i],
            partition=columns["partition"][i],
            offset=columns["offset"][i],
            key=columns["key"][i],
            value=columns["value"][i],
            headers=[(h["key"], h["value"]) for h in headers],
            timestamp=(kind, micros // 1000) if micros is not None else (0, 0),
        )
        yield to_inbox_row(message)


def store_batches(target: InboxTarget, batches: Iterable[pa.RecordBatch]) -> StoreCounts:
    """Store a task's batches, connecting only if there is something to store."""
    counts = StoreCounts()
    conn: psycopg.Connection[Any] | None = None
    pending: list[InboxRow] = []
    try:
        for batch in batches:
            for row in inbox_rows(batch):
                pending.append(row)
                if len(pending) >= target.transaction_rows:
                    conn = conn or _connect(target)
                    counts += StoreCounts(len(pending), store_rows(conn, target.schema, pending))
                    pending = []
        if pending:
            conn = conn or _connect(target)
            counts += StoreCounts(len(pending), store_rows(conn, target.schema, pending))
    finally:
        if conn is not None:
            conn.close()
    return counts


def _connect(target: InboxTarget) -> psycopg.Connection[Any]:
    return psycopg.connect(
        target.database_url,
        connect_timeout=max(1, int(target.connect_timeout)),
        application_name="outbox-spark",
    )


def _task(target: InboxTarget, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: store, then report one row of counts."""
    counts = store_batches(target, batches)
    yield pa.RecordBatch.from_pydict(
        {"received": [counts.received], "stored": [counts.stored]},
        schema=pa.schema([("received", pa.int64()), ("stored", pa.int64())]),
    )


def write_inbox(frame: DataFrame, target: InboxTarget) -> StoreCounts:
    """Store a DataFrame of source rows into the inbox, on the executors; the totals."""
    rows = frame.mapInArrow(functools.partial(_task, target), COUNTS_SCHEMA).collect()
    return sum((StoreCounts(int(r["received"]), int(r["stored"])) for r in rows), StoreCounts())
