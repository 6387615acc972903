"""The log's publishing side under a hostile operator, and its topics' administration: a topic or
partition deleted under a running publisher, a record planted at a partition's next offset,
partitions added to a topic in use, errors no retry can fix, `outbox log-topics`."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox import Broker
from outbox.cli import main
from outbox.core.batches import OutgoingRecord
from outbox.core.errors import SchemaNotMigrated
from outbox.core.partitioning import partition_for
from outbox.core.topics import MAX_TOPIC_LENGTH
from outbox.pglog import PgLog, PgLogPublisher
from outbox.pglog.log import PartitionsCannotShrink, TopicExists, UnknownTopic
from outbox.pglog.log import upgrade as upgrade_log
from outbox.pglog.publisher import LogAppendRefused
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import Daemon, count, spawn_producer, wait_for
from .test_pglog import message, round_trips

broker = Broker()


@pytest.fixture
def log_url(outbox_database_factory: DatabaseFactory) -> str:
    """A fresh database holding a migrated log (schema outbox_log)."""
    url = outbox_database_factory(migrated=False)
    upgrade_log(url)
    return url


@pytest.fixture
def publisher(log_url: str) -> Iterator[PgLogPublisher]:
    p = PgLogPublisher(log_url, partitions=4)
    try:
        yield p
    finally:
        p.close()


def batch(topic: str, start: int, stop: int, keys: int = 16) -> list[OutgoingRecord]:
    return [message(topic, n, f"k{n % keys}".encode()) for n in range(start, stop)]


def sql(url: str, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def stored(url: str, topic: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of the records of `topic` the log holds under its present
    partitions, in partition and offset order."""
    rows = sql(
        url,
        "SELECT p.partition, r.log_offset, r.value FROM outbox_log.log_records r "
        "JOIN outbox_log.log_partitions p ON p.id = r.partition_id "
        "JOIN outbox_log.log_topics t ON t.id = p.topic_id WHERE t.name = %s "
        "ORDER BY p.partition, r.log_offset",
        (topic,),
    )
    return [(int(p), int(o), bytes(v)) for p, o, v in rows]  # type: ignore[call-overload]


def values(url: str, topic: str) -> list[int]:
    return sorted(int(v) for _, _, v in stored(url, topic))


def partition_rows(url: str, topic: str) -> dict[int, int]:
    """partition -> next offset of `topic`."""
    rows = sql(
        url,
        "SELECT p.partition, p.next_offset FROM outbox_log.log_partitions p "
        "JOIN outbox_log.log_topics t ON t.id = p.topic_id WHERE t.name = %s",
        (topic,),
    )
    return {int(p): int(n) for p, n in rows}  # type: ignore[call-overload]


# -- what an append stored ------------------------------------------------------------------------


def test_a_topic_deleted_under_a_running_publisher_is_created_again_and_nothing_is_lost(
    log_url: str, publisher: PgLogPublisher
) -> None:
    topic = "recreated"
    assert publisher.publish(batch(topic, 0, 10)) == [None] * 10
    sql(log_url, "DELETE FROM outbox_log.log_topics WHERE name = %s", (topic,))
    assert publisher.publish(batch(topic, 10, 60)) == [None] * 50
    # Every record reported delivered is in the log, under the topic created again.
    assert values(log_url, topic) == list(range(10, 60))
    assert sorted(partition_rows(log_url, topic)) == [0, 1, 2, 3]


def test_a_deleted_partition_row_loses_no_key(log_url: str, publisher: PgLogPublisher) -> None:
    topic = "holed"
    assert publisher.publish(batch(topic, 0, 40)) == [None] * 40
    sql(
        log_url,
        "DELETE FROM outbox_log.log_partitions p USING outbox_log.log_topics t "
        "WHERE t.id = p.topic_id AND t.name = %s AND p.partition = 2",
        (topic,),
    )
    assert publisher.publish(batch(topic, 40, 100)) == [None] * 60
    # The three partitions left take every key, in partition-number order (1 of 3 is
    # partition 3), and each key stays in one of them.
    records = stored(log_url, topic)
    assert sorted(int(v) for p, _, v in records if int(v) >= 40) == list(range(40, 100))
    numbers = [0, 1, 3]
    for partition, _offset, value in records:
        n = int(value)
        if n >= 40:
            assert partition == numbers[partition_for(f"k{n % 16}".encode(), 3)], n


