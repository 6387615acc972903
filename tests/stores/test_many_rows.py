"""Order over many rows (10,000): what the relay and the handler read, batch after batch, is in
id order within each batch and in sending order per key, each row once."""

from __future__ import annotations

import uuid
from collections import defaultdict

from outbox.core.batches import InboxBatch
from outbox.core.envelope import compose
from outbox.core.lanes import LANES, lane_for
from outbox.core.serializers import JsonSerializer
from outbox.postgres.writer import Writer
from outbox.testing.stores import MemoryOutbox

from .conftest import Memory, Postgres, StoresUnderTest, inbox_row

ROWS = 10_000
KEYS = [f"key-{k}".encode() for k in range(97)] + [None]


def _send_all(stores: StoresUnderTest) -> None:
    """10,000 messages in one statement, as `send_many` writes them."""
    messages = [
        compose(
            "orders",
            str(n).encode(),
            key=KEYS[n % len(KEYS)],
            headers=None,
            message_id=None,
            serializer=JsonSerializer(),
            max_message_bytes=1_000_000,
        )
        for n in range(ROWS)
    ]
    if isinstance(stores, Memory):
        assert isinstance(stores.queue, MemoryOutbox)
        stores.queue.write(messages)
        return
    assert isinstance(stores, Postgres)
    import psycopg

    with psycopg.connect(stores.url) as conn, conn.transaction():
        Writer(stores.schema).write(conn, messages)


def test_the_relay_reads_10000_rows_in_order_fetching_ahead(stores: StoresUnderTest) -> None:
    _send_all(stores)
    lanes = list(range(0, LANES, 2))  # half the lanes: one relay's share
    seen: dict[bytes | None, list[int]] = defaultdict(list)
    count = 0
    with stores.outbox().connect() as session:
        in_flight: list[int] = []
        while True:
            batch = session.fetch(lanes, 700, in_flight).fetchall()
            assert [r.id for r in batch] == sorted(r.id for r in batch)
            assert not set(in_flight) & {r.id for r in batch}
            session.delete(in_flight)  # the last batch was acknowledged meanwhile
            if not batch:
                break
            for record in batch:
                seen[record.key].append(int(record.payload))
                assert lane_for(record.key, uuid.UUID(record.message_id)) in lanes
            count += len(batch)
            in_flight = [r.id for r in batch]
        rest = session.fetch(list(range(LANES)), ROWS, []).fetchall()
    assert count + len(rest) == ROWS
    assert all(lane_for(r.key, uuid.UUID(r.message_id)) not in lanes for r in rest)
    for key, numbers in seen.items():
        assert numbers == sorted(numbers), key
        if key is not None:
            assert numbers == list(range(KEYS.index(key), ROWS, len(KEYS)))


def test_the_handler_claims_10000_rows_in_order_each_once(stores: StoresUnderTest) -> None:
    rows = [inbox_row("orders", str(n).encode(), key=KEYS[n % len(KEYS)]) for n in range(ROWS)]
    writer = stores.inbox_writer().connect()
    try:
        for start in range(0, ROWS, 2_000):
            part = rows[start : start + 2_000]
            assert writer.insert(InboxBatch.of(part)) == {"orders": len(part)}
    finally:
        writer.close()
    database = stores.inbox()
    seen: dict[bytes | None, list[int]] = defaultdict(list)
    taken = 0
    session = database.open_session("psycopg")
    try:
        while True:
            with session.transaction() as (tx, _):
                batch = database.work.claim_next(tx, list(range(LANES)), 500, [])
                database.work.done_many(tx, [row.id for row in batch.rows])
            assert [row.id for row in batch.rows] == sorted(row.id for row in batch.rows)
            for row in batch.rows:
                seen[row.key].append(int(batch.claimed[row.id].payload))
            taken += len(batch.rows)
            if batch.taken < 500:
                break
    finally:
        session.close()
    assert taken == ROWS
    assert len(stores.processed()) == ROWS
    for key, numbers in seen.items():
        assert numbers == sorted(numbers), key
