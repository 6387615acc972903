"""The log transport's consumer groups under hostile conditions: a member that stops (frozen,
stuck) loses its partitions and cannot commit over its successor; junk rows and hand-edited
offsets are skipped and reported, never a reason to skip good records; partitions deleted,
numbered with gaps or added while the consumers run; errors retrying cannot fix raise."""

from __future__ import annotations

import json
import logging
import random
import string
import time
from typing import Any

import psycopg
import pytest

from outbox.cli import main
from outbox.core.batches import InboxBatch
from outbox.core.errors import ConfigurationError, SchemaNotMigrated
from outbox.pglog import PgLog, PgLogPublisher, PgLogSubscriber
from outbox.pglog.log import upgrade as upgrade_log
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import Daemon, wait_for
from .test_pglog import message, publish, round_trips

TOPIC = "groups.topic"


@pytest.fixture
def log_url(outbox_database_factory: DatabaseFactory) -> str:
    """A fresh database holding a migrated log (schema outbox_log)."""
    url = outbox_database_factory(migrated=False)
    upgrade_log(url)
    return url


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def partition_id(url: str, topic: str, partition: int) -> int:
    [(pid,)] = sql(
        url,
        "SELECT p.id FROM outbox_log.log_partitions p JOIN outbox_log.log_topics t "
        "ON t.id = p.topic_id WHERE t.name = %s AND p.partition = %s",
        (topic, partition),
    )
    return int(pid)


def settle(members: list[PgLogSubscriber], expected: list[int], seconds: float = 15) -> None:
    """Poll every member (committing what it reads: a member gives a partition up only once
    it committed it) until each reads the number of partitions expected of it."""
    deadline = time.monotonic() + seconds
    while [len(m.partitions) for m in members] != expected:
        assert time.monotonic() < deadline, [m.partitions for m in members]
        for m in members:
            m.commit(m.poll(10, 0.02))


def drain(member: PgLogSubscriber, expected: int, seconds: float = 20) -> list[Any]:
    """Poll `member` (committing each batch) until it read `expected` records."""
    rows: list[Any] = []
    deadline = time.monotonic() + seconds
    while len(rows) < expected and time.monotonic() < deadline:
        batch = member.poll(1000, 0.1)
        rows.extend(batch.rows())
        member.commit(batch)
    return rows


# -- offsets: stored with the next fetch -----------------------------------------------------------


def test_offsets_committed_are_stored_with_the_next_fetch_in_its_round_trip(
    log_url: str, tmp_path: Any
) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    member = PgLogSubscriber(log_url, [TOPIC], "g-rt", rebalance_interval=3600)
    try:
        publish(log_url, TOPIC, 0, 10)
        first = drain(member, 10)
        member.flush()
        assert PgLog(log_url).committed("g-rt", TOPIC) == {0: 10}
        publish(log_url, TOPIC, 10, 15)
        assert member._conn is not None
        batch, trips = round_trips(member._conn, tmp_path, lambda: member.poll(100, 5))
        assert len(batch) == 5 and trips == 1, (len(batch), trips)
        member.commit(batch)
        # Taken, not yet stored: the next fetch carries it, in the same single round trip.
        assert PgLog(log_url).committed("g-rt", TOPIC) == {0: 10}
        publish(log_url, TOPIC, 15, 17)
        assert member._conn is not None
        batch, trips = round_trips(member._conn, tmp_path, lambda: member.poll(100, 5))
        assert len(batch) == 2 and trips == 1, (len(batch), trips)
        assert PgLog(log_url).committed("g-rt", TOPIC) == {0: 15}
        member.commit(batch)
    finally:
        member.close()  # stores what is pending before it leaves
    assert PgLog(log_url).committed("g-rt", TOPIC) == {0: 17}
    assert len(first) == 10


