"""The advisory locks through which a log group's members share its partitions (issue 31): two
logs in one database never contend for one lock, whatever their schemas are called, and a
member of an older outbox still running when the log is migrated cannot read a partition a new
member reads."""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from outbox.pglog import PgLog, PgLogPublisher, PgLogSubscriber
from outbox.pglog.log import lock_key
from outbox.pglog.log import upgrade as upgrade_log
from outbox.pglog.subscriber import MAX_GROUP_BYTES
from outbox.testing.plugin import DatabaseFactory

from .test_pglog import message
from .test_pglog_groups import settle, sql

TOPIC = "locks.topic"


def old_lock_class(schema: str) -> int:
    """The upper half's first byte of the keys before log0003: 7 bits of the schema's crc32."""
    return zlib.crc32(schema.encode()) & 0x7F


def publish_to(url: str, schema: str, start: int, stop: int) -> None:
    publisher = PgLogPublisher(url, schema, partitions=4)
    try:
        batch = [message(TOPIC, n, f"k{n}".encode()) for n in range(start, stop)]
        assert publisher.publish(batch) == [None] * len(batch)
    finally:
        publisher.close()


@contextmanager
def consuming(members: list[PgLogSubscriber], seen: list[int]) -> Iterator[None]:
    """Each member polls and commits in a thread of its own until the block ends."""
    stop = threading.Event()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consume(member: PgLogSubscriber) -> None:
        try:
            while not stop.is_set():
                batch = member.poll(100, 0.05)
                with lock:
                    seen.extend(int(r.payload) for r in batch.rows())
                member.commit(batch)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(m,), daemon=True) for m in members]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for m in members:
            m.close()
    assert not errors, errors


def ends(url: str, schema: str) -> dict[int, int]:
    return {
        int(p): int(n)
        for p, n in sql(url, f"SELECT partition, next_offset FROM {schema}.log_partitions")
    }


def test_two_logs_whose_old_lock_keys_were_equal_each_deliver_everything(
    outbox_database_factory: DatabaseFactory,
) -> None:
    """Two log schemas whose 7-bit classes are equal, each with a group of id 1 and partitions
    of ids 1-4: before log0003 their members contended for the very same keys, and one log's
    consumers stored 0 of 20 while the other's stored 20 of 20."""
    first = "log_one"
    second = next(
        name
        for name in (f"log_two_{n}" for n in itertools.count())
        if old_lock_class(name) == old_lock_class(first)
    )
    url = outbox_database_factory(migrated=False)
    for schema in (first, second):
        upgrade_log(url, schema)
        PgLog(url, schema).create_topic(TOPIC, 4)
    seen: dict[str, list[int]] = {first: [], second: []}
    members = {
        schema: [
            PgLogSubscriber(url, [TOPIC], "g", schema, rebalance_interval=0.1) for _ in range(2)
        ]
        for schema in (first, second)
    }
    with consuming(members[first], seen[first]), consuming(members[second], seen[second]):
        for schema in (first, second):
            publish_to(url, schema, 0, 20)
        deadline = time.monotonic() + 20
        while not all(sorted(s) == list(range(20)) for s in seen.values()):
            assert time.monotonic() < deadline, {k: sorted(v) for k, v in seen.items()}
            time.sleep(0.05)
        # Each log's two members share its four partitions, side by side with the other's.
        deadline = time.monotonic() + 10
        while not all(len(m.partitions) == 2 for ms in members.values() for m in ms):
            assert time.monotonic() < deadline, {
                k: [m.partitions for m in ms] for k, ms in members.items()
            }
            time.sleep(0.05)
    for schema in (first, second):
        assert sorted(seen[schema]) == list(range(20)), schema  # each record once
        assert PgLog(url, schema).committed("g", TOPIC) == ends(url, schema)
        [(group_id,)] = sql(url, f"SELECT id FROM {schema}.log_groups")
        assert group_id == 1
        [(ids,)] = sql(url, f"SELECT array_agg(id ORDER BY id) FROM {schema}.log_partitions")
        assert ids == [1, 2, 3, 4]


