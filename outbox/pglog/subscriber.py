"""A `Subscriber` on the PostgreSQL log: one member of a consumer group."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence

import psycopg

from outbox.core.batches import InboxBatch
from outbox.core.errors import ConfigurationError
from outbox.core.ids import process_id
from outbox.core.naps import AWAKE_AFTER
from outbox.core.redact import redact_text
from outbox.core.topics import validate_topic
from outbox.core.wire import RawHeaders, UnreadableHeaders
from outbox.pglog.log import (
    DEFAULT_SCHEMA,
    Connection,
    Topics,
    decode_headers,
    lock_class,
    lock_key,
    queries,
    wake_channel,
)
from outbox.postgres.connection import connect, notified
from outbox.postgres.queries import quote_ident, validate_schema

log = logging.getLogger("outbox.pglog")

#: Seconds between two looks at the group (members, topics, free partitions).
REBALANCE_INTERVAL = 1.0
#: Longest wait before connecting again after the log database was lost (seconds).
MAX_RECONNECT_DELAY = 5.0


class PgLogSubscriber:
    """Reads `topics` as a member of `group`; the group's position moves only by `commit`.

    Partitions are shared among the group's live members through session advisory locks on
    the log database, one per (group, partition): each member holds a fair share of each
    topic's partitions, ceil(partitions / members reading the topic), as the relays share
    lanes (outbox/daemons/lanes.py). A lock dies with its session, so a killed member's
    partitions are taken over at the others' next look (every `rebalance_interval`). A member
    gives a partition up only once it committed everything it read from it (it stops reading
    it first), so no record is read by two members of a group unless one of them died.

    `poll` returns the records after this member's positions and waits for a NOTIFY from a
    publisher (sent only while some member announced a nap) or `timeout`, whichever comes
    first; a lost notification delays a record by at most `timeout`.
    """

    def __init__(
        self,
        url: str,
        topics: Sequence[str],
        group: str,
        schema: str = DEFAULT_SCHEMA,
        *,
        rebalance_interval: float = REBALANCE_INTERVAL,
        connect_timeout: float = 10.0,
    ) -> None:
        if not group:
            raise ConfigurationError("a consumer group is required")
        if not topics:
            raise ConfigurationError("at least one topic is required")
        for topic in topics:
            validate_topic(topic)
        self.url = url
        self.topics = tuple(dict.fromkeys(topics))
        self.group = group
        self.schema = validate_schema(schema)
        self.rebalance_interval = rebalance_interval
        self.connect_timeout = connect_timeout
        self.member_id = process_id()
        self._sql = queries(schema)
        self._channel = wake_channel(schema)
        self._conn: Connection | None = None
        self._group_id = 0
        self._lock_class = 0
        self._topics = Topics(schema)
        #: Partitions held: id -> next offset to read; `_committed`: the group's next offset
        #: as this member last stored it. `_draining`: held, no longer read, given up once
        #: their position is committed.
        self._positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._draining: set[int] = set()
        self._sleeping = False
        #: Records were found at every look for `AWAKE_AFTER` seconds while the nap was
        #: announced: `commit` ends the nap. `_busy_since`: since when every look found records.
        self._awake = False
        self._busy_since: float | None = None
        self._next_rebalance = 0.0
        self._next_connect = 0.0
        self._reconnect_delay = 0.1
        self._turn = 0
        self._closed = False

    # -- the connection --------------------------------------------------------------------------

    @property
    def partitions(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this member reads now."""
        # Copies first: another thread (a test, a health check) may ask while poll() runs.
        held, draining = list(self._positions), set(self._draining)
        return sorted(self._topics.names[p] for p in held if p not in draining)

    def _connection(self) -> Connection | None:
        """The member's session (joining the group on a new one); None while unreachable."""
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._forget_session()
        if time.monotonic() < self._next_connect:
            return None
        try:
            conn = connect(
                self.url, timeout=self.connect_timeout, application_name="outbox-log-subscriber"
            )
            row = conn.execute(self._sql["log_group"], {"name": self.group}).fetchone()
            if row is None:  # created concurrently, after this statement's snapshot
                row = conn.execute(self._sql["log_group"], {"name": self.group}).fetchone()
            assert row is not None
            self._group_id = int(row[0])
            self._lock_class = lock_class(self.schema, self._group_id)
            conn.execute(self._sql["log_members_forget_dead"])
            conn.execute(
                self._sql["log_member_register"],
                {
                    "member_id": self.member_id,
                    "group_id": self._group_id,
                    "topics": list(self.topics),
                },
            )
            conn.execute(f"LISTEN {quote_ident(self._channel)}")
        except psycopg.Error as exc:
            self._lost(exc)
            return None
        self._conn = conn
        self._reconnect_delay = 0.1
        self._next_rebalance = 0.0
        return conn

    def _lost(self, exc: BaseException) -> None:
        """The session is gone, and with it every partition lock: start again later."""
        log.warning(
            "log subscriber (group %s) lost the log database, retrying in %.1fs: %s",
            self.group,
            self._reconnect_delay,
            redact_text(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)),
        )
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._forget_session()
        self._next_connect = time.monotonic() + self._reconnect_delay
        self._reconnect_delay = min(2 * self._reconnect_delay, MAX_RECONNECT_DELAY)

    def _forget_session(self) -> None:
        self._positions.clear()
        self._committed.clear()
        self._draining.clear()
        self._sleeping = self._awake = False
        self._busy_since = None

    # -- sharing the partitions ----------------------------------------------------------------

    def _rebalance(self, conn: Connection) -> None:
        """Hold a fair share of each topic's partitions: take free ones up to it, and start
        draining what is above it."""
        now = time.monotonic()
        if now < self._next_rebalance:
            return
        self._next_rebalance = now + self.rebalance_interval
        sql = self._sql
        conn.execute(sql["log_members_forget_dead"])
        self._topics.load(conn, self.topics)
        members: dict[str, int] = {
            str(t): int(n)
            for t, n in conn.execute(sql["log_members_per_topic"], {"group_id": self._group_id})
        }
        held: set[int] | None = None
        for topic in self.topics:
            ids = self._topics.partitions.get(topic)
            if not ids:
                continue  # not created yet: no publisher wrote to it
            target = math.ceil(len(ids) / max(1, members.get(topic, 1)))
            mine = [p for p in ids if p in self._positions]
            reading = [p for p in mine if p not in self._draining]
            if len(reading) > target:
                self._draining.update(sorted(reading)[target:])
            elif len(reading) < target:
                for p in sorted(p for p in mine if p in self._draining):
                    if len(reading) >= target:
                        break
                    self._draining.discard(p)
                    reading.append(p)
                if len(reading) < target:
                    if held is None:
                        lock = {"lock_class": self._lock_class}
                        held = {int(r[0]) for r in conn.execute(sql["log_partitions_held"], lock)}
                    free = [p for p in ids if p not in held]
                    random.shuffle(free)
                    for p in free:
                        if len(reading) >= target:
                            break
                        if self._take(conn, p):
                            reading.append(p)
        self._release_drained(conn)

    def _take(self, conn: Connection, partition_id: int) -> bool:
        key = lock_key(self._lock_class, partition_id)
        got = conn.execute(self._sql["log_partition_lock"], {"key": key}).fetchone()
        if not (got and got[0]):
            return False
        # Read after the lock is held: the previous owner committed before it let go.
        row = conn.execute(
            self._sql["log_start_position"],
            {"group_id": self._group_id, "partition_id": partition_id},
        ).fetchone()
        start = int(row[0]) if row else 0
        self._positions[partition_id] = self._committed[partition_id] = start
        log.debug("group %s member %s took partition %d", self.group, self.member_id, partition_id)
        return True

    def _release_drained(self, conn: Connection) -> None:
        """Give up the draining partitions whose records read are all committed."""
        for p in sorted(self._draining):
            if self._positions[p] <= self._committed[p]:
                conn.execute(
                    self._sql["log_partition_unlock"], {"key": lock_key(self._lock_class, p)}
                )
                self._draining.discard(p)
                del self._positions[p], self._committed[p]

    # -- the port --------------------------------------------------------------------------------

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        """Records after this member's positions, up to `max_records`, waiting up to `timeout`
        seconds for the first."""
        if self._closed:
            raise RuntimeError("poll() on a closed PgLogSubscriber")
        deadline = time.monotonic() + timeout
        while True:
            conn = self._connection()
            if conn is not None:
                try:
                    rows = self._poll_once(conn, max_records, deadline)
                except psycopg.Error as exc:
                    self._lost(exc)
                    rows = None
                if rows:
                    return rows
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return InboxBatch()
            if conn is None or rows is None:
                time.sleep(min(remaining, max(0.0, self._next_connect - time.monotonic())))

    def _poll_once(self, conn: Connection, max_records: int, deadline: float) -> InboxBatch | None:
        """Fetch once; when nothing is there, announce the nap (then look once more), or wait
        for a notification until `deadline`. Empty when the caller should look again."""
        self._rebalance(conn)
        rows = self._fetch(conn, max_records)
        if rows:
            # Under sustained load the nap ends (publishers stop notifying; outbox/core/naps.py),
            # by `commit`, after the batch is stored: the flag only spares publishers a NOTIFY,
            # and a round trip here would delay these records.
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = now
            self._awake = self._sleeping and now - self._busy_since >= AWAKE_AFTER
            return rows
        self._busy_since = None
        self._awake = False  # still napping as far as the publishers know: no new announcement
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return rows
        if not self._sleeping:
            # Announce the nap, then look once more: a record committed before the flag was
            # visible to its publisher would otherwise wait for the next look.
            self._set_sleeping(conn, True)
            return rows
        wait = min(remaining, max(0.001, self._next_rebalance - time.monotonic()))
        notified(conn, wait)
        return rows

    def _set_sleeping(self, conn: Connection, sleeping: bool) -> None:
        conn.execute(
            self._sql["log_member_sleeping"], {"member_id": self.member_id, "sleeping": sleeping}
        )
        self._sleeping = sleeping

    def _fetch(self, conn: Connection, max_records: int) -> InboxBatch:
        batch = InboxBatch()
        reading = [p for p in sorted(self._positions) if p not in self._draining]
        if not reading:
            return batch
        # Start with another partition each time, so that a busy one does not starve the rest.
        self._turn = (self._turn + 1) % len(reading)
        reading = reading[self._turn :] + reading[: self._turn]
        cursor = conn.cursor(binary=True)
        records = cursor.execute(
            self._sql["log_fetch"],
            {
                "partition_ids": reading,
                "positions": [self._positions[p] for p in reading],
                "limit": max_records,
            },
        ).fetchall()
        names = self._topics.names
        add = batch.add
        for partition_id, offset, key, value, headers, created_ms in records:
            topic, partition = names[partition_id]
            add(
                topic,
                partition,
                offset,
                key,
                value,
                _headers(headers),
                created_ms,
            )
            self._positions[partition_id] = offset + 1
        return batch

    def commit(self, batch: InboxBatch) -> None:
        """Store the group's next offsets after `batch`; a failure is logged (a redelivery)."""
        ids = self._topics.partitions
        last = {
            ids[topic][partition]: o - 1 for (topic, partition), o in batch.next_offsets().items()
        }
        if not last:
            return
        conn = self._connection()
        if conn is None:
            log.warning("offset commit failed (the batch will be redelivered): no connection")
            return
        params = {
            "group_id": self._group_id,
            "partition_ids": list(last),
            "next_offsets": [o + 1 for o in last.values()],
        }
        try:
            conn.execute(self._sql["log_commit"], params)
            if self._awake and self._sleeping:
                self._set_sleeping(conn, False)
            self._awake = False
            for p, o in last.items():
                if p in self._committed:
                    self._committed[p] = max(self._committed[p], o + 1)
            self._release_drained(conn)
        except psycopg.Error as exc:
            log.warning("offset commit failed (the batch will be redelivered): %s", exc)
            self._lost(exc)

    def close(self) -> None:
        """Leave the group: its partitions go to the other members at their next look."""
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        self._conn = None
        if conn is None or conn.closed:
            return
        try:
            if not conn.broken:
                conn.execute(self._sql["log_member_unregister"], {"member_id": self.member_id})
        except psycopg.Error as exc:
            log.debug("log subscriber close: %s", exc)
        finally:
            conn.close()  # the session ends: its advisory locks go with it


def _headers(data: bytes | None) -> RawHeaders:
    """A record's headers; headers not in the log's form (written by something other than
    outbox's publisher) quarantine the record instead of stopping the subscriber."""
    try:
        return decode_headers(data)
    except ValueError as exc:
        return UnreadableHeaders.because(exc)
