"""Routing on the way in, end to end on Kafka: `broker.send(..., tenant=...)`, the relay, and
`outbox consumer` over several databases as a process, killed with SIGKILL mid-run."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg

from outbox import Broker
from outbox.core.headers import TENANT_HEADER
from outbox.postgres import migrate

from .relay_helpers import count, relay_until_empty, spawn_consumer, wait_for

TENANTS = ("acme", "globex", "initech")
PER_TENANT = 150


def _inbox(url: str) -> list[tuple[Any, ...]]:
    """(message id, tenant header, dead, error) of every row of an inbox (empty when unmigrated)."""
    try:
        with psycopg.connect(url) as conn:
            return conn.execute(
                "SELECT message_id, headers ->> %s, dead_at IS NOT NULL, last_error "
                "FROM outbox.consumer_queue",
                (TENANT_HEADER,),
            ).fetchall()
    except psycopg.errors.UndefinedTable:
        return []


def test_tenants_records_are_stored_once_in_their_own_inbox_across_a_kill_9(
    outbox_database_factory: Callable[..., str],
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
) -> None:
    sender = outbox_database_factory()
    urls = {
        name: outbox_database_factory(migrated=name != "initech") for name in TENANTS
    }  # initech is not migrated yet: its records wait, the others' flow
    sent: dict[str, set[str]] = {name: set() for name in TENANTS}
    broker = Broker(tenant="acme")
    with psycopg.connect(sender) as conn, conn.transaction():
        for n in range(PER_TENANT):
            for name in TENANTS:
                tenant = None if name == "acme" else name  # acme: the broker's own tenant
                mid = broker.send(conn, outbox_topic, {"n": n}, key=f"k{n}", tenant=tenant)
                sent[name].add(str(mid))
        unrouted = Broker().send(conn, outbox_topic, {"n": -1}, key="k0")
    relay_until_empty(sender, outbox_kafka_bootstrap)

    group = f"g-{outbox_topic}"
    flags = [f"--database-url={name}={url}" for name, url in urls.items()]
    args = (outbox_kafka_bootstrap, outbox_topic, group, *flags[1:], "--batch-size", "20")
    args += ("--quarantine-database", "acme")  # required when routing: nothing is guessed
    first = spawn_consumer(flags[0].split("=", 1)[1], *args)
    try:
        wait_for(
            lambda: count(urls["globex"], "consumer_queue") > 0 or first.process.poll() is not None,
            60,
            "a first store",
        )
        assert first.process.poll() is None, first.output()
        first.signal(signal.SIGKILL)
        first.wait(10)
    finally:
        first.close()
    with spawn_consumer(flags[0].split("=", 1)[1], *args) as second:
        for name in ("acme", "globex"):
            wait_for(
                lambda name=name: count(urls[name], "consumer_queue") >= PER_TENANT,
                60,
                f"{name}'s records while initech fails",
            )
        assert _inbox(urls["initech"]) == []
        migrate.upgrade(urls["initech"], "outbox")
        wait_for(
            lambda: count(urls["initech"], "consumer_queue") == PER_TENANT,
            60,
            "initech's records once migrated",
        )
        wait_for(
            lambda: count(urls["acme"], "consumer_queue", "dead_at IS NOT NULL") == 1,
            30,
            "the record without a tenant, quarantined in --quarantine-database",
        )
        second.terminate()
        assert second.wait(30) == 0, second.output()
    for name, url in urls.items():
        rows = _inbox(url)
        live = [r for r in rows if not r[2]]
        assert {str(r[0]) for r in live} == sent[name]
        assert len(live) == PER_TENANT
        assert {r[1] for r in live} == {name}
    dead = [r for r in _inbox(urls["acme"]) if r[2]]
    assert [(str(r[0]), r[3]) for r in dead] == [
        (str(unrouted), f"no tenant header ({TENANT_HEADER!r})")
    ]
