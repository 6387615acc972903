"""Tenants added to the databases files of running daemons, the producer's file first.

Operators add a tenant to each daemon's file in some order; the producer's may well come
first. Its messages then reach a consumer whose file does not name the tenant yet: they wait
for the file (`Routing.unknown_grace`) and are stored in the tenant's inbox when it does, never
quarantined as `unknown tenant` (issue 36).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg

from outbox import Broker, Message
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import TEST_CONSUMER_KAFKA, Daemon, count, wait_for


def _send(url: str, topic: str, tenant: str, n: int) -> list[uuid.UUID]:
    with psycopg.connect(url) as conn, conn.transaction():
        return Broker(tenant=tenant).send_many(
            conn, [Message(topic, {"tenant": tenant, "n": i}, key=f"k{i % 3}") for i in range(n)]
        )


def _stored(url: str) -> list[uuid.UUID]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id FROM outbox.consumer_queue WHERE dead_at IS NULL"
        ).fetchall()
    return [row[0] for row in rows]


def _lines(entries: dict[str, str]) -> str:
    return "".join(f"{name}={url}\n" for name, url in entries.items())


def test_tenants_added_to_the_producers_file_first_are_stored_never_quarantined(
    outbox_database_factory: DatabaseFactory,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    tmp_path: Path,
) -> None:
    first = {f"a{i}": outbox_database_factory() for i in range(2)}
    added = {f"b{i}": outbox_database_factory() for i in range(3)}
    quarantine = outbox_database_factory()
    producers, consumers = tmp_path / "producer.txt", tmp_path / "consumer.txt"
    producers.write_text(_lines(first))
    consumers.write_text(_lines(first))
    settings = [f"--kafka-config={k}={v}" for k, v in TEST_CONSUMER_KAFKA.items()]
    with (
        Daemon(
            "producer",
            "--databases-file",
            str(producers),
            "--kafka-bootstrap",
            outbox_kafka_bootstrap,
            "--poll-interval",
            "0.2",
        ) as producer,
        Daemon(
            "consumer",
            "--databases-file",
            str(consumers),
            "--kafka-bootstrap",
            outbox_kafka_bootstrap,
            "--topic",
            outbox_topic,
            "--group",
            f"g-{outbox_topic}",
            "--quarantine-database",
            f"q={quarantine}",
            *settings,
        ) as consumer,
    ):
        sent = {name: _send(url, outbox_topic, name, 3) for name, url in first.items()}
        for name, url in first.items():
            wait_for(lambda url=url: len(_stored(url)) == 3, 90, f"{name} stored", 0.1)
        # The producer's file names the new tenants first; they send at once.
        producers.write_text(_lines({**first, **added}))
        sent |= {name: _send(url, outbox_topic, name, 5) for name, url in added.items()}
        for name, url in added.items():
            wait_for(lambda url=url: count(url) == 0, 60, f"{name} relayed", 0.1)
        # Read by a consumer that does not serve them yet (it says so); its file follows.
        wait_for(
            lambda: "records of an unknown tenant 'b" in consumer.output(),
            60,
            "the consumer to read a new tenant's records",
            0.1,
        )
        consumers.write_text(_lines({**first, **added}))
        for name, url in added.items():
            wait_for(lambda url=url: len(_stored(url)) == 5, 60, f"{name} stored", 0.1)
        for daemon in (producer, consumer):
            daemon.terminate()
            assert daemon.wait(30) == 0, daemon.output()
        output = consumer.output()
    assert "quarantined=0" in output and "quarantined (stored dead" not in output, output
    with psycopg.connect(quarantine) as conn:
        row = conn.execute("SELECT count(*) FROM outbox.consumer_queue").fetchone()
    assert row == (0,), "records quarantined"
    for name, url in {**first, **added}.items():
        assert sorted(_stored(url)) == sorted(sent[name]), name  # each once, in its own inbox
