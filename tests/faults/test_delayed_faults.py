"""Messages due later under faults (decision 21), on both transports: the relay SIGKILLed after
producing a batch (before deleting it) and right after moving messages that fell due into
producer_queue, and PostgreSQL restarted while messages fall due. Every message is handled
exactly once, none is lost, and none is handled before its due time (the database's clock)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from outbox import Broker, Message
from outbox.testing.servers import Servers

from ..integration.relay_helpers import RelayTransport, count
from ..integration.test_delayed_delivery import _arrivals
from .conftest import FaultResult
from .test_faults import Pipeline, _account, _handled, two_services

pytestmark = pytest.mark.faults

__all__ = ["two_services"]  # the fixture, used by the tests below

SCHEDULED, NOW = 150, 50

FAULTS = {
    "sigkill-after-produce": {"producer": "producer.after_produce@6"},
    "sigkill-after-promote": {"producer": "producer.after_promote@2"},
    "postgres-restart": {},
}


def _send(url: str, topic: str) -> tuple[list[Any], dict[Any, datetime]]:
    """SCHEDULED messages due over 4 to 7 s from now (the daemons are up by then: one that
    relayed early would be seen) and NOW due at once, over 11 keys; their ids and the due time
    of the scheduled ones."""
    messages = [
        Message(
            topic,
            {"n": i},
            key=f"key-{i % 11}",
            delay=timedelta(seconds=4 + (i % 30) / 10),
        )
        for i in range(SCHEDULED)
    ] + [Message(topic, {"n": SCHEDULED + i}, key=f"key-{i % 11}") for i in range(NOW)]
    with psycopg.connect(url) as conn:
        with conn.transaction():
            ids = Broker().send_many(conn, messages)
        due = dict(conn.execute("SELECT message_id, deliver_at FROM outbox.producer_scheduled"))
    assert len(due) == SCHEDULED
    return ids, due


@pytest.mark.parametrize("fault", list(FAULTS))
def test_delayed_messages_survive_the_fault_and_none_leaves_early(
    fault: str,
    outbox_servers: Servers,
    two_services: tuple[str, str],
    relay_transport: RelayTransport,
    fault_results: list[FaultResult],
) -> None:
    postgres = outbox_servers.postgres
    restart = fault == "postgres-restart"
    if restart and (not hasattr(postgres, "restart") or postgres.source != "local"):
        pytest.skip("needs a PostgreSQL server the harness started")
    sender, receiver = two_services
    topic = relay_transport.topic()
    started = time.monotonic()
    ids, due = _send(sender, topic)
    pipeline = Pipeline(
        sender,
        receiver,
        relay_transport.endpoint,
        topic,
        failpoints=FAULTS[fault],
        producer_args=("--batch-size", "20"),
    )
    pipeline.start()
    try:
        if restart:
            pipeline.wait(lambda: _handled(receiver) >= NOW, 60, "the messages due now handled")
            assert count(sender, "producer_scheduled") > 0, "restart while messages wait"
            postgres.restart(downtime=2.0)  # type: ignore[attr-defined]
        pipeline.wait(lambda: _handled(receiver) == len(ids), 180, "every message handled")
    finally:
        pipeline.stop()
    for daemon in FAULTS[fault]:
        assert pipeline.killed[daemon] == 1, f"the failpoint of {fault} never fired"
    _account(
        f"delayed: {fault} ({relay_transport.name})", sender, receiver, ids, fault_results, started
    )
    assert count(sender, "producer_scheduled") == 0
    # When the transport took each record (Kafka's create time, the log's append time): the
    # relay's own act, not the consumer's and the handler's later ones.
    arrived = _arrivals(relay_transport, topic, len(ids))
    lateness = sorted((arrived[str(m)] - at).total_seconds() for m, at in due.items())
    print(f"delayed {fault}: lateness min {lateness[0]:.3f} s, max {lateness[-1]:.3f} s")
    early = {m: (arrived[str(m)], at) for m, at in due.items() if arrived[str(m)] < at}
    assert not early, f"relayed before their due time: {early}"