def test_offsets_pending_when_the_session_is_lost_are_dropped_and_the_batch_read_again(
    log_url: str,
) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    member = PgLogSubscriber(log_url, [TOPIC], "g-lost", rebalance_interval=3600)
    try:
        publish(log_url, TOPIC, 0, 10)
        batch = member.poll(100, 5)
        assert len(batch) == 10
        member.commit(batch)
        conn = member._conn
        assert conn is not None
        sql(log_url, "SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        # The next look finds the session gone: the offsets held for it go with it (after a
        # reconnect another member may own the partition), and the batch comes again.
        again: list[Any] = []
        deadline = time.monotonic() + 15
        while len(again) < 10:
            assert time.monotonic() < deadline, len(again)
            again.extend(member.poll(100, 0.2).rows())
        assert sorted(int(r.payload) for r in again) == list(range(10))
        assert PgLog(log_url).committed("g-lost", TOPIC) in ({}, {0: 0})
        member.commit(InboxBatch.of(again))
    finally:
        member.close()
    assert PgLog(log_url).committed("g-lost", TOPIC) == {0: 10}


def test_a_draining_partition_is_given_up_only_after_its_pending_offsets_are_stored(
    log_url: str,
) -> None:
    PgLog(log_url).create_topic(TOPIC, 2)
    first = PgLogSubscriber(log_url, [TOPIC], "g-drain", rebalance_interval=0.1)
    second: PgLogSubscriber | None = None
    try:
        settle([first], [2])
        publish(log_url, TOPIC, 0, 200)
        read = drain(first, 200)  # committed batch by batch: the last one is still pending
        second = PgLogSubscriber(log_url, [TOPIC], "g-drain", rebalance_interval=0.1)
        settle([first, second], [1, 1])
        # Every record was stored by the first before it let a partition go: the second
        # reads none of them again.
        assert second.poll(1000, 0.5).rows() == []
        assert sorted(int(r.payload) for r in read) == list(range(200))
        committed = PgLog(log_url).committed("g-drain", TOPIC)
        assert sum(committed.values()) >= 200 - max(committed.values()), committed
    finally:
        first.close()
        if second is not None:
            second.close()
    assert sum(PgLog(log_url).committed("g-drain", TOPIC).values()) == 200


# -- liveness: a member that stops ----------------------------------------------------------------


def test_a_member_that_stops_polling_is_evicted_and_cannot_commit_over_its_successor(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    PgLog(log_url).create_topic(TOPIC, 4)
    # `frozen` stops heartbeating 0.5 s after its owner stops polling (as a SIGSTOPped or stuck
    # process would at once), and is evicted once its heartbeat is 1 s old.
    frozen = PgLogSubscriber(
        log_url, [TOPIC], "g", rebalance_interval=0.1, session_timeout=1, max_poll_interval=0.5
    )
    survivor = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1, session_timeout=1)
    try:
        settle([frozen, survivor], [2, 2])
        lost = {p for _, p in frozen.partitions}
        publish(log_url, TOPIC, 0, 400)
        in_hand = InboxBatch()
        deadline = time.monotonic() + 10
        while not {r.partition for r in in_hand.rows()} >= lost:
            assert time.monotonic() < deadline
            for row in frozen.poll(1000, 0.1).rows():
                in_hand.add_row(row)
        # The frozen member holds a batch it has not committed; it stops. The survivor takes
        # its partitions over and reads their records again.
        rows = []
        deadline = time.monotonic() + 15
        while len(survivor.partitions) < 4:
            assert time.monotonic() < deadline, survivor.partitions
            rows.extend(survivor.poll(1000, 0.1).rows())
        assert "evicted member" in caplog.text
        rows.extend(drain(survivor, 400 - len(rows)))
        assert sorted(int(r.payload) for r in rows) == list(range(400))
        before = PgLog(log_url).committed("g", TOPIC)
        assert all(before[p] == 0 for p in lost), before  # the survivor did not commit yet

        # The frozen member wakes up and commits what it stored: nothing lands, its session is
        # gone; it says so, and rejoins as a new member.
        caplog.clear()
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            frozen.commit(in_hand)
            frozen.commit(in_hand)
            frozen.flush()  # else sent with its next fetch
        assert PgLog(log_url).committed("g", TOPIC) == before
        assert "not committed" in caplog.text or "lost the log database" in caplog.text
        survivor.commit(InboxBatch.of(rows))
        survivor.flush()
        ends = {p: n for p, n in _ends(log_url).items()}
        assert PgLog(log_url).committed("g", TOPIC) == ends
        settle([frozen, survivor], [2, 2])
        assert frozen.poll(1000, 0.2).rows() == []  # nothing is read twice once committed
    finally:
        frozen.close()
        survivor.close()


def test_a_member_busy_longer_than_the_session_timeout_keeps_its_partitions(
    log_url: str,
) -> None:
    PgLog(log_url).create_topic(TOPIC, 4)
    busy = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1, session_timeout=1)
    other = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1, session_timeout=1)
    try:
        settle([busy, other], [2, 2])
        held = busy.partitions
        # `busy` is storing a batch for 3 session timeouts: its heartbeat thread keeps it in
        # the group (as Kafka's heartbeat thread does, up to max_poll_interval).
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            other.poll(10, 0.1)
            assert len(other.partitions) == 2
        assert busy.partitions == held
        busy.poll(10, 0.1)
        assert busy.partitions == held
    finally:
        busy.close()
        other.close()


