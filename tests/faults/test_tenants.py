"""Issue 25's end-to-end check: one producer, one consumer and one handler process serve 50
tenant databases on Kafka. Each is killed with SIGKILL and started again while messages flow,
and one tenant's database is dropped mid-run. Every message of the other tenants is handled
exactly once, in order per key, in its own tenant's database, and the daemons stay up."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from outbox import Broker
from outbox.core.databases import Database
from outbox.testing.plugin import DatabaseFactory

from ..integration.relay_helpers import Daemon, wait_for
from .tenants_app import SCHEMA

pytestmark = pytest.mark.faults

TENANTS = 50
KEYS = 3
KAFKA_TEST = [
    "--kafka-config",
    "session.timeout.ms=2000",
    "--kafka-config",
    "heartbeat.interval.ms=500",
]


def _send_round(
    conn: psycopg.Connection[object], database: Database, broker: Broker, topic: str, round_: int
) -> int:
    """One message per key for `database`'s tenant, in one transaction; the count sent."""
    with conn.transaction():
        for key in range(KEYS):
            broker.send(
                conn,
                topic,
                {"tenant": database.name, "key": f"k{key}", "seq": round_},
                key=f"k{key}",
                tenant=database.name,
            )
    return KEYS


def _handled(database: Database) -> list[tuple[str, str, str, int]]:
    with psycopg.connect(database.url) as conn:
        return [
            (str(row[0]), row[1], row[2], row[3])
            for row in conn.execute("SELECT message_id, tenant, key, seq FROM effects ORDER BY n")
        ]


def test_fifty_tenants_through_one_set_of_daemons_killed_and_one_tenant_dropped(
    outbox_database_factory: DatabaseFactory,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: object,
    outbox_admin_url: str,
    tmp_path: Path,
) -> None:
    topic = outbox_topic_factory(3)  # type: ignore[operator]
    tenants = [Database(f"t{i:02}", outbox_database_factory(), "outbox") for i in range(TENANTS)]
    for tenant in tenants:
        with psycopg.connect(tenant.url, autocommit=True) as conn:
            conn.execute(SCHEMA)
    dropped = tenants[7]
    listing = tmp_path / "tenants.txt"
    listing.write_text("".join(f"{t.name}={t.url}\n" for t in tenants))
    env = {"TENANTS_APP_TOPIC": topic}
    common = ["--databases-file", str(listing), "--poll-interval", "0.2"]

    def producer() -> Daemon:
        return Daemon("producer", *common, "--kafka-bootstrap", outbox_kafka_bootstrap)

    def consumer() -> Daemon:
        return Daemon(
            "consumer",
            "--databases-file",
            str(listing),
            "--kafka-bootstrap",
            outbox_kafka_bootstrap,
            "--topic",
            topic,
            "--group",
            f"g-{topic}",
            "--quarantine-database",
            tenants[0].name,
            *KAFKA_TEST,
        )

    def handler() -> Daemon:
        return Daemon("handler", "tests.faults.tenants_app:handlers", *common, env=env)

    sent = {t.name: 0 for t in tenants}
    stop = threading.Event()
    live = list(tenants)
    lock = threading.Lock()

    def sender() -> None:
        try:
            send_rounds()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    errors: list[BaseException] = []

    def send_rounds() -> None:
        broker = Broker(schema="outbox")
        conns = {t.name: psycopg.connect(t.url, autocommit=True) for t in tenants}
        round_ = 0
        try:
            while not stop.is_set():
                with lock:  # a whole round: the test drops a tenant only between rounds
                    for tenant in live:
                        conn = conns[tenant.name]
                        sent[tenant.name] += _send_round(conn, tenant, broker, topic, round_)
                round_ += 1
                time.sleep(0.05)
        finally:
            for conn in conns.values():
                conn.close()

    daemons = {"producer": producer(), "consumer": consumer(), "handler": handler()}
    thread = threading.Thread(target=sender, daemon=True)
    codes: dict[str, int | None] = {}
    outputs: dict[str, str] = {}
    try:
        thread.start()
        try:
            time.sleep(3)
            with lock:
                live.remove(dropped)
            with psycopg.connect(outbox_admin_url, autocommit=True) as admin:
                name = dropped.url.rsplit("/", 1)[1]
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            for kind, start in (
                ("producer", producer),
                ("consumer", consumer),
                ("handler", handler),
            ):
                time.sleep(2)
                daemons[kind].signal(signal.SIGKILL)
                daemons[kind].wait(10)
                daemons[kind].close()
                daemons[kind] = start()
            time.sleep(2)
        finally:
            stop.set()
            thread.join(30)
        assert not errors, errors
        for tenant in live:
            wait_for(
                lambda t=tenant: len(_handled(t)) >= sent[t.name],  # type: ignore[misc]
                120,
                f"every message of {tenant.name} handled",
                interval=0.5,
            )
        for kind, daemon in daemons.items():
            assert daemon.process.poll() is None, f"{kind} exited:\n{daemon.output()}"
        for tenant in live:
            rows = _handled(tenant)
            ids = [row[0] for row in rows]
            assert len(ids) == len(set(ids)) == sent[tenant.name], tenant.name
            assert {row[1] for row in rows} == {tenant.name}
            for key in range(KEYS):
                seqs = [row[3] for row in rows if row[2] == f"k{key}"]
                assert seqs == sorted(seqs), (tenant.name, key)
    finally:
        for daemon in daemons.values():
            if daemon.process.poll() is None:
                daemon.signal(signal.SIGTERM)
        for kind, daemon in daemons.items():
            codes[kind] = daemon.wait(60)
            outputs[kind] = daemon.output()
            daemon.close()
    assert codes == {"producer": 0, "consumer": 0, "handler": 0}, outputs
