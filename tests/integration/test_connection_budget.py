"""A connection budget per process (`--max-connections`) over more active tenants than it fits.

Ten tenant databases, every one with messages, a budget of 6: each daemon never holds more than
6 connections to them (sampled in pg_stat_activity all along), and every tenant's messages are
relayed (or handled) once, in order per key: short of connections, a database waits for one,
it does not fail.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from outbox.testing.plugin import DatabaseFactory
from outbox.testing.servers import free_port

from . import inbox_app
from .relay_helpers import Daemon, consume, count, wait_for
from .test_inbox import put
from .test_observability import scrape, value
from .test_tenant_relays import HANDLERS, _effects, _file, _health, _send

BUDGET = 6
TENANTS = 10


@contextmanager
def _sampled(admin_url: str, urls: list[str], daemon: str) -> Iterator[list[int]]:
    """The connections named `outbox-DAEMON` to the databases of `urls`, sampled every 20 ms
    while the block runs (the list of counts)."""
    names = [conninfo_to_dict(url)["dbname"] for url in urls]
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            while not done.wait(0.02):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = %s AND datname = ANY(%s)",
                    (f"outbox-{daemon}", names),
                ).fetchone()
                samples.append(int(row[0]) if row else 0)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join(5)


def _held(samples: list[int]) -> int:
    """The most connections seen in two samples in a row (20 ms apart). A backend stays in
    pg_stat_activity until its process exits, a few ms after the daemon closed its connection
    (tens on a loaded machine): a connection handed from one database to another (the shared
    handler workers' sessions, many times a second) is seen twice for an instant."""
    return max((min(a, b) for a, b in itertools.pairwise(samples)), default=0)


def _with_effects(tenants: dict[str, str]) -> None:
    """The `effects` table of inbox_app's handler in each tenant's database."""
    for url in tenants.values():
        with psycopg.connect(url) as conn:
            conn.execute(inbox_app.SCHEMA)


def _handler(file: Path, budget: int, *extra: str) -> Daemon:
    """`outbox handler` of inbox_app over the databases of `file`, --concurrency 4, under
    `budget` connections."""
    return Daemon(
        "handler",
        HANDLERS,
        "--databases-file",
        str(file),
        "--batch-size",
        "10",
        "--concurrency",
        "4",
        "--max-connections",
        str(budget),
        *extra,
    )


def _handled_once_in_order(tenants: dict[str, str], put_ids: dict[str, list[uuid.UUID]]) -> None:
    """Each tenant's messages (`put_ids`) handled once each, in order per key (n % 4)."""
    for name, url in tenants.items():
        effects = _effects(url)
        assert Counter(row[0] for row in effects) == Counter(put_ids[name]), name
        bodies = [json.loads(row[1]) for row in effects]
        for key in range(4):
            ns = [b["n"] for b in bodies if b["n"] % 4 == key]
            assert ns == sorted(ns), f"{name} key k{key} out of order"


def _ready(port: int) -> bool:
    try:
        return _health(port, "/readyz")[0] == 200
    except OSError:  # not listening yet
        return False


def test_a_producer_over_ten_active_tenants_holds_at_most_its_budget(
    outbox_database_factory: DatabaseFactory,
    outbox_admin_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    tmp_path: Path,
) -> None:
    tenants = {f"t{i}": outbox_database_factory() for i in range(TENANTS)}
    file = tmp_path / "databases.txt"
    _file(file, tenants)
    sent = {name: _send(url, outbox_topic, name, 30) for name, url in tenants.items()}
    health = free_port()
    with (
        _sampled(outbox_admin_url, list(tenants.values()), "producer") as samples,
        Daemon(
            "producer",
            "--databases-file",
            str(file),
            "--kafka-bootstrap",
            outbox_kafka_bootstrap,
            "--poll-interval",
            "0.2",
            "--batch-size",
            "5",
            "--max-connections",
            str(BUDGET),
            *("--health-port", str(health), "--health-host", "127.0.0.1"),
        ) as producer,
    ):
        wait_for(lambda: _ready(health) or producer.process.poll() is not None, 60, "ready", 0.2)
        assert producer.process.poll() is None, producer.output()
        for url in tenants.values():
            wait_for(lambda url=url: count(url) == 0, 120, "every tenant relayed", 0.1)
        status, reason = _health(health, "/readyz")
        assert status == 200 and "connections: " in reason and f" of {BUDGET}" in reason, reason
        producer.terminate()
        assert producer.wait(30) == 0, producer.output()
    assert samples and max(samples) <= BUDGET, (max(samples), len(samples))
    assert max(samples) >= 2  # the sampler saw the daemon at work
    records = consume(outbox_kafka_bootstrap, outbox_topic, sum(map(len, sent.values())))
    by_tenant: dict[str, list[tuple[str, int]]] = {}
    for record in records:
        body = json.loads(record.value())
        by_tenant.setdefault(body["tenant"], []).append((record.key().decode(), body["n"]))
    for name in tenants:
        assert sorted(n for _, n in by_tenant[name]) == list(range(30)), name  # once each
        for key in {k for k, _ in by_tenant[name]}:
            ns = [n for k, n in by_tenant[name] if k == key]
            assert ns == sorted(ns), f"{name} key {key} out of order"


def test_a_handler_over_ten_active_tenants_holds_at_most_its_budget(
    outbox_database_factory: DatabaseFactory,
    outbox_admin_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """--concurrency 4 with a budget of 6: the databases share 3 worker sessions (half the
    budget), so at most 3 tenants' relays are connected at a time, and 6 connections in all."""
    topic = inbox_app.TOPIC
    monkeypatch.setenv("INBOX_APP_TOPIC", topic)
    tenants = {f"h{i}": outbox_database_factory() for i in range(TENANTS)}
    _with_effects(tenants)
    keys = [f"k{i % 4}" for i in range(40)]
    put_ids = {
        name: put(url, topic, [{"tenant": name, "n": i} for i in range(40)], list(keys))
        for name, url in tenants.items()
    }
    file = tmp_path / "databases.txt"
    _file(file, tenants)
    with (
        _sampled(outbox_admin_url, list(tenants.values()), "handler") as samples,
        _handler(file, BUDGET) as handler,
    ):
        for url in tenants.values():
            wait_for(lambda url=url: len(_effects(url)) == 40, 120, "tenants handled", 0.1)
        handler.terminate()
        assert handler.wait(30) == 0, handler.output()
    assert samples and _held(samples) <= BUDGET, samples
    assert max(samples) >= 2
    _handled_once_in_order(tenants, put_ids)


def test_a_routing_consumer_over_ten_tenants_holds_at_most_its_budget(
    outbox_database_factory: DatabaseFactory, outbox_admin_url: str
) -> None:
    """The consumer's connection per database is taken from the budget (3 here): records of
    a database waiting for one wait in memory, idle databases give theirs back, all stored."""
    from outbox.core.databases import Database
    from outbox.core.headers import TENANT_HEADER
    from outbox.daemons.budget import Budget
    from outbox.daemons.consumer import Consumer, ConsumerConfig, Subscription
    from outbox.daemons.routing import Routing
    from outbox.postgres.inbox import APPLICATION_NAME
    from outbox.runtime import postgres_stores
    from outbox.testing.memory import InMemoryTransport

    from .relay_helpers import running

    tenants = {f"c{i}": outbox_database_factory() for i in range(TENANTS)}
    transport = InMemoryTransport()
    transport.create_topic("orders", 3)
    for n in range(200):
        tenant = f"c{n % TENANTS}"
        transport.append("orders", b"k%d" % (n % 7), b"%d" % n, [(TENANT_HEADER, tenant.encode())])
    budget = Budget(3)
    consumer = Consumer(
        ConsumerConfig(batch_size=20, poll_timeout=0.05, connect_timeout=5),
        lambda: transport.subscriber(["orders"], "g"),
        subscription=Subscription(group="g", topics=["orders"]),
        inbox=postgres_stores().inboxes,
        routing=Routing(
            databases=tuple(Database(name, url, "outbox") for name, url in tenants.items()),
            quarantine="c0",
            budget=budget,
        ),
    )

    def stored(url: str) -> list[int]:
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT payload FROM outbox.consumer_queue ORDER BY source_partition, source_offset"
            ).fetchall()
        return [int(bytes(row[0])) for row in rows]

    with (
        _sampled(
            outbox_admin_url, list(tenants.values()), APPLICATION_NAME.removeprefix("outbox-")
        ) as samples,
        running(consumer),
    ):
        for url in tenants.values():
            wait_for(lambda url=url: len(stored(url)) == 20, 60, "every tenant stored", 0.1)
    assert max(samples) <= 3 and budget.peak <= 3, (max(samples), budget.peak)
    assert max(samples) >= 1
    for index, url in enumerate(tenants.values()):
        assert sorted(stored(url)) == list(range(index, 200, TENANTS))  # once each


def test_a_handlers_workers_are_shared_by_its_tenants_so_each_keeps_its_relay_connected(
    outbox_database_factory: DatabaseFactory,
    outbox_admin_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """--concurrency 4 with a budget of 16 over ten tenants: 4 worker sessions shared by the
    ten (not 4 per tenant: 10 x 5 = 50 connections, or 3 tenants at a time within 16), so every
    tenant's relay stays connected at once beside them, 14 connections at most, every message
    handled once and in order per key. Tenants get rows again while the others are idle: the
    idle ones' workers go to them."""
    topic = inbox_app.TOPIC
    monkeypatch.setenv("INBOX_APP_TOPIC", topic)
    tenants = {f"w{i}": outbox_database_factory() for i in range(TENANTS)}
    names = {name: conninfo_to_dict(url)["dbname"] for name, url in tenants.items()}
    _with_effects(tenants)
    keys = [f"k{i % 4}" for i in range(40)]
    put_ids = {
        name: put(url, topic, [{"tenant": name, "n": i} for i in range(20)], keys[:20])
        for name, url in tenants.items()
    }
    file = tmp_path / "databases.txt"
    _file(file, tenants)
    budget = 16
    health, metrics = free_port(), free_port()

    def connected() -> set[str]:
        with psycopg.connect(outbox_admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT DISTINCT datname FROM pg_stat_activity "
                "WHERE application_name = 'outbox-handler' AND datname = ANY(%s)",
                (list(names.values()),),
            ).fetchall()
        return {str(row[0]) for row in rows}

    with (
        _sampled(outbox_admin_url, list(tenants.values()), "handler") as samples,
        _handler(
            file,
            budget,
            *("--health-port", str(health), "--health-host", "127.0.0.1"),
            *("--metrics-port", str(metrics), "--metrics-host", "127.0.0.1"),
        ) as handler,
    ):
        for url in tenants.values():
            wait_for(lambda url=url: len(_effects(url)) == 20, 120, "tenants handled", 0.1)
        # Every relay holds its connection at once: only the workers were shared.
        wait_for(lambda: connected() == set(names.values()), 30, "every relay connected", 0.2)
        status, reason = _health(health, "/readyz")
        # Every database listed with its connections: the relay's, and the workers' sessions
        # still open where they last ran (nobody waits for them).
        assert status == 200 and f" of {budget} (" in reason, reason
        assert all(f"{name} " in reason.split("connections:")[1] for name in tenants), reason
        # The metrics say the same: the budget, every database's connections, the workers'
        # sessions reserved and not in use (at most the 4), nobody waiting.
        scraped = scrape(metrics)
        assert value(scraped, "outbox_connection_budget") == budget, scraped
        for name in names:
            assert value(scraped, "outbox_connections", database=name) is not None, (name, scraped)
        reserved = value(scraped, "outbox_connections_reserved")
        assert reserved is not None and 0 <= reserved <= 4, scraped
        assert value(scraped, "outbox_connections_waiting") == 0, scraped
        # Rows again, for every tenant, now that the workers went back: handled too.
        for name, url in tenants.items():
            put_ids[name] += put(
                url, topic, [{"tenant": name, "n": i} for i in range(20, 40)], keys[20:]
            )
        for url in tenants.values():
            wait_for(lambda url=url: len(_effects(url)) == 40, 120, "tenants handled again", 0.1)
        handler.terminate()
        assert handler.wait(30) == 0, handler.output()
    assert samples and _held(samples) <= TENANTS + 4, samples
    _handled_once_in_order(tenants, put_ids)
