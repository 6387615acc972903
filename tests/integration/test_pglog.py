"""The PostgreSQL log transport (outbox.pglog) with the daemons: end to end, groups, retention."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import pq

from outbox import Broker, Handlers, InboxMessage
from outbox.cli import main
from outbox.core.batches import InboxBatch, OutgoingRecord, outgoing
from outbox.core.envelope import StoredMessage
from outbox.core.ids import uuid7
from outbox.core.lag import GroupLag
from outbox.core.naps import AWAKE_AFTER
from outbox.daemons.consumer import Consumer
from outbox.pglog import GroupInUse, PgLog, PgLogPublisher, PgLogSubscriber, check_log
from outbox.pglog.log import HEAD_REVISION
from outbox.pglog.log import upgrade as upgrade_log
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import Daemon, app_of, count, handler_thread, running, wait_for

broker = Broker()


@pytest.fixture
def log_url(outbox_database_factory: DatabaseFactory) -> str:
    """A fresh database holding a migrated log (schema outbox_log)."""
    url = outbox_database_factory(migrated=False)
    upgrade_log(url)
    return url


def message(topic: str, n: int, key: bytes | None = None) -> OutgoingRecord:
    return outgoing(
        StoredMessage(
            id=n,
            message_id=uuid7(),
            topic=topic,
            key=key,
            payload=str(n).encode(),
            content_type="application/json",
            headers={},
            created_at=datetime.now(UTC),
            attempts=0,
        )
    )


def publish(url: str, topic: str, start: int, stop: int, keys: int = 16) -> None:
    try:  # a publisher of the topic's count, which says nothing about it
        publisher = PgLogPublisher(url, partitions=PgLog(url).partitions(topic))
    except KeyError:
        publisher = PgLogPublisher(url)
    try:
        batch = [message(topic, n, f"k{n % keys}".encode()) for n in range(start, stop)]
        assert publisher.publish(batch) == [None] * len(batch)
    finally:
        publisher.close()


def round_trips(conn: psycopg.Connection[Any], tmp_path: Any, call: Any) -> tuple[Any, int]:
    """What `call()` returned, and the round trips it made on `conn`: the messages it sent
    that the server answers (a Sync, or a simple Query such as BEGIN), by libpq's trace."""
    path = tmp_path / f"trace-{time.monotonic_ns()}"
    with open(path, "wb") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            got = call()
        finally:
            conn.pgconn.untrace()
    fields = [line.split("\t") for line in path.read_text(errors="replace").splitlines()]
    return got, sum(1 for f in fields if f[:1] == ["F"] and f[2:3] in (["Sync"], ["Query"]))


def log_consumer(
    inbox_url: str, log_url: str, topic: str, group: str, members: list[PgLogSubscriber]
) -> Consumer:
    """A Consumer daemon reading the log; its subscriber is appended to `members`."""

    def subscribe() -> PgLogSubscriber:
        subscriber = PgLogSubscriber(log_url, [topic], group, rebalance_interval=0.2)
        members.append(subscriber)
        return subscriber

    return app_of(
        inbox_url, group=group, topics=[topic], consumer={"batch_size": 100}, subscribers=subscribe
    ).consumer()


# -- end to end -----------------------------------------------------------------------------------


