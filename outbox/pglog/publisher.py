"""A `Publisher` that appends to the PostgreSQL log: one transaction per batch."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence

import psycopg

from outbox.core.batches import OutgoingRecord
from outbox.core.errors import ConfigurationError, InvalidHeaders, InvalidTopic
from outbox.core.partitioning import partition_for
from outbox.core.redact import redact_text
from outbox.core.text import first_line, storable
from outbox.core.topics import validate_topic
from outbox.pglog.log import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PARTITIONS,
    DEFAULT_SCHEMA,
    Connection,
    Topics,
    apply_retention,
    encode_headers,
    queries,
    wake_channel,
)
from outbox.ports import DeliveryFailure
from outbox.postgres.connection import connect
from outbox.postgres.queries import validate_schema

log = logging.getLogger("outbox.pglog")

#: Seconds between two retention passes of a publisher that applies retention.
RETENTION_INTERVAL = 60.0


class _MeanwhileFailed(Exception):
    """The caller's `meanwhile` raised `error` during an append."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class PgLogPublisher:
    """Appends batches to the log; `publish` returns once the batch is committed.

    A keyed message goes to partition murmur2(key) % partitions (Kafka's default partitioner,
    `outbox.core.partitioning.partition_for`), so a key stays in one partition, in order; the
    keyless messages of a batch go to one partition of their topic chosen at random (Kafka's sticky
    partitioner), so they spread over batches. A topic is created on first publish with
    `partitions` partitions. A record larger than `max_message_bytes` or with an illegal topic
    fails permanently; a batch whose transaction failed (connection lost, say) fails retriably
    as a whole: its records may then be in the log after all (commit outcome unknown), and the
    resend is deduplicated by the inbox, as after a Kafka timeout.

    With `retention` (seconds), a background thread deletes, every `retention_interval`
    seconds, records older than that which every consumer group has read.
    """

    def __init__(
        self,
        url: str,
        schema: str = DEFAULT_SCHEMA,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        retention: float | None = None,
        retention_interval: float = RETENTION_INTERVAL,
        connect_timeout: float = 10.0,
    ) -> None:
        if partitions < 1:
            raise ConfigurationError(f"log partitions must be >= 1, got {partitions}")
        if retention is not None and retention <= 0:
            raise ConfigurationError(f"log retention must be > 0 seconds, got {retention}")
        self.url = url
        self.schema = validate_schema(schema)
        self.partitions = partitions
        self.max_message_bytes = max_message_bytes
        self.connect_timeout = connect_timeout
        self._sql = queries(schema)
        self._channel = wake_channel(schema)
        self._topics = Topics(schema)
        self._conn: Connection | None = None
        self._random = random.Random()
        self._stop = threading.Event()
        self._retention: threading.Thread | None = None
        if retention is not None:
            self._retention = threading.Thread(
                target=self._retain,
                args=(retention, retention_interval),
                name="outbox-log-retention",
                daemon=True,
            )
            self._retention.start()

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(
                self.url, timeout=self.connect_timeout, application_name="outbox-log-publisher"
            )
        return self._conn

    def _refuse(self, message: OutgoingRecord, headers: bytes) -> str | None:
        """Why `message` can never be stored, or None."""
        try:
            validate_topic(message.topic)
        except InvalidTopic as exc:
            return str(exc)
        size = len(message.payload) + len(message.key or b"") + len(headers)
        if size > self.max_message_bytes:
            return (
                f"MSG_SIZE_TOO_LARGE: record of {size} bytes is larger than "
                f"max_message_bytes={self.max_message_bytes}"
            )
        return None

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        """Append the batch in one transaction; one outcome per record, in order."""
        results: list[DeliveryFailure | None] = [None] * len(records)
        accepted: list[tuple[int, OutgoingRecord, bytes]] = []
        for index, message in enumerate(records):
            try:
                headers = encode_headers(message.wire_headers())
            except InvalidHeaders as exc:
                results[index] = DeliveryFailure(error=storable(str(exc)), permanent=True)
                continue
            reason = self._refuse(message, headers)
            if reason is None:
                accepted.append((index, message, headers))
            else:
                results[index] = DeliveryFailure(error=storable(reason), permanent=True)
        if not accepted:
            if meanwhile is not None:
                meanwhile()
            return results
        try:
            self._append(accepted, meanwhile)
        except _MeanwhileFailed as failed:
            # The caller's own work failed (the append was rolled back with it): its error,
            # not a failure of the log, and no outcome (the caller sends these rows again).
            raise failed.error from None
        except psycopg.Error as exc:
            failure = DeliveryFailure(
                error=storable(
                    redact_text(f"log database: {type(exc).__name__}: {first_line(exc)}")
                )
            )
            log.warning("log publish of %d records failed: %s", len(accepted), failure.error)
            if self._conn is not None and (self._conn.broken or self._conn.closed):
                self._conn = None
            for index, _message, _headers in accepted:
                results[index] = failure
        return results

    def _append(
        self,
        accepted: list[tuple[int, OutgoingRecord, bytes]],
        meanwhile: Callable[[], None] | None,
    ) -> None:
        conn = self._connection()
        topics = self._topics
        missing = {m.topic for _, m, _ in accepted if m.topic not in topics.partitions}
        if missing:
            topics.load(conn, missing)
            for topic in sorted(missing - topics.partitions.keys()):
                topics.create(conn, topic, self.partitions)
        sticky: dict[str, int] = {}
        partition_ids: list[int] = []
        for _, message, _ in accepted:
            ids = topics.partitions[message.topic]
            if message.key is not None:
                partition_ids.append(ids[partition_for(message.key, len(ids))])
            else:
                chosen = sticky.get(message.topic)
                if chosen is None:
                    chosen = sticky[message.topic] = ids[self._random.randrange(len(ids))]
                partition_ids.append(chosen)
        params = {
            "partition_ids": partition_ids,
            "keys": [m.key for _, m, _ in accepted],
            "values": [m.payload for _, m, _ in accepted],
            "headers": [h for _, _, h in accepted],
            "channel": self._channel,
        }
        # One transaction, one round trip: lock the counter rows in id order, append, commit.
        # `meanwhile` runs while the statements are on their way.
        with conn.transaction(), conn.pipeline():
            conn.execute(self._sql["log_lock_partitions"], {"partition_ids": partition_ids})
            conn.execute(self._sql["log_append"], params)
            if meanwhile is not None:
                try:
                    meanwhile()
                except Exception as exc:  # rolls the append back; re-raised by `publish`
                    raise _MeanwhileFailed(exc) from exc

    def _retain(self, retention: float, interval: float) -> None:
        """The retention thread: a pass every `interval` seconds, on its own connection."""
        while not self._stop.wait(interval):
            try:
                with connect(
                    self.url, timeout=self.connect_timeout, application_name="outbox-log-retention"
                ) as conn:
                    apply_retention(conn, self.schema, retention)
            except psycopg.Error as exc:
                log.warning("log retention pass failed: %s", redact_text(first_line(exc)))

    def close(self) -> None:
        """Stop the retention thread and close the connection (nothing is buffered)."""
        self._stop.set()
        if self._retention is not None:
            self._retention.join(timeout=30)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
