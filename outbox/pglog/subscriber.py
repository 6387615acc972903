"""A `Subscriber` on the PostgreSQL log: one member of a consumer group."""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Sequence

import psycopg
import psycopg.errors

from outbox.core.batches import InboxBatch
from outbox.core.errors import ConfigurationError, SchemaNotMigrated
from outbox.core.ids import process_id
from outbox.core.naps import AWAKE_AFTER
from outbox.core.redact import redact_text
from outbox.core.retriable import retriable
from outbox.core.text import first_line
from outbox.core.topics import validate_topic
from outbox.core.wire import RawHeaders, UnreadableHeaders
from outbox.pglog.log import (
    DEFAULT_SCHEMA,
    Connection,
    Topics,
    decode_headers,
    lock_key,
    old_lock_class,
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
#: Seconds a member's heartbeat may age before the other members of its group evict it
#: (`--log-session-timeout`; Kafka's `session.timeout.ms`).
SESSION_TIMEOUT = 10.0
#: The shortest session timeout: below it a member would beat and evict its group's members
#: in a busy loop (Kafka's broker refuses one below group.min.session.timeout.ms, 6 s).
MIN_SESSION_TIMEOUT = 1.0
#: Seconds a member keeps heartbeating while its owner calls neither `poll` nor `commit`
#: (Kafka's `max.poll.interval.ms`): a loop stuck longer loses its partitions.
MAX_POLL_INTERVAL = 300.0

#: Appends of each partition a member remembers as (append id, first and last offset it read):
#: where the log goes back under it, it reads again after the last of them the log still has
#: (docs/decisions/0019); further back than that, from the earliest record kept.
MARKS = 64

#: The partition locks a member takes (`log_members.protocol`): 2, keyed by the log schema's OID
#: and `log_group_locks.lock_id` (log0004, which refuses the rows of members without it).
PROTOCOL = 2

#: The longest group name the log stores, in UTF-8 bytes: its unique index holds at most about
#: 2,700 bytes per entry (a longer name would fail every join, retried as an outage).
MAX_GROUP_BYTES = 2000

#: What PostgreSQL says when the log's tables or columns are not there: not migrated.
_NOT_MIGRATED = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)


def check_session_timeout(seconds: float) -> None:
    """Raise ConfigurationError unless `seconds` is a session timeout a group can keep."""
    if not seconds >= MIN_SESSION_TIMEOUT:  # NaN too
        raise ConfigurationError(
            f"log session timeout must be at least {MIN_SESSION_TIMEOUT:g} s, got "
            f"{seconds:g} (--log-session-timeout)"
        )


