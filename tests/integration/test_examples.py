"""The example services (examples/) with the real daemons as processes, and the demo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from examples import orders_service, shipping_service
from outbox.postgres.migrate import sqlalchemy_url
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import (
    Daemon,
    RelayTransport,
    count,
    spawn_consumer,
    spawn_handler,
    spawn_producer,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HANDLERS = "examples.shipping_service.handlers:handlers"


def _shipments(url: str) -> list[tuple[int, UUID]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT order_id, message_id FROM shipments").fetchall()


def _place_orders(url: str, total: int, decline_every: int) -> tuple[dict[int, UUID], list[int]]:
    """Place `total` orders, rolling back every `decline_every`-th; (committed, rolled back)."""
    committed: dict[int, UUID] = {}
    rolled_back: list[int] = []
    engine = create_engine(sqlalchemy_url(url))
    try:
        with Session(engine) as session:
            for n in range(1, total + 1):
                order_id, message_id = orders_service.place_order(
                    session, f"customer-{n}", Decimal(n) + Decimal("0.99")
                )
                if n % decline_every == 0:
                    session.rollback()
                    rolled_back.append(order_id)
                else:
                    session.commit()
                    committed[order_id] = message_id
    finally:
        engine.dispose()
    return committed, rolled_back


def _relays(
    relay_transport: RelayTransport, orders_url: str, shipping_url: str, topic: str
) -> tuple[Daemon, Daemon]:
    """`outbox producer` and `outbox consumer` of the example: on Kafka with flags, on the
    PostgreSQL log as examples/README.md shows it, with OUTBOX_TRANSPORT and OUTBOX_LOG_URL."""
    group = f"shipping-{topic}"
    if not relay_transport.is_log:
        return (
            spawn_producer(orders_url, relay_transport.endpoint),
            spawn_consumer(shipping_url, relay_transport.endpoint, topic, group),
        )
    env = {"OUTBOX_TRANSPORT": "postgres", "OUTBOX_LOG_URL": relay_transport.endpoint}
    return (
        Daemon("producer", "--database-url", orders_url, env=env),
        # The registry's topics: this test's, through ORDERS_TOPIC (set by the caller).
        Daemon("consumer", HANDLERS, "--database-url", shipping_url, "--group", group, env=env),
    )


def test_orders_and_shipping_services_with_the_daemons_as_processes(
    outbox_database_factory: DatabaseFactory,
    relay_transport: RelayTransport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """30 orders, every 5th rolled back: each of the 24 committed is shipped exactly once,
    through Kafka and through the log kept in PostgreSQL."""
    outbox_topic = relay_transport.topic()
    orders_url = outbox_database_factory()
    shipping_url = outbox_database_factory()
    orders_service.create_schema(orders_url)
    shipping_service.create_schema(shipping_url)
    # The daemons inherit the environment: the handler registry subscribes to this test's topic.
    monkeypatch.setenv(orders_service.TOPIC_ENV, outbox_topic)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )

    producer, consumer = _relays(relay_transport, orders_url, shipping_url, outbox_topic)
    with producer, consumer, spawn_handler(shipping_url, HANDLERS) as handler:
        committed, rolled_back = _place_orders(orders_url, total=30, decline_every=5)
        assert len(committed) == 24
        assert len(rolled_back) == 6
        wait_for(
            lambda: count(shipping_url, "consumer_processed") == 24,
            60,
            "the 24 committed orders to be handled",
        )
        time.sleep(0.5)  # room for a duplicate delivery or handling to show up
        for daemon in (producer, consumer, handler):
            daemon.terminate()
        for daemon in (producer, consumer, handler):
            assert daemon.wait(30) == 0, daemon.output()

    assert count(orders_url) == 0, "producer_queue should be empty"
    with psycopg.connect(orders_url) as conn:
        orders = {row[0] for row in conn.execute("SELECT id FROM orders")}
    assert orders == set(committed)
    shipments = _shipments(shipping_url)
    per_order = Counter(order_id for order_id, _ in shipments)
    assert set(per_order) == set(committed)
    assert all(n == 1 for n in per_order.values()), f"shipped twice: {per_order}"
    assert not set(per_order) & set(rolled_back)
    assert dict(shipments) == committed  # each shipment names its order's message
    assert count(shipping_url, "consumer_processed") == 24
    assert count(shipping_url, "consumer_queue") == 0  # handled rows left it; none dead


def test_the_demo_runs_end_to_end() -> None:
    """`python -m examples.demo` (what `./run demo` runs) starts its own servers, three daemons,
    and checks its own result; each message shows a distinct id."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--messages", "8"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    declined = re.findall(r"^\s+#(\d+)\s.*ROLLED BACK", output, re.MULTILINE)
    assert declined == ["4", "8"], output
    assert "2 rolled back (#4, #8)" in output
    assert "producer exited 0, consumer exited 0, handler exited 0" in output
    shipping_status = output.index("outbox status --database-url <shipping")
    orders_status = output.index("outbox status --database-url <orders")
    assert "consumer_queue" in output[shipping_status:orders_status]  # the status tables
    assert "producer_queue" in output[orders_status:]
    assert "OK: exactly one shipment for each committed order" in output
    # The message column: the random end of each UUIDv7, not its time prefix shared by all.
    shown = re.findall(r"^\s+#\d+\s.*?(…[0-9a-f]{8})", output, re.MULTILINE)
    assert len(shown) == 8 and len(set(shown)) == 8, output
    print(f"the demo took {time.monotonic() - started:.1f} s")
