"""The relay loops over in-memory queues (and transport): no PostgreSQL, no broker.

The daemons reach their queue only through the ports of outbox/ports.py (the relay side), so
the loops themselves run here as they run over PostgreSQL: the Producer's (lanes, fetch,
publish, delete after the acknowledgement, failures recorded, the wait for a wake-up) and the
Handler's (dispatch to the workers, batch transactions, a failed callback rolled back and
retried behind its key).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from outbox import Handlers, InboxMessage
from outbox.core.databases import Database
from outbox.core.inbox_rows import ClaimedBatch, Pending
from outbox.core.retry import Backoff
from outbox.daemons import relay as relay_module
from outbox.daemons.handler import HandlerConfig, HandlerRunner
from outbox.daemons.producer import Producer, ProducerConfig
from outbox.ports import DeliveryFailure
from outbox.testing.memory import InMemoryTransport
from outbox.testing.stores import MemoryInbox, MemoryOutbox, MemoryTransaction
from outbox.testing.stores.consumer_queue import (
    MemoryHandlerSession,
    MemoryHandlerWork,
    MemoryInboxDatabase,
)

#: The database the relays serve: the in-memory stores ignore its URL.
MEMORY = Database("memory", "memory://", "outbox")


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
        poll_interval=0.05,
        rebalance_interval=0.05,
        batch_size=batch_size,
        backoff=Backoff(initial=0.05, maximum=0.05),
    )
    relay = Producer(config, transport.publisher, stores=queue.stores(), database=MEMORY)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(10)
        assert not thread.is_alive(), "the relay did not stop"


@contextmanager
def _handling(
    inbox: MemoryInbox, handlers: Handlers, config: HandlerConfig
) -> Iterator[HandlerRunner]:
    runner = HandlerRunner(config, handlers, stores=inbox.stores(), database=MEMORY)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(10)
        assert not thread.is_alive(), "the handler did not stop"


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
        queue.send("orders", payload, key=key)
        sent[key].append(payload)
    with _relaying(queue, transport, batch_size=50) as relay:
        _wait_for(lambda: not queue.rows and relay.relayed == 500, "the backlog to go")
        for n in range(500, 600):  # and rows that come while it waits: a wake-up each
            key = keys[n % len(keys)]
            payload = f"{n}".encode()
            queue.send("orders", payload, key=key)
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
    first = queue.send("flaky", b"1", key=b"k")
    queue.send("flaky", b"2", key=b"k")
    dead = queue.send("refused", b"x", key=b"other")

    def dead_ids() -> list[str]:
        return [row.record.message_id for row in queue.dead.values()]

    with _relaying(queue, transport) as relay:
        _wait_for(lambda: relay.failed >= 3 and dead_ids() == [str(dead)], "failed attempts")
        assert transport.records("flaky") == []
        retrying = queue.find(first)
        assert retrying is not None and retrying.record.attempts >= 1
        transport.fail_topic("flaky", None)
        _wait_for(lambda: not queue.rows, "the retried rows to go")
    assert [r.value for r in transport.records("flaky")] == [b"1", b"2"]  # still in order
    assert dead_ids() == [str(dead)]
    dead_row = queue.find(dead)
    assert dead_row is not None and dead_row.error == "too large"


def test_the_handler_loop_commits_each_callbacks_effects_with_its_row_once_in_order_per_key() -> (
    None
):
    inbox = MemoryInbox()
    handlers = Handlers()
    failed_once: set[bytes] = set()

    @handlers.handler("orders", backoff=Backoff(initial=0.01, maximum=0.01))
    def on_order(message: InboxMessage[object], tx: MemoryTransaction) -> None:
        tx.write((message.key, message.raw_payload))
        if message.raw_payload == b"7" and message.key not in failed_once:
            assert message.key is not None
            failed_once.add(message.key)
            raise RuntimeError("fails once: its effects and its batch's roll back")

    keys = [f"key-{k}".encode() for k in range(5)]
    sent: dict[bytes, list[bytes]] = {key: [] for key in keys}
    for n in range(300):
        key = keys[n % len(keys)]
        inbox.store("orders", b"%d" % n, key=key)
        sent[key].append(b"%d" % n)
    config = HandlerConfig(
        concurrency=2, batch_size=40, poll_interval=0.05, rebalance_interval=0.05
    )
    with _handling(inbox, handlers, config) as runner:
        _wait_for(lambda: runner.handled == 300, "every message handled")
    assert runner.failed == 1
    assert inbox.rows == {} and len(inbox.processed) == 300  # handled rows leave the queue
    effects: dict[bytes, list[bytes]] = {key: [] for key in keys}
    for effect in inbox.effects:
        assert isinstance(effect, tuple)
        effects[effect[0]].append(effect[1])
    assert effects == sent  # once each (the failed attempt's write rolled back), in key order


def test_each_handler_worker_claims_its_own_lanes_and_the_runner_reads_no_rows() -> None:
    """No row passes from the runner to a worker (decision 18): each worker fetches and claims
    the rows of its own lanes (lane % concurrency) in its transactions; the runner's own looks
    read a batch at most, and only to know which workers have rows."""
    inbox = MemoryInbox()
    handlers = Handlers()
    handled_by: dict[int, set[str]] = {}

    @handlers.handler("orders")
    def on_order(message: InboxMessage[object], tx: MemoryTransaction) -> None:
        tx.write(message.id)

    claims: list[tuple[str, list[int], int]] = []
    looks: list[int] = []
    work_claim = MemoryHandlerWork.claim_next
    inbox_fetch = inbox.fetch

    def claim_next(
        self: MemoryHandlerWork, tx: MemoryTransaction, lanes: list[int], limit: int, u: list[str]
    ) -> ClaimedBatch:
        batch = work_claim(self, tx, lanes, limit, u)
        claims.append((threading.current_thread().name, lanes, limit))
        for row in batch.rows:
            handled_by.setdefault(row.lane, set()).add(threading.current_thread().name)
        return batch

    def fetch(lanes: list[int], limit: int, unordered: list[str]) -> list[Pending]:
        if not threading.current_thread().name.startswith("outbox-handler-"):
            looks.append(limit)  # the runner's control session
        return inbox_fetch(lanes, limit, unordered)

    MemoryHandlerWork.claim_next = claim_next  # type: ignore[method-assign,assignment]
    inbox.fetch = fetch  # type: ignore[method-assign]
    try:
        for n in range(400):
            inbox.store("orders", b"%d" % n, key=f"key-{n % 37}".encode())
        config = HandlerConfig(concurrency=3, batch_size=30, poll_interval=0.05)
        with _handling(inbox, handlers, config) as runner:
            _wait_for(lambda: runner.handled == 400, "every message handled")
    finally:
        MemoryHandlerWork.claim_next = work_claim  # type: ignore[method-assign]
    assert len(inbox.effects) == 400
    assert claims, "the workers claimed nothing themselves"
    for name, lanes, _limit in claims:
        index = int(name.rsplit("-", 1)[1])
        assert all(lane % 3 == index for lane in lanes), (name, lanes)
    assert all(len(names) == 1 for names in handled_by.values()), handled_by
    assert looks and max(looks) <= 30, looks


def test_a_handler_worker_whose_lanes_have_no_rows_opens_no_session() -> None:
    """Rows of one key are in one lane: of four workers, only that lane's opens a database
    session; the others are never given a round (connections per database stay what the
    rows need, not --concurrency)."""
    inbox = MemoryInbox()
    handlers = Handlers()

    @handlers.handler("orders")
    def on_order(message: InboxMessage[object], tx: MemoryTransaction) -> None:
        tx.write(message.id)

    opened: list[str] = []
    open_session = MemoryInboxDatabase.open_session

    def counted(self: MemoryInboxDatabase, library: str) -> MemoryHandlerSession:
        opened.append(threading.current_thread().name)
        return open_session(self, library)

    MemoryInboxDatabase.open_session = counted  # type: ignore[method-assign]
    try:
        config = HandlerConfig(concurrency=4, batch_size=10, poll_interval=0.05)
        with _handling(inbox, handlers, config) as runner:
            for wave in range(3):  # a backlog, then rows that wake it
                for n in range(50):
                    inbox.store("orders", b"%d" % n, key=b"the-one-key")
                _wait_for(lambda: runner.handled == 50 * (wave + 1), "the wave handled")  # noqa: B023
    finally:
        MemoryInboxDatabase.open_session = open_session  # type: ignore[method-assign]
    assert len(inbox.effects) == 150
    assert len(opened) == 1, opened


def test_more_handler_workers_than_lanes_handle_everything_in_order() -> None:
    """--concurrency above the 64 lanes: the workers without a lane get no round, the others
    share the round's limit, and every message is handled once, in order per key."""
    inbox = MemoryInbox()
    handlers = Handlers()

    @handlers.handler("orders")
    def on_order(message: InboxMessage[object], tx: MemoryTransaction) -> None:
        tx.write((message.key, message.raw_payload))

    keys = [f"key-{k}".encode() for k in range(50)]
    sent: dict[bytes, list[bytes]] = {key: [] for key in keys}
    for n in range(600):
        key = keys[n % len(keys)]
        inbox.store("orders", b"%d" % n, key=key)
        sent[key].append(b"%d" % n)
    config = HandlerConfig(concurrency=100, batch_size=20, poll_interval=0.05)
    with _handling(inbox, handlers, config) as runner:
        _wait_for(lambda: runner.handled == 600, "every message handled")
    effects: dict[bytes, list[bytes]] = {key: [] for key in keys}
    for effect in inbox.effects:
        assert isinstance(effect, tuple)
        effects[effect[0]].append(effect[1])
    assert effects == sent