class PgLogSubscriber:
    """Reads `topics` as a member of `group`; the group's position moves only by `commit`.

    Partitions are shared among the group's live members through session advisory locks on
    the log database, one per (group, partition): each member holds a fair share of each
    topic's partitions, ceil(partitions / members reading the topic), as the relays share
    lanes (outbox/daemons/relay.py). A lock dies with its session, so a killed member's
    partitions are taken over at the others' next look (every `rebalance_interval`). A member
    gives a partition up only once it committed everything it read from it (it stops reading
    it first), so no record is read by two members of a group unless one of them died or was
    evicted.

    Liveness, as Kafka's: a member heartbeats (a thread, every `rebalance_interval` at most,
    while its owner called `poll` or `commit` within `max_poll_interval`); the others end the
    session of a member whose heartbeat is older than its `session_timeout` (a frozen or
    stuck process), and its partitions are theirs at their next look. A member whose session
    was ended commits nothing more: its commit fails with the session, and it commits only
    partitions its current session holds. Ending another member's session needs the same
    database role or pg_signal_backend; without it a stale member keeps its partitions (one
    warning).

    The log going back under the member (a backup restored, records deleted by hand and a
    counter set back) is checked in each fetch, by the partition's end and by the append id of
    the record before the member's position; such a partition is read again from where the
    member's history and the log's part, else from the earliest record kept, with one warning
    (docs/decisions/0019). Partition locks are keyed by the log schema's OID and a lock id
    unique in the schema, so logs in one database never share one.

    `poll` returns the records after this member's positions and waits for a NOTIFY from a
    publisher (sent only while some member announced a nap) or `timeout`, whichever comes
    first; a lost notification delays a record by at most `timeout`. A lost connection is
    retried with backoff; a log schema not there or not migrated raises `SchemaNotMigrated`, a
    privilege the role lacks `ConfigurationError`.
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
        session_timeout: float = SESSION_TIMEOUT,
        max_poll_interval: float = MAX_POLL_INTERVAL,
    ) -> None:
        if not group:
            raise ConfigurationError("a consumer group is required")
        if len(group.encode(errors="surrogatepass")) > MAX_GROUP_BYTES:
            raise ConfigurationError(
                f"consumer group name of {len(group.encode(errors='surrogatepass'))} bytes: the "
                f"PostgreSQL log stores names of at most {MAX_GROUP_BYTES} bytes (UTF-8)"
            )
        if not topics:
            raise ConfigurationError("at least one topic is required")
        for topic in topics:
            validate_topic(topic)
        for name, value in (
            ("rebalance_interval", rebalance_interval),
            ("session_timeout", session_timeout),
            ("max_poll_interval", max_poll_interval),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name} must be > 0 seconds (a finite number)")
        check_session_timeout(session_timeout)
        self.url = url
        self.topics = tuple(dict.fromkeys(topics))
        self.group = group
        #: The group as log lines name it (a long name cut short).
        self._label = group if len(group) <= 60 else f"{group[:57]}..."
        self.schema = validate_schema(schema)
        self.rebalance_interval = rebalance_interval
        self.connect_timeout = connect_timeout
        self.session_timeout = session_timeout
        self.max_poll_interval = max_poll_interval
        self.member_id = process_id()
        self._sql = queries(schema)
        self._channel = wake_channel(schema)
        self._conn: Connection | None = None
        self._group_id = 0
        #: The upper half of the partition locks' keys (the log schema's OID), and that of
        #: an older outbox's member of the group (None: it cannot have one). `_lock_ids`:
        #: partition id -> lock id of this group (`log_group_locks`); `_keys`: partition id
        #: -> the key of the lock this member's session holds.
        self._space = 0
        self._old_class: int | None = None
        self._lock_ids: dict[int, int] = {}
        self._keys: dict[int, int] = {}
        self._topics = Topics(schema)
        #: Partitions held: id -> next offset to read; `_committed`: the group's next offset
        #: as this member last stored it. `_draining`: held, no longer read, given up once
        #: their position is committed. `_names`: id -> (topic, partition) of those held.
        self._positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._draining: set[int] = set()
        self._names: dict[int, tuple[str, int]] = {}
        #: Per partition held, the last `MARKS` appends read, oldest first: [append id, first
        #: offset, last offset read]. `_read_again`: where a partition that went back under
        #: this member is read again from (a batch read before commits no further).
        self._marks: dict[int, list[list[int]]] = {}
        self._read_again: dict[int, int] = {}
        self._sleeping = False
        #: Records were found at every look for `AWAKE_AFTER` seconds while the nap was
        #: announced: `commit` ends the nap. `_busy_since`: since when every look found records.
        self._awake = False
        self._busy_since: float | None = None
        #: Offsets `commit` took and not yet stored: partition id -> (next offset, append id
        #: of the record before it). Sent with the next fetch, in its round trip; alone
        #: before a rebalance, while a partition drains, and at `close`. Dropped with the
        #: session: the partitions may have other owners after a reconnect.
        self._pending: dict[int, tuple[int, int | None]] = {}
        self._next_rebalance = 0.0
        self._next_connect = 0.0
        self._reconnect_delay = 0.1
        self._next_warning = 0.0
        self._failures = 0
        self._turn = 0
        self._closed = False
        #: The session (`_conn`) is used by the caller's thread and the heartbeat thread, one
        #: at a time. `_active_at`: the caller's last poll or commit; `_beat_at`: last beat.
        self._io = threading.RLock()
        self._beat_interval = min(rebalance_interval, session_timeout / 3)
        self._active_at = time.monotonic()
        self._beat_at = 0.0
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None
        #: Stale members this one may not evict (warned about once each).
        self._refused: set[str] = set()

    # -- the connection --------------------------------------------------------------------------

    @property
    def partitions(self) -> list[tuple[str, int]]:
        """The (topic, partition) pairs this member reads now."""
        # Copies first: another thread (a test, a health check) may ask while poll() runs.
        held, draining, names = list(self._positions), set(self._draining), dict(self._names)
        return sorted(names[p] for p in held if p not in draining and p in names)

    def _connection(self) -> Connection | None:
        """The member's session (joining the group on a new one); None while unreachable."""
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._forget_session()
        if time.monotonic() < self._next_connect:
            return None
        conn: Connection | None = None
        try:
            conn = connect(
                self.url, timeout=self.connect_timeout, application_name="outbox-log-subscriber"
            )
            row = conn.execute(self._sql["log_group"], {"name": self.group}).fetchone()
            if row is None:  # created concurrently, after this statement's snapshot
                row = conn.execute(self._sql["log_group"], {"name": self.group}).fetchone()
            assert row is not None
            self._group_id = int(row[0])
            space = conn.execute(self._sql["log_schema_oid"]).fetchone()
            assert space is not None
            self._space = int(space[0])
            self._old_class = old_lock_class(self.schema, self._group_id)
            conn.execute(self._sql["log_members_forget_dead"])
            self._register(conn)
            conn.execute(f"LISTEN {quote_ident(self._channel)}")
        except psycopg.Error as exc:
            if conn is not None:
                conn.close()
            self._failed(exc)
            return None
        self._conn = conn
        self._next_rebalance = 0.0
        if self._heart is None:
            self._heart = threading.Thread(
                target=self._heartbeats, name=f"outbox-log-heartbeat-{self._label}", daemon=True
            )
            self._heart.start()
        return conn

    def _register(self, conn: Connection) -> None:
        conn.execute(
            self._sql["log_member_register"],
            {
                "member_id": self.member_id,
                "group_id": self._group_id,
                "topics": list(self.topics),
                "sleeping": self._sleeping,
                "session_timeout": self.session_timeout,
                "protocol": PROTOCOL,
            },
        )
        self._beat_at = time.monotonic()

    def _failed(self, exc: psycopg.Error, doing: str = "") -> None:
        """A statement failed: raise what retrying cannot fix (the log schema not there or not
        migrated, a privilege missing, a statement refused); else (the session is lost) start
        again later, with backoff, warning at most once per backoff step."""
        if isinstance(exc, _NOT_MIGRATED):
            raise SchemaNotMigrated(
                f"the log database has no log schema {self.schema!r}, or an older one "
                f"({first_line(exc)}): run `outbox migrate --log-url URL --log-schema "
                f"{self.schema}`"
            ) from None
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            raise ConfigurationError(
                f"the log database refused the subscriber of group {self._label!r}: "
                f"{first_line(exc)}: grant its role the privileges on log schema "
                f"{self.schema!r} (read and write its tables)"
            ) from None
        lost = self._conn is not None and (self._conn.broken or self._conn.closed)
        if not (lost or retriable(exc)):
            raise exc  # a refusal retrying cannot change (outbox.core.retriable)
        self._failures += 1
        now = time.monotonic()
        if now >= self._next_warning:
            more = self._failures - 1
            log.warning(
                "log subscriber (group %s) lost the log database%s, retrying in %.1fs: %s%s",
                self._label,
                doing,
                self._reconnect_delay,
                redact_text(first_line(exc) or repr(exc)),
                f" ({more} more failures since the last warning)" if more else "",
            )
            self._failures = 0
            self._next_warning = now + max(1.0, self._reconnect_delay)
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._forget_session()
        self._next_connect = now + self._reconnect_delay
        self._reconnect_delay = min(2 * self._reconnect_delay, MAX_RECONNECT_DELAY)

    def _forget_session(self) -> None:
        self._pending.clear()
        self._positions.clear()
        self._committed.clear()
        self._draining.clear()
        self._names.clear()
        self._marks.clear()
        self._read_again.clear()
        self._lock_ids.clear()
        self._keys.clear()
        self._sleeping = self._awake = False
        self._busy_since = None

    # -- liveness --------------------------------------------------------------------------------

    def _beat(self, conn: Connection) -> None:
        """Prove this member alive; register again if its row is gone."""
        row = conn.execute(
            self._sql["log_member_heartbeat"], {"member_id": self.member_id}
        ).fetchone()
        if row is None:
            self._register(conn)
        self._beat_at = time.monotonic()

    def _heartbeats(self) -> None:
        """The heartbeat thread: beats while the owner polls or commits, so that a member busy
        storing a batch is not evicted, and a frozen one is."""
        stalled = False
        while not self._stop.wait(max(0.01, self._beat_interval / 2)):
            now = time.monotonic()
            if now - self._active_at > self.max_poll_interval:
                if not stalled:
                    log.warning(
                        "log subscriber (group %s) was not polled for %.1fs (max poll "
                        "interval): it stops heartbeating, and loses its partitions after its "
                        "session timeout (%gs)",
                        self._label,
                        now - self._active_at,
                        self.session_timeout,
                    )
                stalled = True
                continue
            stalled = False
            if now - self._beat_at < self._beat_interval:
                continue
            if not self._io.acquire(timeout=self._beat_interval):
                continue  # the owner is using the session: it beats in its rebalance
            try:
                conn = self._conn
                if self._closed or conn is None or conn.closed or conn.broken:
                    continue
                self._beat(conn)
            except psycopg.Error as exc:
                # The owner meets the same failure at its next statement, and handles it.
                log.debug("log subscriber heartbeat failed: %s", first_line(exc))
            finally:
                self._io.release()

    def _evict_stale(self, conn: Connection) -> None:
        """End the sessions of the group's members whose heartbeat is older than their
        session timeout: their locks, so their partitions, are free at the next look."""
        sql = self._sql
        stale = conn.execute(
            sql["log_members_stale"], {"group_id": self._group_id, "member_id": self.member_id}
        ).fetchall()
        for member_id, backend_pid in stale:
            try:
                with conn.transaction():
                    ended = conn.execute(
                        sql["log_member_evict"],
                        {"group_id": self._group_id, "member_id": member_id},
                    ).fetchall()
            except psycopg.errors.InsufficientPrivilege as exc:
                if member_id not in self._refused:
                    self._refused.add(member_id)
                    log.warning(
                        "group %s: member %s (log database backend pid %d) stopped "
                        "heartbeating, but this member may not end its session (%s): its "
                        "partitions stay with it until its session ends. Run a group's "
                        "consumers as one database role, or grant theirs pg_signal_backend",
                        self._label,
                        member_id,
                        backend_pid,
                        first_line(exc),
                    )
                continue
            for (pid,) in ended:
                log.warning(
                    "group %s: evicted member %s (log database backend pid %d): no heartbeat "
                    "for longer than its session timeout; its partitions go to the others",
                    self._label,
                    member_id,
                    pid,
                )

    # -- sharing the partitions ----------------------------------------------------------------

    def _rebalance(self, conn: Connection) -> None:
        """Hold a fair share of each topic's partitions: take free ones up to it, and start
        draining what is above it. Topics and partitions are read again each time, so added
        ones are read and removed ones given up."""
        now = time.monotonic()
        if now < self._next_rebalance:
            return
        self._next_rebalance = now + self.rebalance_interval
        sql = self._sql
        self._beat(conn)
        conn.execute(sql["log_members_forget_dead"])
        self._evict_stale(conn)
        topics = Topics(self.schema)
        topics.load(conn, self.topics)
        self._topics = topics
        for p in sorted(set(self._positions) - set(topics.names)):
            log.warning(
                "group %s: partition %d of topic %s is gone from the log: no longer read",
                self._label,
                self._names[p][1],
                self._names[p][0],
            )
            self._give_up(conn, p)
        members: dict[str, int] = {
            str(t): int(n)
            for t, n in conn.execute(sql["log_members_per_topic"], {"group_id": self._group_id})
        }
        held: set[int] | None = None
        for topic in self.topics:
            ids = topics.partitions.get(topic)
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
                        held = self._held(conn)
                    free = [p for p in ids if p not in held]
                    self._know_lock_ids(conn, free)
                    random.shuffle(free)
                    for p in free:
                        if len(reading) >= target:
                            break
                        if self._take(conn, p, topics.names[p]):
                            reading.append(p)
        self._release_drained(conn)

    def _held(self, conn: Connection) -> set[int]:
        """The partitions of this group some session holds (this member's too)."""
        params = {"group_id": self._group_id, "space": self._space, "old_class": self._old_class}
        return {int(r[0]) for r in conn.execute(self._sql["log_partitions_held"], params)}

    def _know_lock_ids(self, conn: Connection, partition_ids: list[int]) -> None:
        """Read (making them on first use) the lock ids of `partition_ids` not known yet."""
        missing = [p for p in partition_ids if p not in self._lock_ids]
        if missing:
            params = {"group_id": self._group_id, "partition_ids": missing}
            for partition_id, lock_id in conn.execute(self._sql["log_group_lock_ids"], params):
                self._lock_ids[int(partition_id)] = int(lock_id)

    def _take(self, conn: Connection, partition_id: int, name: tuple[str, int]) -> bool:
        lock_id = self._lock_ids.get(partition_id)
        if lock_id is None:
            return False  # made by another member meanwhile: known at the next look
        key = lock_key(self._space, lock_id)
        got = conn.execute(self._sql["log_partition_lock"], {"key": key}).fetchone()
        if not (got and got[0]):
            return False
        # Read after the lock is held: the previous owner committed before it let go.
        row = conn.execute(
            self._sql["log_start_position"],
            {"group_id": self._group_id, "partition_id": partition_id},
        ).fetchone()
        if row is None:  # the partition's row was deleted meanwhile
            conn.execute(self._sql["log_partition_unlock"], {"key": key})
            self._lock_ids.pop(partition_id, None)
            return False
        self._keys[partition_id] = key
        start, committed, end, went_back, append_id = (
            int(row[0]),
            row[1],
            int(row[2]),
            row[3],
            row[4],
        )
        if went_back:
            log.warning(
                "group %s: topic %s partition %d went back while no member held it: the "
                "group's committed offset %d is %s (end %d; the log was restored from a "
                "backup, or its newest records deleted by hand); the group reads it again "
                "from offset %d, the earliest record kept (as a new group starts): records "
                "read before are delivered again, the inbox drops them",
                self._label,
                name[0],
                name[1],
                committed,
                "past its end" if committed > end else "after a record it did not read",
                end,
                start,
            )
        elif committed is not None and committed != start:
            log.warning(
                "group %s: committed offset %d of topic %s partition %d is %s (end %d; "
                "written by hand, or the partition was recreated): the group now reads it "
                "from offset %d",
                self._label,
                committed,
                name[0],
                name[1],
                "past its end" if committed > end else "negative",
                end,
                start,
            )
        self._positions[partition_id] = self._committed[partition_id] = start
        self._names[partition_id] = name
        self._marks[partition_id] = [] if append_id is None else [[append_id, start - 1, start - 1]]
        self._read_again.pop(partition_id, None)
        log.debug("group %s member %s took partition %d", self._label, self.member_id, partition_id)
        return True

    def _give_up(self, conn: Connection, partition_id: int) -> None:
        key = self._keys.pop(partition_id, None)
        if key is not None:
            conn.execute(self._sql["log_partition_unlock"], {"key": key})
        self._lock_ids.pop(partition_id, None)
        self._draining.discard(partition_id)
        self._positions.pop(partition_id, None)
        self._committed.pop(partition_id, None)
        self._names.pop(partition_id, None)
        self._marks.pop(partition_id, None)
        self._read_again.pop(partition_id, None)

    def _release_drained(self, conn: Connection) -> None:
        """Give up the draining partitions whose records read are all committed."""
        for p in sorted(self._draining):
            if self._positions[p] <= self._committed[p]:
                self._give_up(conn, p)

    # -- the port --------------------------------------------------------------------------------

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        """Records after this member's positions, up to `max_records`, waiting up to `timeout`
        seconds for the first."""
        if self._closed:
            raise RuntimeError("poll() on a closed PgLogSubscriber")
        deadline = time.monotonic() + timeout
        while True:
            self._active_at = time.monotonic()
            with self._io:
                conn = self._connection()
                rows: InboxBatch | None = None
                if conn is not None:
                    try:
                        rows = self._poll_once(conn, max_records, deadline)
                        self._reconnect_delay = 0.1
                    except psycopg.Error as exc:
                        self._failed(exc)
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
        if self._pending and (self._draining or time.monotonic() >= self._next_rebalance):
            # A draining partition is given up, and a rebalance may give partitions up, only
            # once what was read from them is committed.
            self._flush(conn)
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
        """The next records of the partitions read, with the offsets `commit` left pending
        sent in the same round trip (one pipeline, one implicit transaction)."""
        batch = InboxBatch()
        reading = [p for p in sorted(self._positions) if p not in self._draining]
        if not reading:
            self._flush(conn)
            return batch
        # Start with another partition each time, so that a busy one does not starve the rest.
        self._turn = (self._turn + 1) % len(reading)
        reading = reading[self._turn :] + reading[: self._turn]
        positions = [self._positions[p] for p in reading]
        cursor = conn.cursor(binary=True)
        params = {
            "partition_ids": reading,
            "positions": positions,
            "append_ids": [
                self._append_id(p, o - 1) for p, o in zip(reading, positions, strict=True)
            ],
            "limit": max_records,
        }
        if self._pending:
            with conn.pipeline():
                self._commit_pending(conn)
                cursor.execute(self._sql["log_fetch"], params)
        else:
            cursor.execute(self._sql["log_fetch"], params)
        records = cursor.fetchall()
        names = self._names
        marks_of = self._marks
        add = batch.add
        went_back: list[tuple[int, int]] = []
        for partition_id, offset, key, value, headers, created_ms, append_id, end in records:
            if offset is None:  # the partition went back under this member (first rows)
                went_back.append((partition_id, end))
                continue
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
            if append_id is None:
                continue
            marks = marks_of[partition_id]
            last = marks[-1] if marks else None
            if last is not None and last[0] == append_id and last[2] == offset - 1:
                last[2] = offset
            else:
                marks.append([append_id, offset, offset])
                if len(marks) > MARKS:
                    del marks[0]
        for partition_id, end in went_back:
            self._went_back(conn, partition_id, end)
        return batch

    def _append_id(self, partition_id: int, offset: int) -> int | None:
        """The append id of the record at `offset` of a partition held, as this member read
        it; None when it does not remember it."""
        for append_id, first, last in reversed(self._marks.get(partition_id, ())):
            if offset > last:
                return None
            if offset >= first:
                return append_id
        return None

    def _went_back(self, conn: Connection, partition_id: int, end: int) -> None:
        """The partition went back under this member (`log_fetch`): read it again from where
        its history and the log's part (`log_went_back`), and say so once."""
        position = self._positions[partition_id]
        marks = self._marks.get(partition_id, [])
        row = conn.execute(
            self._sql["log_went_back"],
            {
                "group_id": self._group_id,
                "partition_id": partition_id,
                "position": position,
                "append_ids": [m[0] for m in marks],
                "firsts": [m[1] for m in marks],
                "lasts": [m[2] for m in marks],
            },
        ).fetchone()
        if row is None:
            return  # the partition is gone: the next look gives it up
        read_from, end, append_id, how, committed = int(row[0]), int(row[1]), row[2], row[3], row[4]
        topic, partition = self._names[partition_id]
        log.warning(
            "group %s: topic %s partition %d went back under this member (position %d, "
            "end %d: the log was restored from a backup, or its newest records were deleted "
            "by hand and its counter set back); the group reads it again from offset %d, %s",
            self._label,
            topic,
            partition,
            position,
            end,
            read_from,
            _READ_AGAIN[str(how)],
        )
        self._positions[partition_id] = read_from
        if committed is not None:
            self._committed[partition_id] = min(self._committed[partition_id], int(committed))
        self._read_again[partition_id] = read_from
        # Everything below `read_from` is as this member read it; nothing from it on is.
        kept = [m for m in marks if m[1] < read_from]
        for m in kept:
            m[2] = min(m[2], read_from - 1)
        if append_id is not None and not (kept and kept[-1][2] == read_from - 1):
            kept.append([append_id, read_from - 1, read_from - 1])
        self._marks[partition_id] = kept[-MARKS:]

    def commit(self, batch: InboxBatch) -> None:
        """Take the group's next offsets after `batch`, in the partitions this member's
        session holds (read by it): stored with the next `poll`'s fetch, in its round trip (or
        alone before a rebalance, while a partition drains, and at `close`), as Kafka's
        asynchronous commit. A failure, or a partition no longer held, is logged (its records
        are delivered again, to its owner)."""
        next_offsets = batch.next_offsets()
        if not next_offsets:
            return
        self._active_at = time.monotonic()
        with self._io:
            held = {name: p for p, name in self._names.items()}
            taken = 0
            for name, o in next_offsets.items():
                p = held.get(name)
                if p is None:
                    continue
                if o > self._positions[p]:
                    if p not in self._read_again:
                        continue
                    # Read before the partition went back under this member: its records
                    # from where the partition is read again on are not the log's any more.
                    o = self._read_again[p]
                taken += 1
                was = self._pending.get(p)
                if was is None or o >= was[0]:
                    self._pending[p] = (o, self._append_id(p, o - 1))
            if taken < len(next_offsets):
                log.warning(
                    "log subscriber (group %s): offsets of %d partitions not committed: this "
                    "member no longer holds them (its session was lost or ended); their "
                    "records are delivered again, to their owner",
                    self._label,
                    len(next_offsets) - taken,
                )

    def flush(self) -> None:
        """Store the offsets `commit` took now, not with the next fetch."""
        with self._io:
            conn = self._conn
            if conn is None or conn.closed or not self._pending:
                return
            try:
                self._flush(conn)
            except psycopg.Error as exc:
                self._failed(exc, " committing offsets (the batch will be delivered again)")

    def _flush(self, conn: Connection) -> None:
        """Store the pending offsets in a round trip of their own, then give up the draining
        partitions whose records read are all committed."""
        self._commit_pending(conn)
        self._release_drained(conn)

    def _commit_pending(self, conn: Connection) -> None:
        """Send `log_commit` for the pending offsets, and end the nap when records kept
        coming; they count as this member's committed ones (a failure of the statement, seen
        here or at the end of the caller's pipeline, forgets the session with them)."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        conn.execute(
            self._sql["log_commit"],
            {
                "group_id": self._group_id,
                "partition_ids": list(pending),
                "next_offsets": [o for o, _ in pending.values()],
                "append_ids": [a for _, a in pending.values()],
            },
        )
        if self._awake and self._sleeping:
            self._set_sleeping(conn, False)
        self._awake = False
        for p, (o, _) in pending.items():
            if p in self._committed:
                self._committed[p] = max(self._committed[p], o)

    def close(self) -> None:
        """Leave the group: its partitions go to the other members at their next look."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._heart is not None and self._heart is not threading.current_thread():
            self._heart.join(timeout=5)
        with self._io:
            conn = self._conn
            self._conn = None
            if conn is None or conn.closed:
                return
            try:
                if not conn.broken:
                    self._commit_pending(conn)
                    conn.execute(self._sql["log_member_unregister"], {"member_id": self.member_id})
            except psycopg.Error as exc:
                log.debug("log subscriber close: %s", exc)
            finally:
                conn.close()  # the session ends: its advisory locks go with it


#: How `log_went_back` found where to read a partition again, as the warning says it.
_READ_AGAIN = {
    "read": "after the last record this member read that the log still has",
    "committed": "the group's committed offset, whose record the log still has",
    "earliest": (
        "the earliest record kept, as a new group starts (the records this member read are "
        "not in the log any more, or have no append id): records read before are delivered "
        "again, the inbox drops them"
    ),
}


def _headers(data: bytes | None) -> RawHeaders:
    """A record's headers; headers not in the log's form (written by something other than
    outbox's publisher) quarantine the record instead of stopping the subscriber."""
    try:
        return decode_headers(data)
    except ValueError as exc:
        return UnreadableHeaders.because(exc)
