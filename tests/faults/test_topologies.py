"""Deployment topologies with real daemon processes: several services on one cluster, two
schemas in one database, a service that talks to itself, several daemons of each kind.

Each test sends keyed messages with a per-key sequence number and checks: every message
handled exactly once (none lost, none twice), each key's messages handled in order, and the
lanes shared fairly among the relays of each queue (every lane held, nobody above its share).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from outbox.postgres.migrate import upgrade

from .conftest import FaultResult
from .fleet import (
    Fleet,
    Service,
    Writer,
    account,
    assert_clean,
    drained,
    exits_report,
    lanes_report,
    report,
    wait_fair_lanes,
    wait_until,
)

pytestmark = pytest.mark.faults


def _received(service: Service) -> int:
    with psycopg.connect(service.url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {service.name}_received").fetchone()
    return int(row[0]) if row else 0


def _run(
    title: str,
    services: list[Service],
    routes: dict[str, tuple[str, str]],
    writers: list[Writer],
    results: list[FaultResult],
    *,
    during: Callable[[Fleet], None] | None = None,
) -> None:
    started = time.monotonic()
    fleet = Fleet(services)
    receivers = [s for s in services if s.consumes]
    fleet.start()
    stopped = False
    try:
        wait_fair_lanes(services, fleet)
        for writer in writers:
            writer.start()
        # Progress at the same time: by the time the first writer is done, every receiving
        # service has handled some of its messages.
        wait_until(lambda: any(not w.is_alive() for w in writers), 120, "a writer", fleet)
        progress = {s.name: _received(s) for s in receivers}
        if during is not None:
            during(fleet)
        for writer in writers:
            wait_until(lambda w=writer: not w.is_alive(), 120, f"{writer.name}", fleet)  # type: ignore[misc]
            assert not writer.errors, writer.errors
        wait_until(
            lambda: drained(services, routes, []),
            90,
            lambda: f"every message handled; {lanes_report(services)}",
            fleet,
            interval=0.5,
        )
        wait_fair_lanes(services, fleet)
        stopped = True
        bad_stops = fleet.stop()
    finally:
        if not stopped:
            fleet.close()
    rows = account(services, routes)
    extra = [f"   progress when the first writer finished: {progress}"]
    extra += [f"   restarts: {dict(fleet.restarts)}"] if fleet.restarts else []
    extra += exits_report(fleet.unexpected) + exits_report(bad_stops)
    table = report(title, rows, extra)
    results.append(
        FaultResult(
            title,
            sum(r.sent for r in rows),
            sum(r.handled_once for r in rows),
            sum(r.handled_twice for r in rows),
            sum(r.lost for r in rows),
            sum(r.failing_dead + r.other_dead for r in rows),
            time.monotonic() - started,
        )
    )
    assert_clean(rows, table)
    assert all(r.handled_once == r.sent for r in rows), table
    assert not fleet.unexpected, "a daemon exited on its own\n" + table
    assert not bad_stops, "a daemon did not stop cleanly on SIGTERM\n" + table
    slow = [name for name, n in progress.items() if n == 0]
    assert not slow, f"{slow} handled nothing while the others made progress\n{table}"


def test_several_services_on_one_cluster_each_with_its_database(
    outbox_database_factory: Any,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: Any,
    fault_results: list[FaultResult],
) -> None:
    """Three services in a ring (a -> b -> c -> a), a database each, default schema.

    Regression test: the relays looked for free lanes in pg_locks of the whole cluster, so the
    relay of the second database found every lane "held" by the first and owned none.
    """
    names = ["a", "b", "c"]
    topics = {n: outbox_topic_factory() for n in names}  # topics[n]: what n receives
    services = [
        Service(n, outbox_database_factory(), outbox_kafka_bootstrap, consumes=[topics[n]])
        for n in names
    ]
    routes = {topics[names[(i + 1) % 3]]: (n, names[(i + 1) % 3]) for i, n in enumerate(names)}
    writers = [
        Writer(services[i], topics[names[(i + 1) % 3]], total=400, pause=0.02, seed=i)
        for i in range(3)
    ]
    _run("three services, a database each", services, routes, writers, fault_results)


def test_two_schemas_in_one_database(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: Any,
    fault_results: list[FaultResult],
) -> None:
    """Two services sharing one database, one in schema `outbox`, one in `svc_y`."""
    upgrade(outbox_database_url, schema="svc_y")
    to_x, to_y = outbox_topic_factory(), outbox_topic_factory()
    x = Service("x", outbox_database_url, outbox_kafka_bootstrap, consumes=[to_x])
    y = Service("y", outbox_database_url, outbox_kafka_bootstrap, "svc_y", consumes=[to_y])
    writers = [
        Writer(x, to_y, total=400, pause=0.02, seed=1),
        Writer(y, to_x, total=400, pause=0.02, seed=2),
    ]
    routes = {to_y: ("x", "y"), to_x: ("y", "x")}
    _run("two schemas, one database", [x, y], routes, writers, fault_results)


def test_one_service_that_sends_and_receives(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: Any,
    fault_results: list[FaultResult],
) -> None:
    """Requests on one topic; the handler replies with broker.send in its transaction on a
    second topic, which the same service's producer relays and its own consumer reads."""
    requests, replies = outbox_topic_factory(), outbox_topic_factory()
    s = Service(
        "s",
        outbox_database_url,
        outbox_kafka_bootstrap,
        consumes=[requests, replies],
        replies={requests: replies},
    )
    writers = [Writer(s, requests, total=500, pause=0.02, reply_every=2, seed=3)]
    routes = {requests: ("s", "s"), replies: ("s", "s")}
    _run("one service sends and receives", [s], routes, writers, fault_results)
    with psycopg.connect(outbox_database_url) as conn:
        row = conn.execute("SELECT count(*) FROM s_sent WHERE topic = %s", (replies,)).fetchone()
    assert row is not None and row[0] > 100, "the handler sent too few replies"


def test_two_daemons_of_each_kind_with_one_of_each_killed(
    outbox_database_factory: Any,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: Any,
    fault_results: list[FaultResult],
) -> None:
    """Two producers sending, two consumers and two handlers receiving; mid-run one of each
    is SIGKILLed and restarted; the lanes are shared out again afterwards."""
    topic = outbox_topic_factory()
    sender = Service("p", outbox_database_factory(), outbox_kafka_bootstrap, producers=2)
    receiver = Service(
        "q",
        outbox_database_factory(),
        outbox_kafka_bootstrap,
        consumes=[topic],
        producers=0,
        consumers=2,
        handlers=2,
    )
    writer = Writer(sender, topic, total=1500, pause=0.01, keys=12, seed=4)
    slow_writer = Writer(sender, topic, total=150, pause=0.05, keys=4, seed=5)
    slow_writer.keys = [f"p-slow{i}" for i in range(4)]

    def kill_one_of_each(fleet: Fleet) -> None:
        for name in ("p.producer0", "q.consumer1", "q.handler0"):
            fleet.kill(name)
            fleet.supervise()
            time.sleep(0.5)
        assert {n for n, c in fleet.restarts.items() if c} == {
            "p.producer0",
            "q.consumer1",
            "q.handler0",
        }

    _run(
        "2 producers/consumers/handlers, one of each killed",
        [sender, receiver],
        {topic: ("p", "q")},
        [slow_writer, writer],
        fault_results,
        during=kill_one_of_each,
    )