def test_a_callback_past_its_lease_is_ended_and_its_message_handled_once_more() -> None:
    """The runner's lease over a MemoryInbox: the hung callback's transaction is terminated
    (its write never commits), the attempt is recorded, and the retry handles the message."""
    inbox = MemoryInbox()
    handlers = Handlers()
    release = threading.Event()
    calls: list[bytes] = []

    @handlers.handler("orders", backoff=Backoff(initial=0.01, maximum=0.01))
    def on_order(message: InboxMessage[object], tx: MemoryTransaction) -> None:
        calls.append(message.raw_payload)
        tx.write(message.raw_payload)
        if len(calls) == 1:
            release.wait(10)  # hangs past its lease the first time

    inbox.store("orders", b"slow", key=b"k")
    inbox.store("orders", b"next", key=b"k")
    config = HandlerConfig(lease=0.3, poll_interval=0.05, rebalance_interval=0.05)
    with _handling(inbox, handlers, config) as runner:
        _wait_for(lambda: runner.lease_expired == 1, "the lease to expire")
        _wait_for(lambda: len(inbox.effects) == 2, "both messages handled")
        release.set()
    assert inbox.effects == [b"slow", b"next"]  # the hung attempt's write never committed
    assert [p.attempts for p in inbox.processed.values()] == [2, 1]
    assert inbox.rows == {}


