"""A `Publisher` that appends to the PostgreSQL log: one transaction per batch."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import psycopg

from outbox.core.batches import OutgoingRecord
from outbox.core.errors import (
    ConfigurationError,
    InvalidHeaders,
    InvalidTopic,
    OutboxError,
    SchemaNotMigrated,
    SchemaTooNew,
)
from outbox.core.partitioning import partition_for
from outbox.core.redact import redact_text
from outbox.core.retriable import retriable
from outbox.core.text import first_line, storable
from outbox.core.topics import validate_topic
from outbox.pglog.log import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PARTITIONS,
    DEFAULT_SCHEMA,
    Connection,
    Topics,
    apply_retention,
    check_partitions,
    check_schema,
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
#: Seconds between two readings of the partitions of the topics a publisher writes to: how soon
#: it sees partitions added by `outbox log-topics alter` (a changed topic is re-read at once).
REFRESH_INTERVAL = 5.0
#: Seconds the server lets a publisher's session sit idle inside an append's transaction (a
#: frozen publisher) before it ends the session, which rolls the append back and frees the
#: partitions' counter rows for the other publishers.
IDLE_IN_TRANSACTION_TIMEOUT = 10.0
#: Seconds an append waits for a partition's counter row locked by another session; then the
#: batch fails retriably instead of hanging (a manual transaction holding the rows, say).
LOCK_TIMEOUT = 30.0
#: Appends of one batch in one `publish`: the first, and again after a topic or partition was
#: found changed or a partition's counter was repaired.
APPEND_ATTEMPTS = 3

#: SQLSTATEs of a log schema that is missing or changed: undefined table, column or function,
#: invalid schema name.
_SCHEMA_STATES = frozenset({"42P01", "42703", "42883", "3F000"})


class LogAppendRefused(OutboxError):
    """The log database refused an append in a way no retry can fix (a missing privilege, a
    constraint added by hand): the relay stops, and the batch stays in its queue."""


class _MeanwhileFailed(Exception):
    """The caller's `meanwhile` raised `error` during an append."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class _Retry(Exception):
    """An append that stored nothing and may succeed if tried again (this call, or a later
    one): a topic or partition changed under the publisher, a counter was repaired."""


class _Once:
    """Calls `meanwhile` at most once over the attempts of one `publish`."""

    def __init__(self, meanwhile: Callable[[], None] | None) -> None:
        self._meanwhile = meanwhile

    @property
    def pending(self) -> bool:
        """Whether there is still a `meanwhile` to call."""
        return self._meanwhile is not None

    def __call__(self) -> None:
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            try:
                meanwhile()
            except Exception as exc:  # rolls the append back; re-raised by `publish`
                raise _MeanwhileFailed(exc) from exc


