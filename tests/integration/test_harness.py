"""Tests of the test harness itself: servers, per-test databases and topics."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.testing.plugin import DatabaseFactory, TopicFactory
from outbox.testing.servers import (
    PostgresServer,
    Servers,
    TansuBroker,
    create_database,
    docker_available,
    drop_database,
    url_for_database,
)


def _database_exists(admin_url: str, name: str) -> bool:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def _partition_count(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic=topic, timeout=10)
    info = metadata.topics[topic]
    assert info.error is None, info.error
    return len(info.partitions)


def test_two_databases_in_one_test_are_distinct(
    outbox_database_url: str, outbox_database_factory: DatabaseFactory
) -> None:
    other_url = outbox_database_factory()
    assert other_url != outbox_database_url
    with psycopg.connect(outbox_database_url, autocommit=True) as first:
        first.execute("CREATE TABLE harness_marker (id int)")
        first_name = first.execute("SELECT current_database()").fetchone()
    with psycopg.connect(other_url) as second:
        second_name = second.execute("SELECT current_database()").fetchone()
        marker = second.execute("SELECT to_regclass('public.harness_marker')").fetchone()
    assert first_name != second_name
    assert marker == (None,)


def test_cloned_database_has_outbox_schema(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'outbox'"
        ).fetchall()
    tables = {row[0] for row in rows}
    assert {"producer_queue", "consumer_queue"} <= tables, tables


def test_empty_database_has_no_outbox_schema(outbox_empty_database_url: str) -> None:
    with psycopg.connect(outbox_empty_database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'outbox'"
        ).fetchone()
    assert row == (0,)


def test_create_and_drop_database(outbox_admin_url: str) -> None:
    name = f"h_{uuid.uuid4().hex[:12]}"
    create_database(outbox_admin_url, name)
    try:
        assert _database_exists(outbox_admin_url, name)
        # An open connection must not prevent the drop (WITH (FORCE)).
        leaked = psycopg.connect(url_for_database(outbox_admin_url, name))
        try:
            drop_database(outbox_admin_url, name)
        finally:
            leaked.close()
        assert not _database_exists(outbox_admin_url, name)
    finally:
        drop_database(outbox_admin_url, name)


@pytest.mark.parametrize(
    "name", ["", "Upper", "has-dash", "1digit", 'quo"te', "semi;colon", "x" * 64, "sp ace"]
)
def test_create_database_rejects_invalid_name(name: str) -> None:
    # Validation happens before any connection: the URL is never used.
    with pytest.raises(ValueError, match="invalid database name"):
        create_database("postgresql://nobody@127.0.0.1:1/postgres", name)


def test_create_database_rejects_invalid_template_name() -> None:
    with pytest.raises(ValueError, match="invalid database name"):
        create_database("postgresql://nobody@127.0.0.1:1/postgres", "ok_name", template="Bad")


def test_url_for_database_replaces_only_the_database() -> None:
    url = "postgresql://u:p@db.example:5433/postgres?sslmode=disable"
    assert url_for_database(url, "t_1") == "postgresql://u:p@db.example:5433/t_1?sslmode=disable"


def test_topic_exists_with_three_partitions(outbox_topic: str, outbox_kafka_bootstrap: str) -> None:
    assert _partition_count(outbox_kafka_bootstrap, outbox_topic) == 3


def test_topic_factory_names_are_unique_and_sized(
    request: pytest.FixtureRequest, outbox_topic_factory: TopicFactory, outbox_kafka_bootstrap: str
) -> None:
    first = outbox_topic_factory()
    second = outbox_topic_factory(partitions=5)
    assert first != second
    assert first.startswith(request.node.name[:20])
    assert len(first) <= 100
    assert _partition_count(outbox_kafka_bootstrap, second) == 5


def test_produced_message_can_be_consumed(outbox_topic: str, outbox_kafka_bootstrap: str) -> None:
    payload = uuid.uuid4().bytes
    producer = Producer({"bootstrap.servers": outbox_kafka_bootstrap})
    producer.produce(outbox_topic, key=b"key", value=payload)
    assert producer.flush(15) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": outbox_kafka_bootstrap,
            "group.id": f"harness-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        # assign (not subscribe): no consumer-group join, so no rebalance delay.
        consumer.assign([TopicPartition(outbox_topic, p, 0) for p in range(3)])
        deadline = time.monotonic() + 15
        received = None
        while received is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received = message
    finally:
        consumer.close()
    assert received is not None, "message not consumed within 15 s"
    assert received.key() == b"key"
    assert received.value() == payload


def test_docker_unavailable_when_docker_host_socket_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-such-docker.sock'}")
    started = time.monotonic()
    assert docker_available() is False
    assert time.monotonic() - started < 1.0


def test_docker_unavailable_when_socket_does_not_speak_http(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)  # accepts, never answers: the probe must time out quickly
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        started = time.monotonic()
        assert docker_available(timeout=0.2) is False
        assert time.monotonic() - started < 1.0


def test_tansu_pause_blocks_and_resume_restores(outbox_servers: Servers) -> None:
    if not isinstance(outbox_servers.kafka, TansuBroker):
        pytest.skip("pause/resume needs the local Tansu broker")
    # A private broker: pausing the session one would disturb other tests.
    with TansuBroker.start() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.list_topics(timeout=5)
        broker.pause()
        try:
            with pytest.raises(KafkaException):
                admin.list_topics(timeout=1)
        finally:
            broker.resume()
        ports = {b.port for b in admin.list_topics(timeout=10).brokers.values()}
        assert ports == {broker.port}
        del admin  # Tansu lingers on SIGTERM while clients stay connected
    assert broker.process.poll() is not None  # stopped on exit
    assert not broker.workdir.exists()


def test_postgres_restart_keeps_data_and_port(outbox_servers: Servers) -> None:
    if not isinstance(outbox_servers.postgres, PostgresServer):
        pytest.skip("restart needs the local PostgreSQL server")
    # A private server: restarting the session one would break other tests' connections.
    with PostgresServer.start() as server:
        old_pid, port = server.pid, server.port
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE survives (id int)")
            conn.execute("INSERT INTO survives VALUES (42)")
        server.restart()
        assert server.port == port
        assert server.pid != old_pid
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT id FROM survives").fetchall() == [(42,)]
    assert not server.root.exists()