def test_async_callbacks_run_over_a_memory_inbox_each_in_its_own_transaction() -> None:
    inbox = MemoryInbox()
    handlers = Handlers()
    failed: list[bytes] = []

    @handlers.handler("orders", backoff=Backoff(initial=0.01, maximum=0.01))
    async def on_order(message: InboxMessage[object], tx: MemoryTransaction) -> None:
        tx.write((message.key, message.raw_payload))
        if message.raw_payload == b"3" and not failed:
            failed.append(message.raw_payload)
            raise RuntimeError("fails once: its write rolls back")

    for n in range(6):
        inbox.store("orders", b"%d" % n, key=b"k")
    config = HandlerConfig(poll_interval=0.05, rebalance_interval=0.05)
    with _handling(inbox, handlers, config) as runner:
        _wait_for(lambda: runner.handled == 6, "every message handled")
    assert inbox.effects == [(b"k", b"%d" % n) for n in range(6)]
    assert runner.failed == 1


def test_a_parked_relay_looks_less_and_less_often_while_its_database_stays_quiet() -> None:
    """Parked (idle past idle_disconnect), a relay looks for rows on a connection of its own,
    at intervals growing from poll_interval to PARKED_SLOWDOWN times it; a row still goes."""
    queue = MemoryOutbox()
    transport = InMemoryTransport()
    poll = 0.02  # so at most 0.2 s between looks, 0.24 with the jitter
    config = ProducerConfig(
        poll_interval=poll, rebalance_interval=0.05, backoff=Backoff(initial=0.05, maximum=0.05)
    )
    relay = Producer(config, transport.publisher, stores=queue.stores(), database=MEMORY)
    relay.idle_disconnect = 0.05
    connects: list[float] = []
    connect = relay.connect

    def counted() -> Any:
        connects.append(time.monotonic())
        return connect()

    relay.connect = counted  # type: ignore[method-assign]
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: relay.parked, "the relay to park")
        parked_at = time.monotonic()
        time.sleep(3.0)
        looks = [t for t in connects if t > parked_at]
        # At poll_interval each: about 150 looks in 3 s; growing to 0.2 s: about 20.
        assert 8 <= len(looks) <= 30, len(looks)
        gaps = [b - a for a, b in itertools.pairwise(looks)]
        cap = poll * relay_module.PARKED_SLOWDOWN * (1 + relay_module.PARKED_JITTER)
        assert max(gaps) <= cap + 0.2, gaps  # the slack: a loaded machine's sleeps
        queue.send("orders", b"late", key=b"k")
        sent_at = time.monotonic()
        _wait_for(lambda: relay.relayed == 1, "the row sent while parked")
        assert time.monotonic() - sent_at < 2.0
    finally:
        relay.stop()
        thread.join(10)
    assert [r.value for r in transport.records("orders")] == [b"late"]