class PgLogPublisher:
    """Appends batches to the log; `publish` returns once the batch is committed.

    A keyed message goes to the topic's partition murmur2(key) % partitions, the partitions
    taken in number order (Kafka's default partitioner, `outbox.core.partitioning.partition_for`),
    so a key stays in one partition, in order, as long as the topic's partitions do not
    change; the keyless messages of a batch go to one partition of their topic chosen at random
    (Kafka's sticky partitioner), so they spread over batches. A topic is created on first
    publish with `partitions` partitions; an existing topic keeps its own count (a warning, once
    per topic, says so when it differs). The topics' partitions are read again every
    `refresh_interval` seconds and whenever an append finds one changed.

    A record is reported delivered only if the append's transaction committed with every record
    of the batch in the partition it was meant for: a topic or partition deleted or recreated
    under the publisher is re-read (a deleted topic is created again) and the batch appended
    again, or failed retriably. A record larger than `max_message_bytes` or with an illegal
    topic fails permanently; a batch whose transaction failed in a way a retry can fix (a lost
    connection, a serialization failure, a lock wait past `lock_timeout`, ...) fails retriably
    as a whole: its records may then be in the log after all (commit outcome unknown), and the
    resend is deduplicated by the inbox, as after a Kafka timeout. Anything else raises:
    SchemaNotMigrated for a log schema not there, LogAppendRefused otherwise.

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
        refresh_interval: float = REFRESH_INTERVAL,
        idle_in_transaction_timeout: float = IDLE_IN_TRANSACTION_TIMEOUT,
        lock_timeout: float = LOCK_TIMEOUT,
    ) -> None:
        try:
            check_partitions(partitions)
        except ConfigurationError as exc:
            raise ConfigurationError(f"log {exc}") from None
        if retention is not None and retention <= 0:
            raise ConfigurationError(f"log retention must be > 0 seconds, got {retention}")
        for name, value in (
            ("refresh_interval", refresh_interval),
            ("idle_in_transaction_timeout", idle_in_transaction_timeout),
            ("lock_timeout", lock_timeout),
        ):
            if not value >= 0:  # NaN too
                raise ConfigurationError(f"log publisher {name} must be >= 0, got {value}")
        self.url = url
        self.schema = validate_schema(schema)
        self.partitions = partitions
        self.max_message_bytes = max_message_bytes
        self.connect_timeout = connect_timeout
        self.refresh_interval = refresh_interval
        self.idle_in_transaction_timeout = idle_in_transaction_timeout
        self.lock_timeout = lock_timeout
        self._sql = queries(schema)
        self._channel = wake_channel(schema)
        self._topics = Topics(schema)
        self._next_refresh = 0.0
        #: Topics whose partition count differs from `partitions`, already warned about.
        self._warned: set[str] = set()
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
            conn = connect(
                self.url, timeout=self.connect_timeout, application_name="outbox-log-publisher"
            )
            try:
                conn.execute(
                    self._sql["log_publisher_session"],
                    {
                        "idle": str(round(self.idle_in_transaction_timeout * 1000)),
                        "lock": str(round(self.lock_timeout * 1000)),
                    },
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self._next_refresh = 0.0  # topics may have changed while it was away
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
            skipped = self._append(accepted, _Once(meanwhile))
            for index, message, _headers in accepted:
                if message.topic in skipped:
                    results[index] = DeliveryFailure(error=storable(skipped[message.topic]))
        except _MeanwhileFailed as failed:
            # The caller's own work failed (the append was rolled back with it): its error,
            # not a failure of the log, and no outcome (the caller sends these rows again).
            raise failed.error from None
        except _Retry as retry:
            failure = DeliveryFailure(error=storable(redact_text(str(retry))))
            log.warning("log publish of %d records failed: %s", len(accepted), failure.error)
            for index, _message, _headers in accepted:
                results[index] = failure
        except psycopg.Error as exc:
            if not self._retriable(exc):
                raise self._refused(exc) from exc
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

    def _retriable(self, exc: psycopg.Error) -> bool:
        """Whether a retry can fix `exc`: a lost connection, or what `outbox.core.retriable`
        calls passing."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return True  # lost, or never made: an outage
        return retriable(exc)

    def _refused(self, exc: psycopg.Error) -> OutboxError:
        """The error a non-retriable failure raises: SchemaNotMigrated when the log schema is
        not there (or not this outbox's), LogAppendRefused otherwise."""
        text = redact_text(first_line(exc))
        if exc.sqlstate in _SCHEMA_STATES and self._conn is not None:
            try:
                check_schema(self._conn, self.schema)
            except (SchemaNotMigrated, SchemaTooNew) as wrong:
                return wrong
            except psycopg.Error:
                pass
            return SchemaNotMigrated(
                f"log schema {self.schema!r} is not as `outbox migrate` left it ({text}): "
                "restore it, or drop it and run `outbox migrate --log-url URL --log-schema "
                f"{self.schema}`"
            )
        hint = ""
        if exc.sqlstate == "42501":
            hint = (
                ": the log database role needs USAGE on the log schema and SELECT, INSERT, "
                "UPDATE on its tables"
            )
        return LogAppendRefused(
            f"the log database refused an append (SQLSTATE {exc.sqlstate}): {text}{hint}; "
            "retrying cannot fix this, the batch stays in the queue"
        )

    # -- topics ----------------------------------------------------------------------------------

    def _read_topics(self, conn: Connection, batch_topics: set[str]) -> None:
        """Know the partitions of `batch_topics`, creating those that do not exist; every
        `refresh_interval`, read every known topic's again."""
        topics = self._topics
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_interval
            known = set(topics.partitions)
            if known:
                self._reload(conn, known)
        missing = batch_topics - topics.partitions.keys()
        if missing:
            self._reload(conn, missing)
            for topic in sorted(missing - topics.partitions.keys()):
                if topics.create(conn, topic, self.partitions):
                    log.info("created log topic %s with %d partitions", topic, self.partitions)
                    self._warned.discard(topic)
                self._check_count(topic)

    def _reload(self, conn: Connection, names: set[str]) -> None:
        """Read `names` afresh: a topic gone is forgotten, a changed one said so once."""
        topics = self._topics
        before = {t: len(topics.partitions[t]) for t in names if t in topics.partitions}
        topics.forget(names)
        topics.load(conn, names)
        for topic in sorted(names):
            was, now = before.get(topic), len(topics.partitions.get(topic, ()))
            if was is not None and was != now:
                log.warning(
                    "log topic %s has %d partitions now (had %d): its keys map to other "
                    "partitions from here on",
                    topic,
                    now,
                    was,
                )
            self._check_count(topic)

    def _check_count(self, topic: str) -> None:
        """Say once per topic that it has another partition count than `partitions`: a
        WARNING when fewer (a `--log-partitions` raised for an existing topic does not grow
        it), INFO when more (grown or created ahead by an operator)."""
        ids = self._topics.partitions.get(topic)
        if ids is None or len(ids) == self.partitions:
            self._warned.discard(topic)
            return
        if topic in self._warned:
            return
        self._warned.add(topic)
        count = len(ids)
        if count < self.partitions:
            log.warning(
                "log topic %s has %d %s, fewer than the %d this producer creates topics with: "
                "--log-partitions applies to new topics only; `outbox log-topics alter %s "
                "--partitions %d` adds partitions (and moves keys to other partitions)",
                topic,
                count,
                "partition" if count == 1 else "partitions",
                self.partitions,
                topic,
                self.partitions,
            )
        else:
            log.info(
                "log topic %s has %d partitions, more than the %d this producer creates "
                "topics with (--log-partitions applies to new topics only)",
                topic,
                count,
                self.partitions,
            )

    def _assign(self, accepted: list[tuple[int, OutgoingRecord, bytes]]) -> list[int]:
        """The partition id of each record."""
        topics = self._topics.partitions
        sticky: dict[str, int] = {}
        partition_ids: list[int] = []
        for _, message, _ in accepted:
            ids = topics[message.topic]
            if message.key is not None:
                partition_ids.append(ids[partition_for(message.key, len(ids))])
            else:
                chosen = sticky.get(message.topic)
                if chosen is None:
                    chosen = sticky[message.topic] = ids[self._random.randrange(len(ids))]
                partition_ids.append(chosen)
        return partition_ids

    # -- appending -------------------------------------------------------------------------------

    def _append(
        self, accepted: list[tuple[int, OutgoingRecord, bytes]], meanwhile: _Once
    ) -> dict[str, str]:
        """Append the batch, again after a changed topic (re-read) or a taken offset (the
        counter repaired), up to APPEND_ATTEMPTS times; _Retry when it never could. The
        records of a topic that has no partitions (its partition rows deleted by hand) are
        left out: returns why, per such topic."""
        batch_topics = {m.topic for _, m, _ in accepted}
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            conn = self._connection()
            self._read_topics(conn, batch_topics)
            empty = batch_topics - self._topics.partitions.keys()
            skipped = {
                topic: f"log topic {topic} has no partitions (deleted by hand?): add them with "
                f"`outbox log-topics alter {topic} --partitions N`"
                for topic in empty
            }
            appended = [a for a in accepted if a[1].topic not in empty]
            if not appended:
                meanwhile()
                return skipped
            partition_ids = self._assign(appended)
            try:
                self._append_once(conn, appended, partition_ids, meanwhile)
                return skipped
            except _Retry as changed:
                if attempt == APPEND_ATTEMPTS:
                    raise
                log.warning("%s; reading the topics again", changed)
                self._next_refresh = 0.0
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.table_name != "log_records":
                    raise
                if not self._repair(conn, partition_ids) or attempt == APPEND_ATTEMPTS:
                    raise _Retry(
                        f"log append: {redact_text(first_line(exc))} (a record written by hand "
                        "at a partition's next offset)"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _append_once(
        self,
        conn: Connection,
        accepted: list[tuple[int, OutgoingRecord, bytes]],
        partition_ids: list[int],
        meanwhile: _Once,
    ) -> None:
        """One statement (`log_append`): lock the counter rows in id order, append all or
        nothing (only onto the partitions the cache names), in one transaction. _Retry when
        nothing was appended, because a partition is gone or not the one the cache says.

        Without a `meanwhile` to call, the statement is its own transaction (the connection is
        in autocommit): one round trip, and the counter rows are never held while the client
        is away. With one, `meanwhile` runs after the statement and before the COMMIT (its
        failure rolls the append back), the session idle in its transaction meanwhile (ended
        by the server past `idle_in_transaction_timeout`)."""
        names = self._topics.names
        expected = sorted(set(partition_ids))
        params = {
            "partition_ids": partition_ids,
            "keys": [m.key for _, m, _ in accepted],
            "values": [m.payload for _, m, _ in accepted],
            "headers": [h for _, _, h in accepted],
            "channel": self._channel,
            "expected_ids": expected,
            "expected_topics": [names[i][0] for i in expected],
            "expected_partitions": [names[i][1] for i in expected],
        }
        with conn.transaction() if meanwhile.pending else nullcontext():
            row = conn.execute(self._sql["log_append"], params).fetchone()
            meanwhile()  # nothing once called (a later attempt), or when none was given
            self._check_appended(row, expected, accepted)

    def _check_appended(
        self,
        row: tuple[Any, ...] | None,
        expected: list[int],
        accepted: list[tuple[int, OutgoingRecord, bytes]],
    ) -> None:
        """_Retry unless the append stored the whole batch (it stores all or nothing), saying
        which of the `expected` partitions is not the one the cache says."""
        assert row is not None, "log_append returns one row"
        stored, _woke, ids, topics, partitions = row
        if int(stored) == len(accepted):
            return
        names = self._topics.names
        found = {int(i): (str(t), int(p)) for i, t, p in zip(ids, topics, partitions, strict=True)}
        for partition_id in expected:
            if found.get(partition_id) != names[partition_id]:
                topic, partition = names[partition_id]
                now = found.get(partition_id)
                raise _Retry(
                    f"log topic {topic} partition {partition} "
                    + ("is gone" if now is None else f"is now {now[0]} partition {now[1]}")
                    + f" (partition id {partition_id}); nothing of the batch was appended"
                )
        raise _Retry(f"log append stored {stored} of {len(accepted)} records; none was kept")

    def _repair(self, conn: Connection, partition_ids: list[int]) -> bool:
        """Move the counters of `partition_ids` past the highest offset each holds, saying so
        once per partition moved; whether any moved."""
        moved = conn.execute(
            self._sql["log_repair_counters"], {"partition_ids": sorted(set(partition_ids))}
        ).fetchall()
        for partition_id, was, now in moved:
            topic, partition = self._topics.names[int(partition_id)]
            log.warning(
                "log topic %s partition %d holds records at or past its next offset %d that "
                "no publisher appended (written by hand?), the highest at offset %d: its next "
                "offset moved from %d to %d, and the batch is appended after them",
                topic,
                partition,
                was,
                now - 1,
                was,
                now,
            )
        return bool(moved)

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
