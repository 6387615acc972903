"""The bare loops each scenario is measured against, in the same run: what the simplest code
doing the same work costs on this machine at that moment.

- send (a): one plain INSERT into a bare table, and the naive INSERT + NOTIFY (`send_overhead`);
- relay (b): select 1,000 rows of `producer_queue` in id order, produce them (idempotent
  producer, outbox's producer settings), flush, delete them, commit; until the queue is empty;
- inbox (c): a plain consumer polls up to 1,000 records, INSERTs them into a bare table in one
  statement, commits, commits its offsets;
- handler (d): select 500 rows of `consumer_queue` in id order, one INSERT per message (the
  callback's effect; one executemany for the `batch_handler` variant), delete them, commit;
- latency (e): a producer to a plain consumer with the variant's settings (`latency.broker_floor`).

A result row shows its `figure`, the `floor` and the `ratio` (`ratio` says how much of the floor
the figure reaches: figure / floor for rates, floor / figure for latencies; 1 is as good as the
bare loop).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

#: Rows a bare relay loop selects, produces and deletes per transaction.
RELAY_BATCH = 1000
#: Rows a bare handler loop selects, handles and deletes per transaction.
HANDLER_BATCH = 500
#: Records a bare consumer loop polls and inserts per transaction.
INBOX_BATCH = 1000


def against_floor(
    metrics: dict[str, float], figure: float, floor: float, *, lower_is_better: bool = False
) -> dict[str, float]:
    """`metrics` with `figure`, `floor` and `ratio` added (in that order, last)."""
    if floor != floor or figure != figure or not floor or not figure:  # NaN or zero
        ratio = float("nan")
    else:
        ratio = floor / figure if lower_is_better else figure / floor
    return {**metrics, "figure": figure, "floor": floor, "ratio": ratio}


def relay_floor(url: str, bootstrap: str, topic: str) -> float:
    """Drain `producer_queue` with the bare loop; returns its msg/s from the first delete
    (the first batch done) to empty, as the relay's figure is measured."""
    from confluent_kafka import Producer

    from outbox.kafka.publisher import producer_config

    producer = Producer(producer_config(bootstrap))
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    producer.list_topics(topic, timeout=10)  # metadata and producer id before the clock
    done = first = 0
    first_at = 0.0
    with psycopg.connect(url) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(
                    "SELECT id, key, payload FROM outbox.producer_queue ORDER BY id LIMIT %s",
                    (RELAY_BATCH,),
                ).fetchall()
                if not rows:
                    break
                for _, key, payload in rows:
                    while True:
                        try:
                            producer.produce(topic, payload, key=key, on_delivery=report)
                            break
                        except BufferError:
                            producer.poll(0.01)
                if producer.flush(60) or failed:
                    raise RuntimeError(f"bare relay loop: delivery failed: {failed[:1]}")
                conn.execute(
                    "DELETE FROM outbox.producer_queue WHERE id = ANY(%s)",
                    ([row[0] for row in rows],),
                )
            if not done:
                first, first_at = len(rows), time.perf_counter()
            done += len(rows)
        seconds = time.perf_counter() - first_at
    return (done - first) / seconds if done > first else float("nan")


def inbox_floor(url: str, bootstrap: str, topic: str, messages: int) -> tuple[float, float]:
    """Store `messages` records of `topic` with the bare consumer loop; returns (msg/s from the
    first stored batch to the last, seconds until the first)."""
    from confluent_kafka import Consumer

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bare_inbox (id bigserial PRIMARY KEY, key bytea, payload bytea NOT NULL,"
            " source_partition int NOT NULL, source_offset bigint NOT NULL)"
        )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-floor-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    consumer.subscribe([topic])
    stored = 0
    first_at = first_rows = 0.0
    started = time.perf_counter()
    deadline = started + 120 + messages / 200
    try:
        with psycopg.connect(url) as conn:
            while stored < messages:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"bare consumer loop stored {stored} of {messages}")
                records = [r for r in consumer.consume(INBOX_BATCH, 0.5) if r.error() is None]
                if not records:
                    continue
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO bare_inbox (key, payload, source_partition, source_offset) "
                        "SELECT * FROM unnest(%s::bytea[], %s::bytea[], %s::int[], %s::bigint[])",
                        (
                            [r.key() for r in records],
                            [r.value() for r in records],
                            [r.partition() for r in records],
                            [r.offset() for r in records],
                        ),
                    )
                consumer.commit(asynchronous=True)
                if not stored:
                    first_at, first_rows = time.perf_counter(), len(records)
                stored += len(records)
            ended = time.perf_counter()
    finally:
        consumer.close()
    steady = ended - first_at
    rate = (stored - first_rows) / steady if steady > 0 else float("nan")
    return rate, first_at - started


def handler_floor(url: str, *, batch: bool = False) -> float:
    """Handle every row of `consumer_queue` with the bare loop (one INSERT into `effects` per
    message, or one executemany per transaction with `batch`); returns its msg/s from the first
    committed transaction to the last, as the handler's figure is measured."""
    done = first = 0
    first_at = 0.0
    effect = "INSERT INTO effects (message_id) VALUES (%s)"
    with psycopg.connect(url) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(
                    "SELECT id, message_id FROM outbox.consumer_queue ORDER BY id LIMIT %s",
                    (HANDLER_BATCH,),
                ).fetchall()
                if not rows:
                    break
                if batch:
                    with conn.cursor() as cur:
                        cur.executemany(effect, [(row[1],) for row in rows])
                else:
                    for row in rows:
                        conn.execute(effect, (row[1],))
                conn.execute(
                    "DELETE FROM outbox.consumer_queue WHERE id = ANY(%s)",
                    ([row[0] for row in rows],),
                )
            if not done:
                first, first_at = len(rows), time.perf_counter()
            done += len(rows)
        seconds = time.perf_counter() - first_at
    return (done - first) / seconds if done > first else float("nan")
