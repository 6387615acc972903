"""The Producer's relay loop over an in-memory queue and transport: no PostgreSQL, no broker.

The daemons reach their queue only through the ports of outbox/ports.py (the relay side), so
the loop itself (lanes, fetch, publish, delete after the acknowledgement, failures recorded,
the wait for a wake-up) runs here as it runs over PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from outbox.core.retry import Backoff
from outbox.daemons.producer import Producer, ProducerConfig
from outbox.ports import DeliveryFailure
from outbox.testing.memory import InMemoryTransport

from .memory_relay import MemoryOutbox


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@contextmanager
def _relaying(
    queue: MemoryOutbox, transport: InMemoryTransport, batch_size: int = 1000
) -> Iterator[Producer]:
    config = ProducerConfig(
        "memory://",
        poll_interval=0.05,
        rebalance_interval=0.05,
        batch_size=batch_size,
        backoff=Backoff(initial=0.05, maximum=0.05),
    )
    relay = Producer(config, transport.publisher, stores=queue.stores())
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(10)
        assert not thread.is_alive(), "the relay did not stop"


def test_the_relay_loop_publishes_each_keys_rows_in_order_and_deletes_them_once_acknowledged() -> (
    None
):
    queue = MemoryOutbox()
    transport = InMemoryTransport(default_partitions=3)
    keys = [f"key-{k}".encode() for k in range(20)]
    sent: dict[bytes, list[bytes]] = {key: [] for key in keys}
    for n in range(500):  # a backlog, before the relay starts
        key = keys[n % len(keys)]
        payload = f"{n}".encode()
        queue.send("orders", key, payload)
        sent[key].append(payload)
    with _relaying(queue, transport, batch_size=50) as relay:
        _wait_for(lambda: not queue.rows and relay.relayed == 500, "the backlog to go")
        for n in range(500, 600):  # and rows that come while it waits: a wake-up each
            key = keys[n % len(keys)]
            payload = f"{n}".encode()
            queue.send("orders", key, payload)
            sent[key].append(payload)
        _wait_for(lambda: not queue.rows and relay.relayed == 600, "the new rows to go")
    records = transport.records("orders")
    assert len(records) == 600  # each once: deleted after its acknowledgement, never sent again
    published: dict[bytes, list[bytes]] = {key: [] for key in keys}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key is not None
        published[record.key].append(record.value)
    assert published == sent  # in order per key
    assert relay.failed == 0 and queue.dead == {}


def test_a_failed_delivery_is_retried_holding_its_key_and_a_permanent_one_is_dead() -> None:
    queue = MemoryOutbox()
    transport = InMemoryTransport()
    transport.fail_topic("flaky", DeliveryFailure("broker says later"))
    transport.fail_topic("refused", DeliveryFailure("too large", permanent=True))
    first = queue.send("flaky", b"k", b"1")
    queue.send("flaky", b"k", b"2")
    dead = queue.send("refused", b"other", b"x")
    with _relaying(queue, transport) as relay:
        _wait_for(lambda: relay.failed >= 3 and dead in queue.dead, "failed attempts")
        assert transport.records("flaky") == []
        assert queue.rows[first].record.attempts >= 1
        transport.fail_topic("flaky", None)
        _wait_for(lambda: not queue.rows, "the retried rows to go")
    assert [r.value for r in transport.records("flaky")] == [b"1", b"2"]  # still in order
    assert list(queue.dead) == [dead]
    assert queue.dead[dead].error == "too large"