def test_a_member_that_may_not_end_a_stale_session_warns_once(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Evicting needs the stale member's role (or pg_signal_backend): without it, one warning,
    and the stale member keeps its partitions."""
    PgLog(log_url).create_topic(TOPIC, 2)
    sql(log_url, "DROP ROLE IF EXISTS outbox_other_member")
    sql(log_url, "CREATE ROLE outbox_other_member LOGIN")
    try:
        sql(log_url, "GRANT ALL ON SCHEMA outbox_log TO outbox_other_member")
        sql(log_url, "GRANT ALL ON ALL TABLES IN SCHEMA outbox_log TO outbox_other_member")
        sql(log_url, "GRANT ALL ON ALL SEQUENCES IN SCHEMA outbox_log TO outbox_other_member")
        other_url = psycopg.conninfo.make_conninfo(log_url, user="outbox_other_member")
        stale = PgLogSubscriber(
            log_url, [TOPIC], "g", rebalance_interval=0.1, session_timeout=1, max_poll_interval=0.3
        )
        other = PgLogSubscriber(other_url, [TOPIC], "g", rebalance_interval=0.1)
        try:
            settle([stale, other], [1, 1])
            with caplog.at_level(logging.WARNING, "outbox.pglog"):
                deadline = time.monotonic() + 4
                while time.monotonic() < deadline:
                    other.poll(10, 0.1)
            assert caplog.text.count("may not end its session") == 1, caplog.text
            assert len(other.partitions) == 1
        finally:
            stale.close()
            other.close()
    finally:
        sql(log_url, "DROP OWNED BY outbox_other_member")
        sql(log_url, "DROP ROLE outbox_other_member")


def _holders(url: str) -> int:
    """How many sessions hold bigint advisory locks (the log's partition locks)."""
    [(n,)] = sql(
        url,
        "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' "
        "AND objsubid = 1 AND granted",
    )
    return int(n)


def _ends(url: str, topic: str = TOPIC) -> dict[int, int]:
    return {
        int(p): int(n)
        for p, n in sql(
            url,
            "SELECT p.partition, p.next_offset FROM outbox_log.log_partitions p "
            "JOIN outbox_log.log_topics t ON t.id = p.topic_id WHERE t.name = %s",
            (topic,),
        )
    }


# -- junk in the log ------------------------------------------------------------------------------


def test_a_record_planted_past_the_partitions_end_is_never_read_nor_skipped_to(
    log_url: str,
) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    publish(log_url, TOPIC, 0, 10)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        assert len(drain(member, 10)) == 10
        sql(
            log_url,
            "INSERT INTO outbox_log.log_records (partition_id, log_offset, value) "
            "VALUES (%s, 1000000, 'junk')",
            (partition_id(log_url, TOPIC, 0),),
        )
        assert member.poll(100, 0.3).rows() == []
        publish(log_url, TOPIC, 10, 20)
        rows = drain(member, 10)
        assert [r.offset for r in rows] == list(range(10, 20))
        assert member.poll(100, 0.3).rows() == []
    finally:
        member.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 20}


def test_a_committed_offset_past_the_end_is_reported_and_reset_to_the_end(
    outbox_database_url: str, log_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    PgLog(log_url).create_topic(TOPIC, 2)
    publish(log_url, TOPIC, 0, 10)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        drain(member, 10)
    finally:
        member.close()
    ends = _ends(log_url)
    pid = partition_id(log_url, TOPIC, 1)
    sql(
        log_url,
        "UPDATE outbox_log.log_group_offsets SET next_offset = 5000 WHERE partition_id = %s",
        (pid,),
    )

    status = ["status", "--database-url", outbox_database_url, "--transport", "postgres"]
    args = [*status, "--log-url", log_url]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "consumer group g: lag 0 (committed past the end in 1 partition)" in text, text
    row = next(
        line.split() for line in text.splitlines() if line.split()[:3] == [TOPIC, "1", "5000"]
    )
    assert row[-2:] == ["past", "end"], row
    assert main([*args, "--check"]) == 3
    problem = (
        f"consumer group g: committed offset 5000 is past the end ({ends[1]}) of topic {TOPIC} "
        "partition 1"
    )
    assert problem in capsys.readouterr().out
    assert main([*args, "--json", "--check", "--max-lag", "100"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert [p["past_end"] for p in doc["lag"][0]["partitions"]] == [False, True]
    assert doc["check"]["problems"] == [problem]

    # A member that takes the partition reads it from its end, and stores that: records
    # published afterwards are delivered, and status is clean again.
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        settle([member], [2])
        assert PgLog(log_url).committed("g", TOPIC) == ends
        publish(log_url, TOPIC, 10, 30)
        assert len(drain(member, 20)) == 20
    finally:
        member.close()
    assert PgLog(log_url).committed("g", TOPIC) == _ends(log_url)
    assert main([*args, "--check"]) == 0
    assert "past" not in capsys.readouterr().out


def test_a_negative_committed_offset_reads_the_partition_from_its_start(log_url: str) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    publish(log_url, TOPIC, 0, 5)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        drain(member, 5)
    finally:
        member.close()
    sql(log_url, "UPDATE outbox_log.log_group_offsets SET next_offset = -7")
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        assert [r.offset for r in drain(member, 5)] == [0, 1, 2, 3, 4]
    finally:
        member.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 5}


# -- partitions deleted, with gaps, added ---------------------------------------------------------


def test_a_member_commits_in_a_topic_whose_partition_numbers_have_a_gap(log_url: str) -> None:
    """Partition numbers are never list indexes: with partitions 0 and 2, a commit in
    partition 2 once raised IndexError, on every restart."""
    PgLog(log_url).create_topic(TOPIC, 3)
    sql(
        log_url,
        "DELETE FROM outbox_log.log_partitions WHERE id = %s",
        (partition_id(log_url, TOPIC, 1),),
    )
    publish(log_url, TOPIC, 0, 40)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        rows = drain(member, 40)
    finally:
        member.close()
    assert sorted(int(r.payload) for r in rows) == list(range(40))
    assert PgLog(log_url).committed("g", TOPIC) == _ends(log_url)
    assert set(_ends(log_url)) == {0, 2}


def test_partitions_deleted_or_numbered_with_gaps_while_records_flow(log_url: str) -> None:
    PgLog(log_url).create_topic(TOPIC, 3)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        publish(log_url, TOPIC, 0, 30)
        assert len(drain(member, 30)) == 30
        assert member.partitions == [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)]
        # An operator deletes partition 1 (its records stay, unreachable) and adds partition 5:
        # the partitions are 0, 2 and 5.
        sql(
            log_url,
            "DELETE FROM outbox_log.log_partitions WHERE id = %s",
            (partition_id(log_url, TOPIC, 1),),
        )
        topic_id = sql(log_url, "SELECT id FROM outbox_log.log_topics WHERE name = %s", (TOPIC,))[
            0
        ][0]
        sql(
            log_url,
            "INSERT INTO outbox_log.log_partitions (topic_id, partition) VALUES (%s, 5)",
            (topic_id,),
        )
        expected = [(TOPIC, 0), (TOPIC, 2), (TOPIC, 5)]
        deadline = time.monotonic() + 10
        while member.partitions != expected:
            assert time.monotonic() < deadline, member.partitions
            member.poll(10, 0.05)
        publish(log_url, TOPIC, 30, 90)
        rows = drain(member, 60)
        assert sorted(int(r.payload) for r in rows) == list(range(30, 90))
        assert {r.partition for r in rows} == {0, 2, 5}
    finally:
        member.close()
    assert PgLog(log_url).committed("g", TOPIC) == _ends(log_url)

    # A new member (a consumer restarted) reads and commits through the gaps too.
    publish(log_url, TOPIC, 90, 120)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        assert sorted(int(r.payload) for r in drain(member, 30)) == list(range(90, 120))
    finally:
        member.close()
    assert PgLog(log_url).committed("g", TOPIC) == _ends(log_url)


def test_a_running_member_reads_a_partition_added_to_its_topic(log_url: str) -> None:
    PgLog(log_url).create_topic(TOPIC, 2)
    member = PgLogSubscriber(log_url, [TOPIC], "g")  # the default rebalance interval
    try:
        settle([member], [2])
        topic_id = sql(log_url, "SELECT id FROM outbox_log.log_topics WHERE name = %s", (TOPIC,))[
            0
        ][0]
        sql(
            log_url,
            "INSERT INTO outbox_log.log_partitions (topic_id, partition) VALUES (%s, 2)",
            (topic_id,),
        )
        settle([member], [3], seconds=5)
        publisher = PgLogPublisher(log_url)
        try:
            batch = [message(TOPIC, n, f"k{n}".encode()) for n in range(60)]
            assert publisher.publish(batch) == [None] * 60
        finally:
            publisher.close()
        rows = drain(member, 60)
        assert len(rows) == 60 and 2 in {r.partition for r in rows}
    finally:
        member.close()


# -- errors retrying cannot fix -------------------------------------------------------------------


def test_a_log_schema_dropped_under_a_member_raises_instead_of_retrying(log_url: str) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        member.poll(10, 0.1)
        sql(log_url, "DROP SCHEMA outbox_log CASCADE")
        with pytest.raises(SchemaNotMigrated, match="outbox migrate --log-url"):
            for _ in range(50):
                member.poll(10, 0.1)
    finally:
        member.close()


def test_a_role_without_privileges_on_the_log_raises_a_configuration_error(log_url: str) -> None:
    sql(log_url, "DROP ROLE IF EXISTS outbox_stranger")
    sql(log_url, "CREATE ROLE outbox_stranger LOGIN")
    try:
        url = psycopg.conninfo.make_conninfo(log_url, user="outbox_stranger")
        member = PgLogSubscriber(url, [TOPIC], "g")
        try:
            with pytest.raises(ConfigurationError, match="privilege"):
                member.poll(10, 0.5)
        finally:
            member.close()
    finally:
        sql(log_url, "DROP ROLE outbox_stranger")


def test_the_consumer_daemon_exits_with_one_line_when_the_log_schema_goes(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    inbox = outbox_database_factory()
    PgLog(log_url).create_topic(TOPIC, 1)
    args = ["consumer", "--database-url", inbox, "--transport", "postgres", "--log-url", log_url]
    with Daemon(*args, "--topic", TOPIC, "--group", "g") as consumer:
        wait_for(lambda: _holders(log_url) == 1, 30, "the consumer to hold its partition")
        sql(log_url, "DROP SCHEMA outbox_log CASCADE")
        assert consumer.wait(30) == 1, consumer.output()
        lines = [line for line in consumer.output().splitlines() if "error" in line]
        assert len(lines) == 1 and "log schema 'outbox_log'" in lines[0], consumer.output()
        assert "lost the log database" not in consumer.output()


def test_a_session_lost_again_and_again_is_warned_about_at_most_once_a_second(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    PgLog(log_url).create_topic(TOPIC, 2)
    member = PgLogSubscriber(log_url, [TOPIC], "g", rebalance_interval=0.1)
    try:
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            start = time.monotonic()
            while time.monotonic() - start < 5:
                member.poll(10, 0.05)
                sql(
                    log_url,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'outbox-log-subscriber'",
                )
            seconds = time.monotonic() - start
    finally:
        member.close()
    warnings = [r for r in caplog.records if "lost the log database" in r.getMessage()]
    assert 1 <= len(warnings) <= seconds + 1, [r.getMessage() for r in warnings]
    assert "more failures since the last warning" in caplog.text


def test_long_group_names_work_up_to_the_limit_and_are_refused_past_it(log_url: str) -> None:
    from outbox.pglog.subscriber import MAX_GROUP_BYTES

    PgLog(log_url).create_topic(TOPIC, 2)
    rng = random.Random(7)
    # Random letters, which PostgreSQL cannot compress: the longest name the index holds.
    group = "é" + "".join(rng.choice(string.ascii_letters) for _ in range(MAX_GROUP_BYTES - 2))
    a = PgLogSubscriber(log_url, [TOPIC], group, rebalance_interval=0.1)
    b = PgLogSubscriber(log_url, [TOPIC], group, rebalance_interval=0.1)
    try:
        settle([a, b], [1, 1])
        publish(log_url, TOPIC, 0, 20)
        rows: list[Any] = []
        deadline = time.monotonic() + 20
        while len(rows) < 20:
            assert time.monotonic() < deadline, len(rows)
            for member in (a, b):
                batch = member.poll(100, 0.05)
                rows.extend(batch.rows())
                member.commit(batch)
    finally:
        a.close()
        b.close()
    assert PgLog(log_url).committed(group, TOPIC) == _ends(log_url)
    with pytest.raises(ConfigurationError, match="at most 2000 bytes"):
        PgLogSubscriber(log_url, [TOPIC], group + "x")


@pytest.mark.parametrize("timeout", [0.001, 0.5, 0.999])
def test_a_session_timeout_too_short_to_keep_is_refused(log_url: str, timeout: float) -> None:
    """A timeout of a millisecond made the heartbeat thread beat and look in a busy loop, and
    the members evict each other at every look."""
    with pytest.raises(ConfigurationError, match="at least 1 s"):
        PgLogSubscriber(log_url, [TOPIC], "g", session_timeout=timeout)
    PgLogSubscriber(log_url, [TOPIC], "g", session_timeout=1).close()
