"""What the log's publisher and subscriber share: statements, connections, the schema check,
the header codec, topic lookups, and `PgLog` for administration (topics, retention, groups)."""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from outbox.core.errors import (
    ConfigurationError,
    OutboxError,
)
from outbox.core.lag import GroupLag, PartitionLag, WentBack
from outbox.core.topics import validate_topic
from outbox.postgres.connection import check_database, connect
from outbox.postgres.migrate import Migrations
from outbox.postgres.queries import channel, statements_for, validate_schema

log = logging.getLogger("outbox.pglog")

#: The log schema when none is given (`--log-schema`).
DEFAULT_SCHEMA = "outbox_log"
#: Partitions of a topic created on first publish (`--log-partitions`), as a broker's
#: `num.partitions`.
DEFAULT_PARTITIONS = 8
#: Largest record (key, value and headers) the log stores: librdkafka's default
#: `message.max.bytes`, so that what one transport accepts the other does too.
DEFAULT_MAX_MESSAGE_BYTES = 1_000_000
#: Most partitions a topic can have (the log_topics CHECK constraint).
MAX_PARTITIONS = 10_000
#: The newest revision of the log's migrations (outbox/pglog/migrations/versions); the schema
#: check reads it from the scripts (`LOG_MIGRATIONS`), tests/unit/test_migration_revisions.py
#: checks that this is it.
HEAD_REVISION = "log0005"

Connection = psycopg.Connection[tuple[Any, ...]]


class GroupInUse(OutboxError):
    """A consumer group still has live members (consumers running), so it is not forgotten."""

    def __init__(self, group: str, backend_pids: tuple[int, ...]) -> None:
        self.group = group
        #: The log database's backend pids of the members' sessions.
        self.backend_pids = backend_pids
        consumers = "consumer" if len(backend_pids) == 1 else "consumers"
        pids = ", ".join(str(p) for p in backend_pids)
        super().__init__(
            f"consumer group {group!r} has {len(backend_pids)} live {consumers} (log database "
            f"backend pid {pids}): stop them first; nothing was changed"
        )


class TopicExists(OutboxError, ValueError):
    """A topic to create exists already (as Kafka's TOPIC_ALREADY_EXISTS)."""


class UnknownTopic(OutboxError, KeyError):
    """The log has no topic of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class PartitionsCannotShrink(OutboxError, ValueError):
    """A topic's partitions can only be added, never removed (as with Kafka)."""


@dataclass(frozen=True)
class PartitionInfo:
    """One partition of a log topic: its number, the next offset a publisher writes (`end`)
    and the earliest offset the log keeps (`end` when it keeps none)."""

    partition: int
    end: int
    earliest: int

    @property
    def records(self) -> int:
        """Offsets kept: end - earliest (records deleted by hand in between still count)."""
        return max(0, self.end - self.earliest)


@dataclass(frozen=True)
class TopicInfo:
    """A log topic and its partitions, in partition order."""

    name: str
    partitions: tuple[PartitionInfo, ...]

    @property
    def records(self) -> int:
        """Offsets kept over every partition."""
        return sum(p.records for p in self.partitions)

    @property
    def end(self) -> int:
        """Records ever appended (the sum of the partitions' ends)."""
        return sum(p.end for p in self.partitions)


def check_partitions(partitions: int) -> int:
    """`partitions`, or ConfigurationError unless it is a partition count a topic can have."""
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ConfigurationError(f"partitions must be an integer, got {partitions!r}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigurationError(
            f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"
        )
    return partitions


def queries(schema: str) -> dict[str, str]:
    """The log's statements (outbox/pglog/sql/) for `schema`, by outbox's loader."""
    return statements_for(schema, "outbox.pglog")


def wake_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel publishers wake the subscribers of a log schema on."""
    return channel(schema, "log")


def check_schema(conn: Connection, schema: str) -> None:
    """Raise unless the log schema is migrated to exactly the revision this code expects."""
    LOG_MIGRATIONS.check_schema(conn, schema)


def check_log(
    url: str, schema: str = DEFAULT_SCHEMA, *, timeout: float = 10.0, wait: float = 0.0
) -> None:
    """One clear error if the log database is unreachable or its schema not migrated; with
    `wait` > 0, an unreachable one is waited for up to `wait` seconds (`--wait-for-database`),
    a schema not migrated never is."""
    validate_schema(schema)
    check_database(
        lambda: connect(url, timeout=timeout, application_name="outbox-check"),
        schema,
        wait=wait,
        what="the log database",
        check=check_schema,
    )


# -- migrations ---------------------------------------------------------------------------------


def migrations_dir() -> Path:
    """The log's own Alembic script directory (inside the package)."""
    return Path(__file__).resolve().parent / "migrations"


