"""`outbox demo`: local servers, transactional sends (some rolled back), the relay, Kafka.

Everything runs on this machine: a throwaway PostgreSQL and Kafka-protocol broker (or the ones
named by OUTBOX_TEST_DATABASE_URL / OUTBOX_TEST_KAFKA_BOOTSTRAP), the Producer relay as its own
process, and a Kafka consumer that prints what arrived.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from outbox.broker import Broker
from outbox.core.headers import MESSAGE_ID
from outbox.postgres import migrate

TOPIC = "demo.orders.created"


def _say(text: str) -> None:
    print(text, flush=True)


def run_demo(messages: int = 10) -> int:
    """Run the demo; return 0 when Kafka received exactly the committed messages."""
    from confluent_kafka import Consumer, TopicPartition

    from outbox.testing.servers import ServerError, create_database, create_topic, start_servers

    base = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    _say("1. starting PostgreSQL and a Kafka-protocol broker on 127.0.0.1 ...")
    try:
        servers = start_servers(base)
    except ServerError as exc:
        print(f"outbox: error: cannot start the demo servers: {exc}", file=sys.stderr)
        return 1
    with servers:
        create_database(servers.postgres.url, "outbox_demo")
        url = servers.postgres.url_for("outbox_demo")
        bootstrap = servers.kafka.bootstrap
        _say(f"   postgres {url}\n   kafka    {bootstrap}")

        _say("2. outbox migrate")
        migrate.upgrade(url)
        create_topic(bootstrap, TOPIC, partitions=3)

        _say(f"3. {messages} business transactions, each inserting an order and sending a message")
        broker = Broker()
        committed: dict[str, int] = {}
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL)")
            conn.commit()
            for order_id in range(1, messages + 1):
                fail = order_id % 4 == 0
                try:
                    with conn.transaction():
                        conn.execute(
                            "INSERT INTO orders VALUES (%s, %s)", (order_id, 10 * order_id)
                        )
                        mid = broker.send(
                            conn,
                            TOPIC,
                            {"order_id": order_id, "total": 10 * order_id},
                            key=f"order-{order_id}",
                        )
                        if fail:
                            raise RuntimeError("payment declined")
                except RuntimeError as exc:
                    _say(f"   order {order_id:>3}: ROLLED BACK ({exc}); message {mid} vanishes")
                    continue
                committed[str(mid)] = order_id
                _say(f"   order {order_id:>3}: committed with message {mid}")

        _say("4. starting the relay: outbox producer (a separate process)")
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
        relay = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "outbox.cli",
                "producer",
                "--database-url",
                url,
                "--kafka-bootstrap",
                bootstrap,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            received = _consume(Consumer, TopicPartition, bootstrap, len(committed))
        finally:
            relay.send_signal(signal.SIGTERM)
            code = relay.wait(30)
            log.close()
        _say(f"   relay stopped on SIGTERM with exit code {code}")

        _say("5. what arrived on Kafka")
        for partition, offset, key, value, received_id in received:
            _say(
                f"   partition {partition} offset {offset:>3} key {key:<10} {value}"
                f"  id {received_id}"
            )
        ids = [r[4] for r in received]
        lost = set(committed) - set(ids)
        unexpected = set(ids) - set(committed)
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
        left = row[0] if row else -1
        _say(
            f"6. committed {len(committed)}, rolled back {messages - len(committed)}, "
            f"received {len(ids)} ({len(set(ids))} distinct), lost {len(lost)}, "
            f"unexpected {len(unexpected)}, still queued {left}"
        )
        ok = not lost and not unexpected and left == 0
        _say("   OK: exactly the committed messages arrived" if ok else "   FAILED")
    return 0 if ok else 1


def _consume(
    consumer_type: type, partition_type: type, bootstrap: str, expected: int
) -> list[tuple[int, int, str, str, str]]:
    consumer = consumer_type(
        {"bootstrap.servers": bootstrap, "group.id": "outbox-demo", "enable.auto.commit": False}
    )
    consumer.assign([partition_type(TOPIC, p, 0) for p in range(3)])
    received: list[tuple[int, int, str, str, str]] = []
    deadline = time.monotonic() + 30
    try:
        while len(received) < expected and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.2):
                if m.error():
                    continue
                headers = dict(m.headers() or [])
                received.append(
                    (
                        m.partition(),
                        m.offset(),
                        m.key().decode(),
                        json.dumps(json.loads(m.value())),
                        headers.get(MESSAGE_ID, b"?").decode(),
                    )
                )
    finally:
        consumer.close()
    return received