def test_a_topic_without_partitions_fails_its_records_alone(
    log_url: str, publisher: PgLogPublisher
) -> None:
    assert publisher.publish(batch("emptied", 0, 4) + batch("other", 0, 4)) == [None] * 8
    sql(
        log_url,
        "DELETE FROM outbox_log.log_partitions p USING outbox_log.log_topics t "
        "WHERE t.id = p.topic_id AND t.name = 'emptied'",
    )
    results = publisher.publish(batch("emptied", 4, 8) + batch("other", 4, 8))
    assert results[4:] == [None] * 4
    for failure in results[:4]:
        assert failure is not None and not failure.permanent
        assert "log topic emptied has no partitions" in failure.error
        assert "outbox log-topics alter emptied --partitions N" in failure.error
    assert values(log_url, "other") == list(range(8))
    PgLog(log_url).grow_topic("emptied", 2)
    assert publisher.publish(batch("emptied", 4, 8)) == [None] * 4
    assert values(log_url, "emptied") == list(range(4, 8))


def test_a_topic_recreated_by_hand_with_other_ids_is_read_again(
    log_url: str, publisher: PgLogPublisher
) -> None:
    topic = "swapped"
    assert publisher.publish(batch(topic, 0, 8)) == [None] * 8
    # The operator drops the topic and creates it with more partitions: new partition ids.
    sql(log_url, "DELETE FROM outbox_log.log_topics WHERE name = %s", (topic,))
    PgLog(log_url).create_topic(topic, 6)
    assert publisher.publish(batch(topic, 8, 40)) == [None] * 32
    assert values(log_url, topic) == list(range(8, 40))
    assert sorted(partition_rows(log_url, topic)) == list(range(6))


@pytest.mark.parametrize("with_meanwhile", [True, False], ids=["meanwhile", "one-round-trip"])
def test_a_short_append_is_rolled_back_and_failed_retriably_when_the_topic_keeps_vanishing(
    log_url: str, publisher: PgLogPublisher, monkeypatch: pytest.MonkeyPatch, with_meanwhile: bool
) -> None:
    topic = "flapping"
    assert publisher.publish(batch(topic, 0, 4)) == [None] * 4

    def delete_topic() -> None:  # runs inside every append, while it is on its way
        sql(log_url, "DELETE FROM outbox_log.log_topics WHERE name = %s", (topic,))

    calls = 0

    def meanwhile() -> None:
        nonlocal calls
        calls += 1

    # The topic is deleted between reading it and appending, at every attempt: the batch fails
    # retriably and nothing of it is in the log.
    original = publisher._read_topics

    def read_then_delete(conn: psycopg.Connection[Any], topics: set[str]) -> None:
        original(conn, topics)
        delete_topic()

    monkeypatch.setattr(publisher, "_read_topics", read_then_delete)
    results = publisher.publish(batch(topic, 4, 20), meanwhile if with_meanwhile else None)
    assert all(r is not None and not r.permanent for r in results), results
    assert calls == (1 if with_meanwhile else 0)  # the caller's work runs once at most
    monkeypatch.undo()
    assert sql(log_url, "SELECT count(*) FROM outbox_log.log_records WHERE value = '4'") == [(0,)]
    assert publisher.publish(batch(topic, 4, 20)) == [None] * 16
    assert values(log_url, topic) == list(range(4, 20))