def test_service_a_to_service_b_through_the_log_keeps_order_per_key(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    service_a, service_b = outbox_database_factory(), outbox_database_factory()
    topic = "orders.created"
    keys = [f"order-{i}" for i in range(7)]
    sent = 0
    with psycopg.connect(service_a) as conn:
        for round_ in range(30):
            with conn.transaction():
                for key in keys:
                    broker.send(conn, topic, {"key": key, "n": round_}, key=key)
                    sent += 1

    handlers = Handlers()
    seen: dict[str, list[int]] = defaultdict(list)
    partitions: dict[str, set[int | None]] = defaultdict(set)
    lock = threading.Lock()

    @handlers.handler(topic)
    def on_order(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        with lock:
            seen[message.payload["key"]].append(message.payload["n"])
            partitions[message.payload["key"]].add(message.partition)

    producer = app_of(
        service_a,
        producer={"batch_size": 50},
        publishers=lambda: PgLogPublisher(log_url, partitions=4),
    ).producer()
    members: list[PgLogSubscriber] = []
    consumer = log_consumer(service_b, log_url, topic, "shipping", members)
    with running(producer), running(consumer), handler_thread(service_b, handlers):
        wait_for(
            lambda: sum(len(v) for v in seen.values()) >= sent, 60, "every order to be handled"
        )
    assert count(service_a) == 0
    # Handled rows leave consumer_queue; their ids stay in consumer_processed (decision 17).
    assert count(service_b, "consumer_queue") == 0
    assert count(service_b, "consumer_processed") == sent
    assert consumer.received == consumer.stored == sent  # nothing read twice
    for key in keys:
        assert seen[key] == list(range(30)), key
        assert len(partitions[key]) == 1, key  # a key stays in one partition
    assert PgLog(log_url).partitions(topic) == 4


# -- a group's members ----------------------------------------------------------------------------


def test_two_members_share_the_partitions_and_read_no_record_twice(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    inbox = outbox_database_factory()
    topic = "shared"
    PgLog(log_url).create_topic(topic, 8)
    members: list[PgLogSubscriber] = []
    first = log_consumer(inbox, log_url, topic, "g", members)
    second = log_consumer(inbox, log_url, topic, "g", members)
    total = 0
    with running(first):
        for start in range(0, 1000, 100):  # a steady stream while the second member joins
            publish(log_url, topic, start, start + 100)
            total += 100
            time.sleep(0.05)
        with running(second):
            for start in range(1000, 3000, 100):
                publish(log_url, topic, start, start + 100)
                total += 100
                time.sleep(0.05)
            wait_for(lambda: count(inbox, "consumer_queue") == total, 60, "every record stored")
            wait_for(lambda: all(len(m.partitions) == 4 for m in members), 10, "an even share each")
            held = [set(m.partitions) for m in members]
    assert held[0].isdisjoint(held[1]) and len(held[0] | held[1]) == 8
    # Every record was read by exactly one member: no duplicate from double reading.
    assert first.received + second.received == total
    assert first.stored + second.stored == total
    assert first.received > 0 and second.received > 0


def test_a_closed_members_partitions_are_taken_over(log_url: str) -> None:
    topic = "takeover"
    PgLog(log_url).create_topic(topic, 6)
    a = PgLogSubscriber(log_url, [topic], "g", rebalance_interval=0.1)
    b = PgLogSubscriber(log_url, [topic], "g", rebalance_interval=0.1)
    try:
        deadline = time.monotonic() + 10
        while not (len(a.partitions) == len(b.partitions) == 3):
            assert time.monotonic() < deadline, (a.partitions, b.partitions)
            a.poll(10, 0.05)
            b.poll(10, 0.05)
        a.close()
        deadline = time.monotonic() + 10
        while len(b.partitions) < 6:
            assert time.monotonic() < deadline, b.partitions
            b.poll(10, 0.05)
    finally:
        a.close()
        b.close()


def test_a_killed_consumer_process_partitions_are_taken_over(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    inbox = outbox_database_factory()
    topic = "survivor"
    PgLog(log_url).create_topic(topic, 4)
    args = [
        "consumer",
        "--database-url",
        inbox,
        "--transport",
        "postgres",
        "--log-url",
        log_url,
        "--topic",
        topic,
        "--group",
        "g",
    ]
    with Daemon(*args) as doomed, Daemon(*args) as survivor:
        wait_for(lambda: _holders(log_url) == 2, 30, "both members to hold partitions")
        publish(log_url, topic, 0, 400)
        wait_for(lambda: count(inbox, "consumer_queue") == 400, 60, "the first 400 stored")
        doomed.signal(signal.SIGKILL)
        doomed.wait(10)
        publish(log_url, topic, 400, 800)
        wait_for(lambda: count(inbox, "consumer_queue") == 800, 60, "the survivor to take over")
        assert _holders(log_url) == 1
        assert survivor.process.poll() is None, survivor.output()
        survivor.signal(signal.SIGTERM)
        assert survivor.wait(30) == 0, survivor.output()
    assert PgLog(log_url).committed("g", topic) == {p: n for p, n in _ends(log_url).items()}


def _holders(url: str) -> int:
    """How many sessions hold bigint advisory locks (the log's partition locks)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND objsubid = 1 AND granted"
        ).fetchone()
    return int(row[0]) if row else 0


def _ends(url: str) -> dict[int, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT partition, next_offset FROM outbox_log.log_partitions"))


def test_the_subscriber_and_publisher_survive_a_lost_connection(log_url: str) -> None:
    topic = "outage"
    publisher = PgLogPublisher(log_url)
    subscriber = PgLogSubscriber(log_url, [topic], "g", rebalance_interval=0.1)
    try:
        assert publisher.publish([message(topic, 0, b"k")]) == [None]
        assert [r.payload for r in _receive(subscriber, 1)] == [b"0"]
        _terminate(log_url, "outbox-log-%")
        failed = publisher.publish([message(topic, 1, b"k")])
        assert failed[0] is not None and not failed[0].permanent, failed
        assert publisher.publish([message(topic, 2, b"k")]) == [None]
        # The subscriber lost its position with its session: it starts again from the group's
        # committed offset (nothing committed: offset 0), a redelivery the inbox absorbs.
        assert [r.payload for r in _receive(subscriber, 2)] == [b"0", b"2"]
    finally:
        publisher.close()
        subscriber.close()


def _receive(subscriber: PgLogSubscriber, expected: int) -> list[Any]:
    rows: list[Any] = []
    deadline = time.monotonic() + 20
    while len(rows) < expected and time.monotonic() < deadline:
        rows.extend(subscriber.poll(100, 0.1).rows())
    return rows


def _terminate(url: str, application: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            (application,),
        )


# -- retention ------------------------------------------------------------------------------------


def _age(url: str, seconds: int) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox_log.log_records SET created_at = created_at - make_interval(secs => %s)",
            (seconds,),
        )


def _commit_first(url: str, topic: str, group: str, n: int) -> None:
    subscriber = PgLogSubscriber(url, [topic], group)
    try:
        rows = _receive(subscriber, n)
        subscriber.commit(InboxBatch.of(rows[:n]))
    finally:
        subscriber.close()


def test_retention_removes_old_records_every_group_has_read(log_url: str) -> None:
    topic = "retained"
    log = PgLog(log_url)
    log.create_topic(topic, 1)
    publish(log_url, topic, 0, 10)
    _commit_first(log_url, topic, "fast", 10)
    _commit_first(log_url, topic, "slow", 6)
    assert log.apply_retention(3600) == 0  # read by all, but young
    _age(log_url, 7200)
    assert log.apply_retention(3600) == 6  # old, but "slow" has not read 6..9
    assert log.count(topic) == 4
    # A new group starts at the earliest record retained.
    fresh = PgLogSubscriber(log_url, [topic], "new")
    try:
        assert [r.offset for r in _receive(fresh, 4)] == [6, 7, 8, 9]
    finally:
        fresh.close()
    assert log.forget_group("slow") and log.forget_group("new")
    assert log.apply_retention(3600) == 4
    assert log.count(topic) == 0
    # Offsets go on after the deleted ones; a new group starts after them.
    publish(log_url, topic, 10, 12)
    fresh = PgLogSubscriber(log_url, [topic], "newer")
    try:
        assert [r.offset for r in _receive(fresh, 2)] == [10, 11]
    finally:
        fresh.close()


def test_the_publisher_applies_retention_in_the_background(log_url: str) -> None:
    topic = "background"
    PgLog(log_url).create_topic(topic, 2)
    publish(log_url, topic, 0, 50)
    _commit_first(log_url, topic, "g", 50)
    _age(log_url, 7200)
    publisher = PgLogPublisher(log_url, retention=3600, retention_interval=0.1)
    try:
        wait_for(lambda: PgLog(log_url).count(topic) == 0, 10, "retention to delete")
    finally:
        publisher.close()


# -- the command line -----------------------------------------------------------------------------


def test_migrate_creates_the_log_and_the_daemons_refuse_a_log_not_there(
    outbox_database_factory: DatabaseFactory,
    outbox_database_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = outbox_database_factory(migrated=False)
    common = ["--database-url", outbox_database_url, "--transport", "postgres"]
    consumer = ["consumer", *common, "--topic", "t", "--group", "g"]
    assert main(["producer", *common, "--log-url", url]) == 1
    assert "no log schema 'outbox_log': run `outbox migrate --log-url" in capsys.readouterr().err
    assert main(["migrate", "--log-url", url, "--log-schema", "my_log"]) == 0
    assert capsys.readouterr().out == f"log schema 'my_log' created at revision {HEAD_REVISION}\n"
    assert main(["migrate", "--log-url", url, "--log-schema", "my_log"]) == 0  # idempotent
    assert capsys.readouterr().out == (
        f"log schema 'my_log' is already at revision {HEAD_REVISION} (nothing to do)\n"
    )
    check_log(url, "my_log")
    assert main([*consumer, "--log-url", url]) == 1
    assert "run `outbox migrate --log-url URL --log-schema outbox_log`" in capsys.readouterr().err
    assert main(["producer", *common]) == 1
    assert "--log-url is required (or set OUTBOX_LOG_URL)" in capsys.readouterr().err
    unreachable = "postgresql://nobody:hunter2@127.0.0.1:1/none"
    assert main([*consumer, "--log-url", unreachable]) == 1
    err = capsys.readouterr().err
    assert err.startswith("outbox: error: cannot connect to the log database:"), err
    assert len(err.strip().splitlines()) == 1 and "hunter2" not in err


def test_the_transport_comes_from_the_environment(
    outbox_database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OUTBOX_TRANSPORT", "rabbit")
    with pytest.raises(SystemExit) as exited:  # a usage error, as for any bad flag value
        main(["producer", "--database-url", outbox_database_url])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--transport: must be one of kafka, postgres" in err and "OUTBOX_TRANSPORT" in err


def test_the_log_migration_goes_down_and_up_again(
    outbox_database_factory: DatabaseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    from outbox.pglog.log import downgrade

    url = outbox_database_factory(migrated=False)
    upgrade_log(url, "a_log")
    check_log(url, "a_log")
    downgrade(url, "a_log")
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'a_log' AND tablename <> "
            "'log_alembic_version'"
        ).fetchone()
    assert tables == (0,)
    upgrade_log(url, "a_log")
    check_log(url, "a_log")
    assert main(["migrate", "--sql", "--log-url", url, "--log-schema", "b_log"]) == 0
    sql = capsys.readouterr().out
    assert 'CREATE TABLE "b_log".log_records' in sql and "producer_queue" not in sql


def _sessions(url: str, application: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (application,)
        ).fetchone()
    return int(row[0]) if row else 0


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("outbox: error: "), captured.err
    return lines[0]


def test_log_groups_forget_drops_a_gone_groups_offsets_and_refuses_a_live_or_unknown_one(
    log_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = "forgotten"
    log = PgLog(log_url)
    log.create_topic(topic, 2)
    publish(log_url, topic, 0, 10)
    _commit_first(log_url, topic, "gone", 4)
    forget = ["log-groups", "forget", "--log-url", log_url]

    assert main([*forget, "nobody"]) == 1
    assert "log schema 'outbox_log' has no consumer group 'nobody'" in _one_error_line(capsys)

    live = PgLogSubscriber(log_url, [topic], "gone")
    try:
        _receive(live, 1)  # joined the group: a live member
        assert main([*forget, "gone"]) == 1
        error = _one_error_line(capsys)
        assert "consumer group 'gone' has 1 live consumer" in error, error
        assert "stop them first; nothing was changed" in error
        with pytest.raises(GroupInUse) as refused:
            log.forget_group("gone")
        assert len(refused.value.backend_pids) == 1
        assert sum(log.committed("gone", topic).values()) == 4
    finally:
        live.close()

    assert main([*forget, "gone"]) == 0
    assert capsys.readouterr().out == (
        "forgot consumer group 'gone' of log schema 'outbox_log': its offsets no longer hold "
        "back retention\n"
    )
    assert log.committed("gone", topic) == {}
    _age(log_url, 7200)
    assert log.apply_retention(3600) == 10  # no group holds anything back any more
    capsys.readouterr()  # its INFO line
    assert main([*forget, "gone"]) == 1  # forgotten: unknown now
    assert "has no consumer group 'gone'" in _one_error_line(capsys)


def test_a_killed_consumer_does_not_keep_its_group_from_being_forgotten(
    log_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = "killed"
    publish(log_url, topic, 0, 4)
    member = PgLogSubscriber(log_url, [topic], "crashed")
    try:
        assert len(_receive(member, 4)) == 4
        # Its session is gone; its row in log_members stays until someone notices.
        _terminate(log_url, "outbox-log-subscriber")
        wait_for(lambda: _sessions(log_url, "outbox-log-subscriber") == 0, 10, "the session to end")
        assert main(["log-groups", "forget", "--log-url", log_url, "crashed"]) == 0
        assert capsys.readouterr().out.startswith("forgot consumer group 'crashed'")
    finally:
        member.close()


def test_log_groups_forget_needs_a_migrated_log(
    outbox_database_factory: DatabaseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    url = outbox_database_factory(migrated=False)
    assert main(["log-groups", "forget", "--log-url", url, "g"]) == 1
    assert "no log schema 'outbox_log': run `outbox migrate --log-url" in _one_error_line(capsys)
    assert main(["log-groups", "forget", "g"]) == 1
    assert "--log-url is required (or set OUTBOX_LOG_URL)" in _one_error_line(capsys)


# -- lag ------------------------------------------------------------------------------------------


def test_the_lag_of_a_group_is_the_end_of_each_partition_less_its_committed_offset(
    log_url: str,
) -> None:
    topic = "lagging"
    log = PgLog(log_url)
    log.create_topic(topic, 2)
    publish(log_url, topic, 0, 10)
    _commit_first(log_url, topic, "slow", 4)
    _commit_first(log_url, topic, "fast", 10)
    idle = PgLogSubscriber(log_url, ["not.published.yet"], "idle")
    try:
        idle.poll(10, 0.1)  # joins: a group of the log with no partition to commit in
    finally:
        idle.close()

    [slow] = log.lag(["slow"])
    assert slow.error is None and slow.total == 6 and slow.topics() == {topic: 6}
    assert [(p.topic, p.partition) for p in slow.partitions] == [(topic, 0), (topic, 1)]
    assert {p.partition: p.end for p in slow.partitions} == _ends(log_url)
    assert sum(p.committed for p in slow.partitions) == 4
    assert all(p.lag == p.end - p.committed for p in slow.partitions)
    assert {p.partition: p.committed for p in slow.partitions} == log.committed("slow", topic)

    # Every group of the log by name, or the groups asked for in their order; an unknown one
    # has no partitions (as Kafka's reader says).
    every = [(g.group, g.total, len(g.partitions)) for g in log.lag()]
    assert every == [("fast", 0, 2), ("idle", 0, 0), ("slow", 6, 2)]
    assert log.lag(["nobody", "fast"])[0] == GroupLag("nobody")
    assert [g.group for g in log.lag(["nobody", "fast", "nobody"])] == ["nobody", "fast"]
    publish(log_url, topic, 10, 13)
    assert [(g.group, g.total) for g in log.lag(["fast", "slow"])] == [("fast", 3), ("slow", 9)]


def test_status_shows_the_logs_lag_and_check_fails_above_max_lag(
    outbox_database_url: str, log_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = "status.lag"
    PgLog(log_url).create_topic(topic, 2)
    publish(log_url, topic, 0, 10)
    _commit_first(log_url, topic, "shipping", 7)
    status = ["status", "--database-url", outbox_database_url, "--transport", "postgres"]
    args = [*status, "--log-url", log_url]

    assert main(args) == 0
    text = capsys.readouterr().out
    assert "consumer group shipping: lag 3" in text, text
    header = next(line for line in text.splitlines() if "COMMITTED" in line)
    assert header.split() == ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"]

    assert main([*args, "--group", "shipping", "--group", "nobody", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    shipping, nobody = doc["lag"]
    assert shipping["group"] == "shipping" and shipping["total"] == 3 and not shipping["error"]
    assert shipping["topics"] == {topic: 3}
    assert sum(p["end"] for p in shipping["partitions"]) == 10
    assert nobody == {
        "group": "nobody",
        "total": 0,
        "topics": {},
        "partitions": [],
        "error": "no committed offsets: no such group, or it has not committed yet",
    }
    assert main([*args, "--group", "nobody", "--check", "--max-lag", "10"]) == 3, "a typo fails"
    assert "consumer group nobody: cannot read its lag" in capsys.readouterr().out

    assert main([*args, "--check", "--max-lag", "3"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("check: ok")
    assert main([*args, "--check", "--max-lag", "2"]) == 3
    assert "consumer group shipping: lag 3 (> 2)" in capsys.readouterr().out
    assert main([*args, "--check", "--max-lag", "0", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["check"]["problems"] == ["consumer group shipping: lag 3 (> 0)"]

    # The lag is the log's only with --transport postgres, which needs --log-url for --max-lag.
    assert main(["status", "--database-url", outbox_database_url, "--log-url", log_url]) == 0
    assert "consumer group" not in capsys.readouterr().out
    assert main([*status, "--group", "shipping"]) == 0
    assert "--group is not read without --log-url" in capsys.readouterr().err
    assert main([*status, "--check", "--max-lag", "5"]) == 1
    assert "--max-lag with --transport postgres needs --log-url" in _one_error_line(capsys)
    not_migrated = ["--log-url", log_url, "--log-schema", "other_log"]
    assert main([*status, *not_migrated]) == 1
    assert "no log schema 'other_log'" in _one_error_line(capsys)


def test_a_woken_member_keeps_its_nap_at_a_low_rate_and_ends_it_under_sustained_load(
    log_url: str,
) -> None:
    """The nap flag only spares publishers a NOTIFY, which costs them only under sustained
    load: a member woken for a few records keeps it (ending it and announcing it again cost two
    writes and a look per wake-up); one that finds records at every look for AWAKE_AFTER ends
    it with the commit's statement, after the records were handed out (a round trip before would
    delay them).
    """
    PgLog(log_url).create_topic("t.nap", 1)

    def napping() -> bool:
        with psycopg.connect(log_url) as conn:
            row = conn.execute("SELECT bool_and(sleeping) FROM outbox_log.log_members").fetchone()
        return bool(row and row[0])

    subscriber = PgLogSubscriber(log_url, ["t.nap"], "g-nap", rebalance_interval=0.2)
    try:
        deadline = time.monotonic() + 10
        while not napping():  # an empty look announces the nap
            assert time.monotonic() < deadline, "the member never announced its nap"
            assert not subscriber.poll(10, 0.05)
        publish(log_url, "t.nap", 0, 1)
        batch = subscriber.poll(10, 5)
        assert len(batch) == 1
        subscriber.commit(batch)
        subscriber.flush()  # else stored with the next look's fetch
        assert napping(), "a member woken for one record ended its nap"
        assert not subscriber.poll(10, 0.05)  # an empty look: the next records start a new run
        started, looks = time.monotonic(), 0
        # Records at every look, for 2 * AWAKE_AFTER and at least three looks: on a loaded
        # machine one look could take the whole time, and a run of one look ends no nap.
        while time.monotonic() - started < 2 * AWAKE_AFTER or looks < 3:
            looks += 1
            publish(log_url, "t.nap", 0, 1)
            batch = subscriber.poll(10, 5)
            assert len(batch) == 1
            assert napping(), "the nap ended before the records were handed out"
        subscriber.commit(batch)
        subscriber.flush()
        assert not napping(), "sustained load did not end the nap"
    finally:
        subscriber.close()


# -- records not in the log's form ------------------------------------------------------------


def _overwrite(log_url: str, assignment: str, values: dict[int, Any]) -> None:
    """Write a column of the log's records at the given offsets as something other than
    outbox's publisher would (`assignment`: "column = %s", the value bound)."""
    with psycopg.connect(log_url, autocommit=True) as conn:
        for offset, value in values.items():
            conn.execute(
                f"UPDATE outbox_log.log_records SET {assignment} WHERE log_offset = %s",
                (value, offset),
            )


def test_a_record_whose_headers_are_not_in_the_logs_form_is_quarantined(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    """Headers written by something other than outbox's publisher (cut short, a length past
    the end, a name that is not UTF-8) cannot stop the Consumer: the record is stored dead
    with the reason, the records around it flow."""
    inbox = outbox_database_factory()
    topic = "t.raw"
    PgLog(log_url).create_topic(topic, 1)
    publish(log_url, topic, 0, 5, keys=1)
    garbage = {
        1: b"\x00\x05ab",  # a name of 5 bytes, 2 there
        2: b"\x00\x01x\x7f\xff\xff\xff",  # a value of 2 GB
        3: b"\x00\x02\xff\xfe\xff\xff\xff\xff",  # a name that is not UTF-8, null value
    }
    _overwrite(log_url, "headers = %s", garbage)
    consumer = log_consumer(inbox, log_url, topic, "g-raw", [])
    with running(consumer):
        wait_for(lambda: count(inbox, "consumer_queue") >= 5, 30, "the five records")
    assert (consumer.stored, consumer.quarantined) == (2, 3)
    with psycopg.connect(inbox) as conn:
        rows = conn.execute(
            "SELECT source_offset, dead_at IS NOT NULL, last_error FROM outbox.consumer_queue"
            " ORDER BY source_offset"
        ).fetchall()
    assert [(o, dead) for o, dead, _ in rows] == [
        (0, False),
        (1, True),
        (2, True),
        (3, True),
        (4, False),
    ]
    for _, dead, error in rows:
        assert not dead or "headers cannot be read" in error, error


def test_a_record_whose_creation_time_no_datetime_holds_does_not_stop_the_consumer(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    """A creation time written by hand that Python cannot load (infinite, past year 9999,
    before year 1) stopped every fetch of its partition's reader: the record is stored with
    its outbox creation time (the header) and the records around it flow."""
    inbox = outbox_database_factory()
    topic = "t.when"
    PgLog(log_url).create_topic(topic, 1)
    publish(log_url, topic, 0, 5, keys=1)
    times = {1: "infinity", 2: "-infinity", 3: "20000-01-01"}
    _overwrite(log_url, "created_at = %s::timestamptz", times)
    consumer = log_consumer(inbox, log_url, topic, "g-when", [])
    with running(consumer):
        wait_for(lambda: count(inbox, "consumer_queue") >= 5, 30, "the five records")
    assert (consumer.stored, consumer.quarantined) == (5, 0)
    with psycopg.connect(inbox) as conn:
        rows = conn.execute(
            "SELECT source_offset, dead_at IS NULL FROM outbox.consumer_queue ORDER BY 1"
        ).fetchall()
    assert rows == [(offset, True) for offset in range(5)]
