"""Subscriptions: named readers of one log topic, each at its own position, read by any number
of clients under leases (`outbox serve`'s `/v1/topics/{topic}/subscriptions`, docs/http.md).

A subscription is a consumer group of the log, named `subscription_group(topic, name)`: its
position is the group's committed offsets, so retention deletes only what every subscription
(and every consumer group) has read, and `outbox status` shows its lag. `next` leases the
partitions it hands records of: no other client reads a leased partition until the records are
acknowledged (`ack`, by the cursor `next` gave) or the lease runs out, when the same records
are handed out again (at least once). Each record therefore goes to one client at a time, in
order per partition. Every function here runs in the caller's transaction on the log database;
the caller commits (docs/decisions/0023).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql as psql

from outbox.core.errors import OutboxError
from outbox.core.topics import validate_topic
from outbox.pglog.log import (
    Connection,
    PartitionInfo,
    TopicExists,
    TopicInfo,
    Topics,
    UnknownTopic,
    check_partitions,
    queries,
    wake_channel,
)
from outbox.postgres.connection import connect, notified

__all__ = [
    "Lag",
    "Leased",
    "LogRecord",
    "SubscriptionExists",
    "Subscriptions",
    "UnknownSubscription",
    "Wakeups",
    "subscription_group",
]

#: Most records one `next` hands out.
MAX_RECORDS = 1000


class UnknownSubscription(OutboxError, KeyError):
    """The topic has no subscription of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SubscriptionExists(OutboxError, ValueError):
    """A consumer group that is not a subscription already has the subscription's group name."""


def subscription_group(topic: str, name: str) -> str:
    """The consumer group of subscription `name` of `topic`, as `outbox status` shows it."""
    return f"subscription:{topic}:{name}"