def test_a_record_planted_at_a_partitions_next_offset_is_stepped_over_once(
    log_url: str, publisher: PgLogPublisher, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "planted"
    assert publisher.publish(batch(topic, 0, 32)) == [None] * 32
    ends = partition_rows(log_url, topic)
    # Written by hand at partition 1's next offset (and one further on), without moving
    # the counter.
    sql(
        log_url,
        "INSERT INTO outbox_log.log_records (partition_id, log_offset, key, value) "
        "SELECT p.id, p.next_offset + o, 'hand', 'planted' FROM outbox_log.log_partitions p "
        "JOIN outbox_log.log_topics t ON t.id = p.topic_id, (VALUES (0), (1)) AS v(o) "
        "WHERE t.name = %s AND p.partition = 1",
        (topic,),
    )
    with caplog.at_level(logging.WARNING, "outbox.pglog"):
        assert publisher.publish(batch(topic, 32, 64)) == [None] * 32
        assert publisher.publish(batch(topic, 64, 96)) == [None] * 32
    numbers = sorted(int(v) for _, _, v in stored(log_url, topic) if v != b"planted")
    assert numbers == list(range(96))
    after = partition_rows(log_url, topic)
    planted = [(p, o) for p, o, v in stored(log_url, topic) if v == b"planted"]
    assert planted == [(1, ends[1]), (1, ends[1] + 1)]
    # Partition 1's records appended after the repair follow the planted ones, gapless.
    offsets = [o for p, o, _ in stored(log_url, topic) if p == 1]
    assert offsets == list(range(after[1]))
    warnings = [r.getMessage() for r in caplog.records if "no publisher appended" in r.message]
    assert len(warnings) == 1, warnings
    assert f"log topic {topic} partition 1" in warnings[0]
    assert f"next offset moved from {ends[1]} to {ends[1] + 2}" in warnings[0]


def test_an_append_is_one_round_trip_without_meanwhile_and_waits_for_it_with_one(
    log_url: str, publisher: PgLogPublisher, tmp_path: Any
) -> None:
    """The statement is its own transaction: an append is one round trip (its COMMIT is not
    one of its own), and a `meanwhile` still runs before the COMMIT."""
    topic = "round-trips"
    assert publisher.publish(batch(topic, 0, 8)) == [None] * 8  # the topic made and cached
    conn = publisher._conn
    assert conn is not None

    def syncs(meanwhile: Any) -> tuple[list[Any], int]:
        return round_trips(
            conn, tmp_path, lambda: publisher.publish(batch(topic, 8, 40), meanwhile)
        )

    results, one = syncs(None)
    assert results == [None] * 32
    assert one == 1, one

    seen: list[object] = []

    def meanwhile() -> None:  # the append is not committed yet: another session sees nothing
        seen.append(sql(log_url, "SELECT count(*) FROM outbox_log.log_records")[0][0])

    results, more = syncs(meanwhile)
    assert results == [None] * 32
    assert seen == [40] and more > 1, (seen, more)
    assert values(log_url, topic) == sorted([*range(8), *range(8, 40), *range(8, 40)])


def test_an_append_onto_a_partition_that_is_not_the_one_named_stores_nothing(
    log_url: str, publisher: PgLogPublisher
) -> None:
    """`log_append` is all or nothing: named partitions that are not what the publisher
    thinks (renamed by hand between its read and its append) take no record and no offset."""
    topic = "renamed"
    assert publisher.publish(batch(topic, 0, 8)) == [None] * 8
    ends = partition_rows(log_url, topic)
    ids = sorted(publisher._topics.names)
    sql(
        log_url,
        "UPDATE outbox_log.log_partitions SET partition = partition + 10 WHERE id = %s",
        (ids[-1],),
    )
    params = {
        "partition_ids": ids,
        "keys": [b"k"] * len(ids),
        "values": [b"v"] * len(ids),
        "headers": [None] * len(ids),
        "channel": "outbox_log_never",
        "expected_ids": ids,
        "expected_topics": [publisher._topics.names[i][0] for i in ids],
        "expected_partitions": [publisher._topics.names[i][1] for i in ids],
    }
    with psycopg.connect(log_url, autocommit=True) as conn:
        row = conn.execute(publisher._sql["log_append"], params).fetchone()
    assert row is not None
    assert row[0] == 0, row
    assert list(row[2]) == ids and row[3] == [topic] * len(ids), row
    assert row[4][-1] == publisher._topics.names[ids[-1]][1] + 10, row
    assert sql(log_url, "SELECT count(*) FROM outbox_log.log_records WHERE value = 'v'") == [(0,)]
    moved = {p - 10 if p >= 10 else p: n for p, n in partition_rows(log_url, topic).items()}
    assert moved == ends
    # The publisher itself reads the topic again and appends the batch whole.
    assert publisher.publish(batch(topic, 8, 24)) == [None] * 16
    assert values(log_url, topic) == list(range(24))


# -- partitions added -----------------------------------------------------------------------------


def test_a_running_publisher_uses_partitions_added_to_its_topic(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = "growing"
    publisher = PgLogPublisher(log_url, partitions=2, refresh_interval=0.2)
    try:
        assert publisher.publish(batch(topic, 0, 32)) == [None] * 32
        assert sorted({p for p, _, _ in stored(log_url, topic)}) == [0, 1]
        assert PgLog(log_url).grow_topic(topic, 5) == [2, 3, 4]
        time.sleep(0.3)
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            for start in range(32, 96, 32):
                assert publisher.publish(batch(topic, start, start + 32)) == [None] * 32
        later = [(p, int(v)) for p, _, v in stored(log_url, topic) if int(v) >= 32]
        assert {p for p, _ in later} == {0, 1, 2, 3, 4}
        for partition, n in later:
            assert partition == partition_for(f"k{n % 16}".encode(), 5), n
        said = [r.getMessage() for r in caplog.records]
        assert sum("has 5 partitions now (had 2)" in m for m in said) == 1, said
    finally:
        publisher.close()


def test_a_publisher_warns_once_per_topic_whose_partitions_differ_from_its_setting(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    PgLog(log_url).create_topic("small", 3)
    publisher = PgLogPublisher(log_url, partitions=8)
    try:
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            for start in range(0, 60, 20):
                assert publisher.publish(batch("small", start, start + 20)) == [None] * 20
                assert publisher.publish(batch("fresh", start, start + 20)) == [None] * 20
    finally:
        publisher.close()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        "log topic small has 3 partitions, fewer than the 8 this producer creates topics "
        "with: --log-partitions applies to new topics only; `outbox log-topics alter small "
        "--partitions 8` adds partitions (and moves keys to other partitions)"
    ]
    assert PgLog(log_url).partitions("small") == 3  # not changed behind the operator's back
    assert PgLog(log_url).partitions("fresh") == 8


def test_concurrent_publishers_lose_nothing_while_partitions_grow(log_url: str) -> None:
    topic = "busy"
    PgLog(log_url).create_topic(topic, 2)
    errors: list[BaseException] = []
    per_thread = 600

    def publish_all(base: int) -> None:
        publisher = PgLogPublisher(log_url, partitions=2, refresh_interval=0.05)
        try:
            for start in range(base, base + per_thread, 50):
                results = publisher.publish(batch(topic, start, start + 50, keys=64))
                assert results == [None] * 50, results
        except BaseException as exc:
            errors.append(exc)
        finally:
            publisher.close()

    threads = [threading.Thread(target=publish_all, args=(i * 10_000,)) for i in range(3)]
    for thread in threads:
        thread.start()
    log = PgLog(log_url)
    for partitions in range(3, 9):
        log.grow_topic(topic, partitions)
        time.sleep(0.02)
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    expected = sorted(i * 10_000 + n for i in range(3) for n in range(per_thread))
    assert values(log_url, topic) == expected
    # Offsets stay gapless in every partition.
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _ in stored(log_url, topic):
        by_partition.setdefault(partition, []).append(offset)
    for partition, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), partition


# -- errors no retry fixes, a frozen publisher ----------------------------------------------------


def test_a_log_not_migrated_raises_schema_not_migrated(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    bare = outbox_database_factory(migrated=False)
    publisher = PgLogPublisher(bare)
    try:
        with pytest.raises(SchemaNotMigrated, match="no log schema 'outbox_log'"):
            publisher.publish(batch("t", 0, 2))
    finally:
        publisher.close()
    # A log table dropped under a running publisher.
    publisher = PgLogPublisher(log_url)
    try:
        assert publisher.publish(batch("t", 0, 2)) == [None, None]
        sql(log_url, "DROP TABLE outbox_log.log_records")
        with pytest.raises(SchemaNotMigrated, match="not as `outbox migrate` left it"):
            publisher.publish(batch("t", 2, 4))
    finally:
        publisher.close()


@pytest.fixture
def limited_url(log_url: str) -> Iterator[str]:
    """`log_url` as a role that may read the log's tables but not write them."""
    role = f"outbox_ro_{uuid.uuid4().hex[:8]}"
    sql(log_url, f"CREATE ROLE {role} LOGIN PASSWORD 'ro'")
    sql(log_url, f"GRANT USAGE ON SCHEMA outbox_log TO {role}")
    sql(log_url, f"GRANT SELECT ON ALL TABLES IN SCHEMA outbox_log TO {role}")
    database = conninfo_to_dict(log_url)["dbname"]
    try:
        yield make_conninfo(log_url, user=role, password="ro", dbname=database)
    finally:
        sql(log_url, f"DROP OWNED BY {role}")
        sql(log_url, f"DROP ROLE {role}")


def test_a_missing_privilege_is_raised_not_retried(log_url: str, limited_url: str) -> None:
    PgLog(log_url).create_topic("t", 2)
    publisher = PgLogPublisher(limited_url)
    try:
        with pytest.raises(LogAppendRefused) as refused:
            publisher.publish(batch("t", 0, 2))
    finally:
        publisher.close()
    text = str(refused.value)
    assert "SQLSTATE 42501" in text and "retrying cannot fix this" in text, text
    assert not isinstance(refused.value, psycopg.OperationalError)  # not a lost connection


def test_a_frozen_publisher_blocks_the_others_only_until_its_session_is_ended(
    log_url: str,
) -> None:
    topic = "frozen"
    PgLog(log_url).create_topic(topic, 1)
    frozen = PgLogPublisher(log_url, idle_in_transaction_timeout=1.0)
    other = PgLogPublisher(log_url)
    try:
        assert frozen.publish([message(topic, 0, b"k")]) == [None]
        done: list[object] = []

        def blocked() -> None:
            done.append(other.publish([message(topic, 2, b"k")]))

        thread = threading.Thread(target=blocked)

        def freeze() -> None:  # the append holds the counter row while this "hangs"
            thread.start()
            time.sleep(3)

        results = frozen.publish([message(topic, 1, b"k")], freeze)
        thread.join(30)
        # The server ended the frozen session: its append was rolled back, and reported so.
        assert results[0] is not None and not results[0].permanent, results
        assert done == [[None]]
        assert values(log_url, topic) == [0, 2]
        assert frozen.publish([message(topic, 3, b"k")]) == [None]
    finally:
        frozen.close()
        other.close()


def test_a_publisher_waiting_on_a_foreign_lock_fails_retriably(log_url: str) -> None:
    topic = "locked"
    PgLog(log_url).create_topic(topic, 1)
    publisher = PgLogPublisher(log_url, lock_timeout=0.5)
    try:
        assert publisher.publish([message(topic, 0, b"k")]) == [None]
        with psycopg.connect(log_url) as holder:
            holder.execute("SELECT * FROM outbox_log.log_partitions FOR UPDATE")
            results = publisher.publish([message(topic, 1, b"k")])
        assert results[0] is not None and not results[0].permanent, results
        assert "LockNotAvailable" in results[0].error
        assert publisher.publish([message(topic, 1, b"k")]) == [None]
    finally:
        publisher.close()


# -- odd input ------------------------------------------------------------------------------------


def test_a_topic_name_at_the_limit_nul_bytes_in_keys_and_a_big_batch(log_url: str) -> None:
    longest = "t" * MAX_TOPIC_LENGTH
    publisher = PgLogPublisher(log_url, partitions=3)
    try:
        records = [message(longest, n, b"\x00key\x00" + bytes([n % 7])) for n in range(5000)]
        assert publisher.publish(records) == [None] * 5000
    finally:
        publisher.close()
    assert values(log_url, longest) == list(range(5000))
    assert PgLog(log_url).partitions(longest) == 3
    keys = sql(log_url, "SELECT DISTINCT key FROM outbox_log.log_records")
    assert len(keys) == 7
    assert all(bytes(k).startswith(b"\x00key\x00") for (k,) in keys)  # type: ignore[call-overload]


# -- the producer daemon --------------------------------------------------------------------------


def _send(url: str, topic: str, start: int, stop: int) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        for n in range(start, stop):
            broker.send(conn, topic, {"n": n}, key=f"k{n % 16}")


def _sent(url: str, topic: str) -> list[int]:
    return sorted(json.loads(bytes(v))["n"] for _, _, v in stored(url, topic))


def test_the_producer_daemon_never_reports_relayed_what_a_deleted_topic_lost(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    service = outbox_database_factory()
    topic = "orders"
    with spawn_producer(service, log_url, "--log-partitions", "4") as producer:
        _send(service, topic, 0, 50)
        wait_for(lambda: count(service) == 0, 60, "the first 50 relayed")
        assert _sent(log_url, topic) == list(range(50))
        sql(log_url, "DELETE FROM outbox_log.log_topics WHERE name = %s", (topic,))
        _send(service, topic, 50, 100)
        wait_for(lambda: count(service) == 0, 60, "the next 50 relayed")
        # Every row that left producer_queue is in the log, under the topic created again.
        assert _sent(log_url, topic) == list(range(50, 100))
        assert producer.process.poll() is None, producer.output()
        producer.terminate()
        assert producer.wait(30) == 0, producer.output()


def test_a_killed_producer_reports_nothing_relayed_it_did_not_store(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    service = outbox_database_factory()
    topic = "killed"
    _send(service, topic, 0, 3000)
    with spawn_producer(service, log_url, "--batch-size", "100") as producer:
        wait_for(lambda: count(service) < 2500, 60, "some rows relayed")
        producer.signal(signal.SIGKILL)
        producer.wait(10)
    left = count(service)
    # At least once: every row gone from the queue is in the log (some may be there twice).
    with psycopg.connect(service) as conn:
        waiting = {
            json.loads(bytes(p))["n"]
            for (p,) in conn.execute("SELECT payload FROM outbox.producer_queue")
        }
    assert len(waiting) == left
    in_log = set(_sent(log_url, topic))
    assert set(range(3000)) - waiting <= in_log
    with spawn_producer(service, log_url) as producer:
        wait_for(lambda: count(service) == 0, 60, "the rest relayed after a restart")
        producer.terminate()
        producer.wait(30)
    assert set(_sent(log_url, topic)) == set(range(3000))


def test_the_producer_exits_with_one_line_when_the_log_refuses_its_role(
    outbox_database_factory: DatabaseFactory, log_url: str, limited_url: str
) -> None:
    service = outbox_database_factory()
    PgLog(log_url).create_topic("orders", 2)
    _send(service, "orders", 0, 5)
    with Daemon(
        "producer",
        "--database-url",
        service,
        "--transport",
        "postgres",
        "--log-url",
        limited_url,
    ) as producer:
        code = producer.wait(60)
        output = producer.output()
    assert code == 1, output
    assert "SQLSTATE 42501" in output and "retrying cannot fix this" in output, output
    assert count(service) == 5  # nothing reported relayed


# -- outbox log-topics ----------------------------------------------------------------------------


def _out(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.err == "", captured.err
    return captured.out


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith("outbox: error: "), lines
    return lines[0]


def test_log_topics_lists_creates_and_grows_topics_and_refuses_to_shrink(
    log_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topics = ["log-topics"]
    at = ["--log-url", log_url]
    assert main([*topics, "list", *at]) == 0
    assert _out(capsys) == "log schema 'outbox_log' has no topics\n"

    assert main([*topics, "create", *at, "orders", "--partitions", "3"]) == 0
    assert _out(capsys) == "created log topic 'orders' with 3 partitions\n"
    assert main([*topics, "create", *at, "orders", "--partitions", "3"]) == 1
    assert "log topic 'orders' exists already" in _error(capsys)
    for bad in (["bad topic!"], ["x", "--partitions", "0"], ["x", "--partitions", "10001"]):
        with pytest.raises(SystemExit) as exited:  # usage errors, one line each
            main([*topics, "create", *at, *bad])
        assert exited.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1

    publisher = PgLogPublisher(log_url, partitions=3)
    try:
        assert publisher.publish(batch("orders", 0, 30)) == [None] * 30
    finally:
        publisher.close()

    assert main([*topics, "list", *at]) == 0
    lines = _out(capsys).splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITIONS", "RECORDS", "END"]
    assert lines[1].split() == ["orders", "3", "30", "30"]

    assert main([*topics, "list", *at, "--json"]) == 0
    doc = json.loads(_out(capsys))
    [orders] = doc["topics"]
    assert orders["name"] == "orders" and orders["records"] == 30
    assert [p["partition"] for p in orders["partitions"]] == [0, 1, 2]
    assert sum(p["end"] for p in orders["partitions"]) == 30
    assert all(p["earliest"] == 0 for p in orders["partitions"])

    assert main([*topics, "alter", *at, "orders", "--partitions", "5"]) == 0
    out = _out(capsys)
    assert out.startswith("log topic 'orders' grew from 3 to 5 partitions (added 3, 4)"), out
    assert "keys now map to other partitions" in out
    assert PgLog(log_url).partitions("orders") == 5
    assert main([*topics, "alter", *at, "orders", "--partitions", "5"]) == 0
    assert _out(capsys) == "log topic 'orders' has 5 partitions already (nothing to do)\n"

    assert main([*topics, "alter", *at, "orders", "--partitions", "2"]) == 1
    error = _error(capsys)
    assert "log topic 'orders' has 5 partitions: partitions can only be added" in error
    assert "nothing was changed" in error
    assert PgLog(log_url).partitions("orders") == 5

    assert main([*topics, "alter", *at, "nothing", "--partitions", "2"]) == 1
    assert "log schema 'outbox_log' has no topic 'nothing'" in _error(capsys)

    assert main([*topics, "list", *at, "--by-partition", "orders"]) == 0
    lines = _out(capsys).splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "EARLIEST", "END", "RECORDS"]
    assert [line.split()[1] for line in lines[1:]] == ["0", "1", "2", "3", "4"]


def test_log_topics_alter_adds_back_a_deleted_partition_first(log_url: str) -> None:
    log = PgLog(log_url)
    log.create_topic("gappy", 4)
    sql(
        log_url,
        "DELETE FROM outbox_log.log_partitions p USING outbox_log.log_topics t "
        "WHERE t.id = p.topic_id AND t.name = 'gappy' AND p.partition = 1",
    )
    assert log.partitions("gappy") == 3
    assert log.grow_topic("gappy", 5) == [1, 4]
    assert sorted(partition_rows(log_url, "gappy")) == [0, 1, 2, 3, 4]
    with pytest.raises(PartitionsCannotShrink):
        log.grow_topic("gappy", 4)
    with pytest.raises(UnknownTopic):
        log.grow_topic("none", 4)
    with pytest.raises(TopicExists):
        log.create_topic("gappy", 4)


def test_log_topics_needs_a_migrated_log(
    outbox_database_factory: DatabaseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    url = outbox_database_factory(migrated=False)
    assert main(["log-topics", "list", "--log-url", url]) == 1
    assert "no log schema 'outbox_log': run `outbox migrate --log-url" in _error(capsys)
    assert main(["log-topics", "list"]) == 1
    assert "--log-url is required (or set OUTBOX_LOG_URL)" in _error(capsys)