def test_an_idle_relay_gives_its_connection_to_a_waiting_database_and_says_why(
    caplog: Any,
) -> None:
    """Under a budget and without --idle-disconnect, an idle relay parks when another
    database waits for its connection, and its debug line says so (it said "idle for %.0fs"
    of the unset --idle-disconnect: a logging error)."""
    from outbox.daemons.budget import Budget

    queue = MemoryOutbox()
    transport = InMemoryTransport()
    config = ProducerConfig(
        poll_interval=0.05, rebalance_interval=0.05, backoff=Backoff(initial=0.05, maximum=0.05)
    )
    relay = Producer(config, transport.publisher, stores=queue.stores(), database=MEMORY)
    budget = Budget(1)
    relay.budget, relay.holding = budget, budget.holding("memory", "producer")
    other = budget.holding("other", "producer")
    caplog.set_level("DEBUG", logger="outbox.relay")
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: budget.holders() == {"memory": 1}, "the relay to connect")
        assert budget.acquire(other)  # waits until the idle relay gives its connection back
        _wait_for(lambda: relay.parked, "the relay to park")
        assert budget.holders() == {"other": 1}
        budget.release(other)
        queue.send("orders", b"after", key=b"k")
        _wait_for(lambda: relay.relayed == 1, "the row sent after it parked")
    finally:
        relay.stop()
        thread.join(10)
    lines = [r.getMessage() for r in caplog.records if r.name == "outbox.relay"]
    assert "producer gives its connection to a waiting database: parked" in lines, lines