#: The log's migrations, run and checked as outbox's own are (`outbox.postgres.migrate`).
LOG_MIGRATIONS = Migrations(
    directory=migrations_dir,
    kind="log schema",
    where="the log database",
    fix="outbox migrate --log-url URL --log-schema {schema}",
    version_sql=lambda schema: queries(schema)["log_schema_version"],
)


def upgrade(url: str, schema: str = DEFAULT_SCHEMA, revision: str = "head") -> None:
    """Create or upgrade the log schema."""
    LOG_MIGRATIONS.upgrade(url, schema, revision)


def downgrade(url: str, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    """Take the log schema down to `revision` (default: drop every log table)."""
    LOG_MIGRATIONS.downgrade(url, schema, revision)


def upgrade_sql(schema: str = DEFAULT_SCHEMA) -> str:
    """The SQL `upgrade` would run on an empty database, for a DBA to review."""
    return LOG_MIGRATIONS.upgrade_sql(schema)


# -- records ------------------------------------------------------------------------------------

_NAME_LENGTH = struct.Struct(">H")
_VALUE_LENGTH = struct.Struct(">i")

#: A record's headers as the wire has them: (name, value) in order, a value None for null.
WireHeaders = Sequence[tuple[str, bytes | None]]


def encode_headers(headers: Iterable[tuple[str, str | bytes | None]]) -> bytes:
    """Headers in the log's binary form, as Kafka's record headers: in order, duplicates and
    null values kept (name length u16, name UTF-8, value length i32 or -1, value)."""
    out = bytearray()
    for name, value in headers:
        raw_name = name.encode()
        out += _NAME_LENGTH.pack(len(raw_name))
        out += raw_name
        if value is None:
            out += _VALUE_LENGTH.pack(-1)
            continue
        raw = value.encode() if isinstance(value, str) else value
        out += _VALUE_LENGTH.pack(len(raw))
        out += raw
    return bytes(out)


def decode_headers(data: bytes | None) -> list[tuple[str, bytes | None]]:
    """The headers `encode_headers` wrote. `ValueError` (a `UnicodeDecodeError` for a name
    that is not UTF-8) when `data` is not in that form: cut short, a length past its end, a
    negative length other than a null value's -1."""
    headers: list[tuple[str, bytes | None]] = []
    if not data:
        return headers
    view = memoryview(data)
    size = len(view)
    at = 0
    while at < size:
        if at + 2 > size:
            raise ValueError(f"headers cut short at byte {at} (a name length)")
        (name_length,) = _NAME_LENGTH.unpack_from(view, at)
        at += 2
        if at + name_length + 4 > size:
            raise ValueError(f"header name of {name_length} bytes at byte {at} runs past the end")
        name = bytes(view[at : at + name_length]).decode()
        at += name_length
        (value_length,) = _VALUE_LENGTH.unpack_from(view, at)
        at += 4
        if value_length == -1:
            headers.append((name, None))
            continue
        if value_length < 0 or at + value_length > size:
            raise ValueError(
                f"header {name!r}: value length {value_length} at byte {at} does not fit"
            )
        headers.append((name, bytes(view[at : at + value_length])))
        at += value_length
    return headers


def lock_key(space: int, lock_id: int) -> int:
    """The advisory lock key of one partition of a group: the log schema's OID (`space`, 32
    bits) above, the pair's id in its schema (`log_group_locks.lock_id`, below 2^30) below, as
    the signed bigint PostgreSQL takes. No two (schema, group, partition) of a database share
    one: a schema's OID is unique in its database, a lock id in its schema. bigint keys
    (objsubid 1 in pg_locks) never meet the lanes' (int, int) keys (objsubid 2), nor outbox's
    migration lock, whose lower half is above 2^30 (docs/decisions/0019)."""
    if not 0 <= space < 1 << 32 or not 0 < lock_id < 1 << 30:
        raise ValueError(f"no partition lock key for schema OID {space}, lock id {lock_id}")
    key = space << 32 | lock_id
    return key - (1 << 64) if key >= 1 << 63 else key


def old_lock_class(schema: str, group_id: int) -> int | None:
    """The upper half of a group's partition lock keys before log0004 (7 bits of the schema's
    crc32, then the group id, whose lower half was the partition id), by which a member of an
    older outbox still running may hold a partition; None for a group id it could not have
    (at least 2^24). Two schemas' classes could be equal: see `lock_key`."""
    if not 0 < group_id < 1 << 24:
        return None
    return ((zlib.crc32(schema.encode()) & 0x7F) << 24) | group_id


class Topics:
    """A cache of the partitions of topics, read from the log.

    `partitions[topic]`: the topic's partition ids in partition order; a partition's number is
    `names[id][1]`, never its index in that list (numbers can have gaps: a partition row
    deleted by hand). `ids[topic]`: partition number -> id. `names`: id -> (topic, partition),
    also for partitions no longer cached (a reader may still hold records of one).
    """

    def __init__(self, schema: str) -> None:
        self.sql = queries(schema)
        self.partitions: dict[str, list[int]] = {}
        self.ids: dict[str, dict[int, int]] = {}
        #: partition id -> (topic, partition)
        self.names: dict[int, tuple[str, int]] = {}

    def load(self, conn: Connection, topics: Iterable[str]) -> None:
        """Read the partitions of `topics`: a topic found replaces its entry; one not found
        keeps the entry it had (see `forget`), or stays unknown."""
        found: dict[str, dict[int, int]] = {}
        for name, partition, partition_id in conn.execute(
            self.sql["log_topics"], {"names": list(topics)}
        ):
            found.setdefault(name, {})[partition] = partition_id
            self.names[partition_id] = (name, partition)
        for name, ids in found.items():
            self.ids[name] = ids
            self.partitions[name] = [ids[p] for p in sorted(ids)]

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the entries of `topics` (the next `load` reads them afresh)."""
        for topic in topics:
            self.partitions.pop(topic, None)
            self.ids.pop(topic, None)

    def create(self, conn: Connection, topic: str, partitions: int) -> bool:
        """Create `topic` with `partitions` unless it exists, then cache its partitions;
        whether this call created it."""
        validate_topic(topic)
        created = conn.execute(
            self.sql["log_create_topic"], {"name": topic, "partitions": partitions}
        ).rowcount
        self.load(conn, [topic])
        return created > 0


class PgLog:
    """Administration of a log schema: topics, retention, group positions (tests, operators)."""

    def __init__(self, url: str, schema: str = DEFAULT_SCHEMA) -> None:
        self.url = url
        self.schema = validate_schema(schema)
        self.sql = queries(schema)

    def _connect(self) -> Connection:
        return connect(self.url, timeout=10, application_name="outbox-log-admin")

    def create_topic(self, name: str, partitions: int = DEFAULT_PARTITIONS) -> None:
        """Create a topic; TopicExists (a ValueError) if it exists."""
        validate_topic(name)
        check_partitions(partitions)
        with self._connect() as conn:
            topics = Topics(self.schema)
            topics.load(conn, [name])
            if name in topics.partitions:
                raise TopicExists(f"log topic {name!r} exists already")
            if not topics.create(conn, name, partitions):  # created meanwhile
                raise TopicExists(f"log topic {name!r} exists already")

    def partitions(self, topic: str) -> int:
        """The number of partitions of `topic`; UnknownTopic (a KeyError) if it does not
        exist."""
        with self._connect() as conn:
            topics = Topics(self.schema)
            topics.load(conn, [topic])
            if topic not in topics.partitions:
                raise UnknownTopic(self._unknown(topic))
            return len(topics.partitions[topic])

    def _unknown(self, topic: str) -> str:
        return f"log schema {self.schema!r} has no topic {topic!r}"

    def topics(self, names: Iterable[str] | None = None) -> list[TopicInfo]:
        """The topics named (every topic when None; names the log does not know are left
        out), in name order, with their partitions, read in one snapshot."""
        wanted = None if names is None else list(dict.fromkeys(names))
        with self._connect() as conn:
            rows = conn.execute(self.sql["log_topic_list"], {"names": wanted}).fetchall()
        found: dict[str, list[PartitionInfo]] = {}
        for name, partition, end, earliest in rows:
            partitions = found.setdefault(name, [])
            if partition is not None:  # a topic whose partition rows are all gone
                partitions.append(PartitionInfo(int(partition), int(end), int(earliest)))
        return [TopicInfo(name, tuple(p)) for name, p in found.items()]

    def grow_topic(self, name: str, partitions: int) -> list[int]:
        """Give `name` `partitions` partitions by adding new ones; the numbers added (none
        when it has that many already). Numbers missing below the highest (partition rows
        deleted by hand) are added back first, then numbers after it.

        A running publisher sees them within its refresh interval, consumers at their next
        rebalance. Keys then map to other partitions (murmur2(key) % partitions), as after
        adding partitions to a Kafka topic. Raises UnknownTopic, or PartitionsCannotShrink,
        with nothing changed, when `partitions` is fewer than the topic has.
        """
        check_partitions(partitions)
        with self._connect() as conn, conn.transaction():
            row = conn.execute(self.sql["log_topic_lock"], {"name": name}).fetchone()
            if row is None:
                raise UnknownTopic(self._unknown(name))
            topic_id = int(row[0])
            taken = {
                int(n)
                for (n,) in conn.execute(
                    self.sql["log_topic_partition_numbers"], {"topic_id": topic_id}
                )
            }
            if partitions < len(taken):
                raise PartitionsCannotShrink(
                    f"log topic {name!r} has {len(taken)} partitions: partitions can only be "
                    f"added, not removed (as in Kafka); nothing was changed"
                )
            added: list[int] = []
            number = 0
            while len(taken) + len(added) < partitions:
                if number not in taken:
                    added.append(number)
                number += 1
            if added:
                conn.execute(
                    self.sql["log_add_partitions"],
                    {"topic_id": topic_id, "numbers": added, "count": partitions},
                )
        return added

    def count(self, topic: str | None = None) -> int:
        """How many records the log keeps (of `topic`, or of all topics)."""
        with self._connect() as conn:
            if topic is None:
                row = conn.execute(self.sql["log_count"]).fetchone()
            else:
                row = conn.execute(self.sql["log_count_topic"], {"topic": topic}).fetchone()
        return int(row[0]) if row else 0

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The next offset of `group` in each partition of `topic` it has a position in."""
        [lag] = self.lag([group])
        return {p.partition: p.committed for p in lag.partitions if p.topic == topic}

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        """The lag of each of `groups`, in the order given (every group of the log, in name
        order, when None): per partition it has a committed offset in, that offset against the
        partition's end, read in one snapshot. A group the log does not know has no partitions,
        as with Kafka (`outbox.kafka.lag`)."""
        names = None if groups is None else list(dict.fromkeys(groups))
        with self._connect() as conn:
            rows = conn.execute(self.sql["log_group_lag"], {"names": names}).fetchall()
        found: dict[str, list[PartitionLag]] = {}
        for group, topic, partition, committed, end, went_back, at, position, was, to in rows:
            partitions = found.setdefault(group, [])
            if topic is None:  # the row of a group with no committed offset yet
                continue
            last = None
            if at is not None and position is not None and was is not None and to is not None:
                last = WentBack(at, int(position), int(was), int(to))
            partitions.append(
                PartitionLag(
                    topic, int(partition), int(committed), int(end), int(went_back or 0), last
                )
            )
        return [GroupLag(g, tuple(found.get(g, ()))) for g in (found if names is None else names)]

    def apply_retention(self, retention: float, *, batch: int = 10_000) -> int:
        """Delete records older than `retention` seconds that every group has read; how many."""
        with self._connect() as conn:
            return apply_retention(conn, self.schema, retention, batch=batch)

    def forget_group(self, group: str) -> bool:
        """Forget a consumer group: drop its committed offsets, which then no longer hold back
        retention; True if the log knew the group, False if not.

        Raises GroupInUse, and changes nothing, while a consumer of the group runs: forgotten
        under it, the consumer's next commit would fail and it would start again as a new
        group. A member whose session is gone (a killed consumer) does not count. A consumer
        that joins while this runs waits for it, then starts as a new group.
        """
        with self._connect() as conn, conn.transaction():
            conn.execute(self.sql["log_members_forget_dead"])
            row = conn.execute(self.sql["log_group_lock"], {"name": group}).fetchone()
            if row is None:
                return False
            members = [
                int(pid)
                for (pid,) in conn.execute(self.sql["log_group_members"], {"group_id": row[0]})
            ]
            if members:
                raise GroupInUse(group, tuple(members))
            conn.execute(self.sql["log_forget_group"], {"name": group})
        return True


def apply_retention(conn: Connection, schema: str, retention: float, *, batch: int = 10_000) -> int:
    """One retention pass over every partition, in statements of at most `batch` deletions (so
    that no statement holds many row locks or runs long); how many records it deleted."""
    sql = queries(schema)
    deleted = 0
    for (partition_id,) in conn.execute(sql["log_partition_ids"]).fetchall():
        while True:
            row = conn.execute(
                sql["log_retention"],
                {"partition_id": partition_id, "batch": batch, "retention": retention},
            ).fetchone()
            n = int(row[0]) if row else 0
            deleted += n
            if n < batch:
                break
    if deleted:
        log.info("log retention deleted %d records", deleted)
    return deleted