def test_a_partitions_lock_is_the_log_schemas_oid_and_the_partitions_lock_id(
    outbox_database_factory: DatabaseFactory,
) -> None:
    url = outbox_database_factory(migrated=False)
    upgrade_log(url)
    PgLog(url).create_topic(TOPIC, 2)
    member = PgLogSubscriber(url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        settle([member], [2])
        [(oid,)] = sql(url, "SELECT oid FROM pg_namespace WHERE nspname = 'outbox_log'")
        held = sql(
            url,
            "SELECT l.classid::bigint, l.objid::bigint, k.partition_id FROM pg_locks l "
            "JOIN outbox_log.log_group_locks k ON k.lock_id = l.objid::bigint "
            "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
            "ORDER BY k.partition_id",
        )
        assert [(c, p) for c, _, p in held] == [(oid, 1), (oid, 2)]
        assert lock_key(int(oid), int(held[0][1])) == (int(oid) << 32 | int(held[0][1])) - (
            1 << 64 if oid >= 1 << 31 else 0
        )
    finally:
        member.close()


def test_a_63_byte_schema_and_a_group_name_at_its_limit(
    outbox_database_factory: DatabaseFactory,
) -> None:
    schema = "l" * 63
    group = "é" * (MAX_GROUP_BYTES // 2)
    url = outbox_database_factory(migrated=False)
    upgrade_log(url, schema)
    PgLog(url, schema).create_topic(TOPIC, 4)
    seen: list[int] = []
    members = [
        PgLogSubscriber(url, [TOPIC], group, schema, rebalance_interval=0.1) for _ in range(2)
    ]
    with consuming(members, seen):
        publish_to(url, schema, 0, 40)
        deadline = time.monotonic() + 20
        while sorted(seen) != list(range(40)):
            assert time.monotonic() < deadline, sorted(seen)
            time.sleep(0.05)
    assert PgLog(url, schema).committed(group, TOPIC) == ends(url, f'"{schema}"')


# -- an upgrade with members of an older outbox still running ------------------------------------

#: What the member of an outbox before log0003 ran: its registration and its heartbeat.
OLD_REGISTER = """
INSERT INTO outbox_log.log_members
    (member_id, group_id, topics, backend_pid, backend_start, sleeping, session_timeout)
VALUES (%(member_id)s, %(group_id)s, %(topics)s, pg_backend_pid(),
        (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()),
        false, %(session_timeout)s)
"""
OLD_HEARTBEAT = """
UPDATE outbox_log.log_members SET updated_at = now()
WHERE member_id = %(member_id)s AND backend_pid = pg_backend_pid()
RETURNING 1
"""


def test_an_older_member_running_through_the_upgrade_keeps_its_partition_until_it_stops(
    outbox_database_factory: DatabaseFactory,
) -> None:
    """A member of an outbox before log0003 holds a partition by the old key when the log is
    migrated: a new member does not take that partition while the older one's session holds
    it, and the older one's next heartbeat is refused (its consumer stops with that error, and
    is restarted with the new outbox) so that it takes no other."""
    url = outbox_database_factory(migrated=False)
    upgrade_log(url, revision="log0002")
    PgLog(url).create_topic(TOPIC, 2)
    [(group_id,)] = sql(url, "INSERT INTO outbox_log.log_groups (name) VALUES ('g') RETURNING id")
    [(held_id,)] = sql(url, "SELECT min(id) FROM outbox_log.log_partitions")
    old = psycopg.connect(url, autocommit=True, application_name="outbox-log-subscriber")
    # Its row names another topic, so that the new member wants both partitions of TOPIC:
    # only the lock the older member holds keeps it from the first.
    old_member: dict[str, Any] = {
        "member_id": "old-member",
        "group_id": group_id,
        "topics": ["another.topic"],
        "session_timeout": 30.0,
    }
    try:
        old.execute(OLD_REGISTER, old_member)
        old_key = ((old_lock_class("outbox_log") << 24 | group_id) << 32) | held_id
        assert old.execute("SELECT pg_try_advisory_lock(%s)", (old_key,)).fetchone() == (True,)

        upgrade_log(url)
        new = PgLogSubscriber(url, [TOPIC], "g", rebalance_interval=0.1)
        try:
            settle([new], [1])
            assert new._conn is not None and len(new._held(new._conn)) == 2
            [(other_id,)] = sql(url, "SELECT max(id) FROM outbox_log.log_partitions")
            assert held_id != other_id
            deadline = time.monotonic() + 1
            while time.monotonic() < deadline:
                new.poll(10, 0.05)
                assert new.partitions == [(TOPIC, 1)]
            with pytest.raises(psycopg.errors.CheckViolation, match="newer"):
                old.execute(OLD_HEARTBEAT, old_member)
            with pytest.raises(psycopg.errors.CheckViolation, match="newer"):
                old.execute(OLD_REGISTER, {**old_member, "member_id": "old-member-again"})
            old.close()  # its consumer exits: its session, its lock and its row go
            settle([new], [2])
        finally:
            new.close()
    finally:
        old.close()