@dataclass(frozen=True)
class LogRecord:
    """One record handed out: where it is, and its key, value and headers as stored."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: bytes | None


@dataclass(frozen=True)
class Leased:
    """What one `next` handed out: the records, in order per partition, and the cursor that
    acknowledges them (None when there are none)."""

    records: tuple[LogRecord, ...]
    cursor: str | None


@dataclass(frozen=True)
class Lag:
    """A subscription's position in one partition against the partition's end."""

    partition: int
    position: int
    end: int
    leased: bool

    @property
    def lag(self) -> int:
        """Records yet to read here."""
        return max(0, self.end - self.position)


class Subscriptions:
    """The topics and subscriptions of one log schema, run on the caller's connection."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.sql = queries(schema)

    # -- topics ---------------------------------------------------------------------------------

    def topics(self, conn: Connection, names: list[str] | None = None) -> list[TopicInfo]:
        """The topics named (all when None), with their partitions, in name order."""
        found: dict[str, list[PartitionInfo]] = {}
        for name, partition, end, earliest in conn.execute(
            self.sql["log_topic_list"], {"names": names}
        ):
            partitions = found.setdefault(name, [])
            if partition is not None:
                partitions.append(PartitionInfo(int(partition), int(end), int(earliest)))
        return [TopicInfo(name, tuple(p)) for name, p in found.items()]

    def create_topic(self, conn: Connection, name: str, partitions: int) -> None:
        """Create `name`; TopicExists if it exists (`InvalidTopic`, `ConfigurationError` for a
        bad name or count)."""
        validate_topic(name)
        check_partitions(partitions)
        if not Topics(self.schema).create(conn, name, partitions):
            raise TopicExists(f"topic {name!r} exists already")

    def subscriptions_of(self, conn: Connection, topic: str) -> list[tuple[str, int]]:
        """The subscriptions of `topic` and the records each has yet to read."""
        return [
            (str(n), int(lag)) for n, lag in conn.execute(self.sql["sub_list"], {"topic": topic})
        ]

    # -- subscriptions --------------------------------------------------------------------------

    def subscribe(self, conn: Connection, topic: str, name: str, *, earliest: bool) -> bool:
        """Make subscription `name` of `topic`, at the topic's end (or its earliest record kept);
        whether it was made (False: it existed, and keeps its position). UnknownTopic,
        SubscriptionExists (the group name is a consumer group's)."""
        validate_topic(name, "subscription name")
        row = conn.execute(self.sql["sub_topic"], {"topic": topic}).fetchone()
        if row is None:
            raise UnknownTopic(f"no topic {topic!r}")
        if self._group(conn, topic, name) is not None:
            return False
        group = subscription_group(topic, name)
        made = conn.execute(self.sql["sub_group_create"], {"group": group}).fetchone()
        if made is None:
            if self._group(conn, topic, name) is not None:  # made meanwhile
                return False
            raise SubscriptionExists(
                f"consumer group {group!r} exists and is not a subscription: forget it first "
                "(outbox log-topics) or choose another name"
            )
        conn.execute(
            self.sql["sub_create"],
            {"group_id": made[0], "topic_id": row[0], "name": name, "earliest": earliest},
        )
        return True

    def unsubscribe(self, conn: Connection, topic: str, name: str) -> None:
        """Forget subscription `name` of `topic` and its position; UnknownSubscription."""
        group = self._require(conn, topic, name)
        conn.execute(self.sql["sub_lease_lock"], {"group_id": group, "cursor": None})
        if conn.execute(self.sql["sub_delete"], {"topic": topic, "name": name}).fetchone() is None:
            raise UnknownSubscription(self._unknown(topic, name))

    def lag(self, conn: Connection, topic: str, name: str) -> list[Lag]:
        """The subscription's position per partition; UnknownSubscription."""
        group = self._require(conn, topic, name)
        return [
            Lag(int(p), int(position), int(end), bool(leased))
            for p, position, end, leased in conn.execute(self.sql["sub_lag"], {"group_id": group})
        ]

    def next(
        self,
        conn: Connection,
        topic: str,
        name: str,
        *,
        limit: int,
        lease: float,
        auto_ack: bool = False,
    ) -> Leased:
        """Lease partitions with records past the position and hand out up to `limit` of their
        records; with `auto_ack` the position moves past them at once (no lease remains).
        UnknownSubscription."""
        group = self._require(conn, topic, name)
        conn.execute(self.sql["sub_positions"], {"group_id": group})
        conn.execute(self.sql["sub_lease_rows"], {"group_id": group})
        cursor = str(uuid.uuid4())
        records: list[LogRecord] = []
        for partition_id, partition, _position, _end in conn.execute(
            self.sql["sub_candidates"], {"group_id": group}
        ).fetchall():
            left = limit - len(records)
            if left <= 0:
                break
            keys = {"group_id": group, "partition_id": partition_id, "cursor": cursor}
            if (
                conn.execute(self.sql["sub_lease_take"], {**keys, "lease": lease}).fetchone()
                is None
            ):
                continue  # another client holds it
            rows = conn.execute(self.sql["sub_fetch"], {**keys, "limit": left}).fetchall()
            if not rows:
                conn.execute(self.sql["sub_lease_drop"], keys)
                continue
            first, last = int(rows[0][0]), int(rows[-1][0])
            conn.execute(self.sql["sub_lease_set"], {**keys, "first": first, "next": last + 1})
            records.extend(
                LogRecord(int(partition), int(o), _bytes(k), bytes(v), _bytes(h))
                for o, k, v, h in rows
            )
        if not records:
            return Leased((), None)
        if auto_ack:
            self._ack(conn, group, cursor)
            return Leased(tuple(records), None)
        return Leased(tuple(records), cursor)

    def ack(self, conn: Connection, topic: str, name: str, cursor: str) -> bool:
        """Acknowledge the records `next` handed out under `cursor`: whether any lease was
        still that cursor's (False: unknown, or run out and handed out again).
        UnknownSubscription."""
        group = self._require(conn, topic, name)
        return self._ack(conn, group, cursor)

    def _ack(self, conn: Connection, group: int, cursor: str) -> bool:
        conn.execute(self.sql["sub_lease_lock"], {"group_id": group, "cursor": cursor})
        row = conn.execute(self.sql["sub_ack"], {"group_id": group, "cursor": cursor}).fetchone()
        return bool(row and int(row[0]) > 0)

    def _group(self, conn: Connection, topic: str, name: str) -> int | None:
        row = conn.execute(self.sql["sub_find"], {"topic": topic, "name": name}).fetchone()
        return None if row is None else int(row[0])

    def _require(self, conn: Connection, topic: str, name: str) -> int:
        group = self._group(conn, topic, name)
        if group is None:
            raise UnknownSubscription(self._unknown(topic, name))
        return group

    @staticmethod
    def _unknown(topic: str, name: str) -> str:
        return f"topic {topic!r} has no subscription {name!r}"


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


class Wakeups:
    """One session of the log that LISTENs for appends on behalf of a server's long polls:
    registered in `log_listeners` so that every append NOTIFYs while it lives (a killed
    server's row is dropped by the next one). `wait` returns when a notification came, or
    after `timeout` seconds. Not thread-safe: one thread waits."""

    def __init__(self, url: str, schema: str) -> None:
        self.sql = queries(schema)
        self.conn = connect(url, timeout=10, application_name="outbox-serve-wakeups")
        self.conn.execute(self.sql["sub_listeners_forget_dead"])
        self.conn.execute(psql.SQL("LISTEN {}").format(psql.Identifier(wake_channel(schema))))
        self.conn.execute(self.sql["sub_listener_register"])

    def wait(self, timeout: float) -> bool:
        """Whether an append was notified within `timeout` seconds (others pending taken too)."""
        return notified(self.conn, timeout)

    def close(self) -> None:
        """Unregister and close (a closed connection's row is dropped by the next server)."""
        with contextlib.suppress(psycopg.Error):  # gone: the next server forgets its row
            self.conn.execute(self.sql["sub_listener_unregister"])
        self.conn.close()
