"""(a) What broker.send costs a business transaction, beside the floor and the naive design.

Each variant runs the same business transaction (insert one order row) from N writer processes
for a fixed time: alone; plus one more plain INSERT into a bare table (the floor any outbox
pays); plus `broker.send` (with no relay, and with the Producer relay running and draining to
Kafka); plus the naive design (insert into a queue table and NOTIFY in the same transaction).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks.harness import Context, Result, percentiles

WRITERS = (1, 4, 16)
PAYLOAD = {"order_id": 0, "note": "x" * 60}

SETUP = """
CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL);
CREATE TABLE bare (id bigserial PRIMARY KEY, payload bytea NOT NULL);
CREATE TABLE naive_queue (
    id bigserial PRIMARY KEY, topic text NOT NULL, key text, payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""


def _body(variant: str) -> Callable[[psycopg.Connection[Any], int], None]:
    from outbox import Broker

    broker = Broker()

    def business(conn: psycopg.Connection[Any], i: int) -> None:
        conn.execute("INSERT INTO orders (customer, total) VALUES (%s, %s)", ("c", i))

    def floor(conn: psycopg.Connection[Any], i: int) -> None:
        business(conn, i)
        conn.execute("INSERT INTO bare (payload) VALUES (%s)", (b"x" * 80,))

    def send(conn: psycopg.Connection[Any], i: int) -> None:
        business(conn, i)
        broker.send(conn, "bench.orders", PAYLOAD, key=f"order-{i}")

    def naive(conn: psycopg.Connection[Any], i: int) -> None:
        business(conn, i)
        conn.execute(
            "INSERT INTO naive_queue (topic, key, payload) VALUES (%s, %s, %s)",
            ("bench.orders", f"order-{i}", b"x" * 80),
        )
        conn.execute("NOTIFY naive_queue")

    return {"business only": business, "floor": floor, "send": send, "naive": naive}[variant]


def _writer(url: str, variant: str, seconds: float, start_at: float, out: Any) -> None:
    body = _body(variant)
    latencies: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        i = 0
        while True:
            t0 = time.perf_counter()
            if time.time() >= end:
                break
            with conn.transaction():
                body(conn, i)
            latencies.append((time.perf_counter() - t0) * 1000)
            i += 1
    out.put(latencies)


def _run_variant(url: str, variant: str, writers: int, seconds: float) -> tuple[float, list[float]]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    start_at = time.time() + 0.5 + 0.05 * writers
    procs = [
        ctx.Process(target=_writer, args=(url, variant, seconds, start_at, queue))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    latencies: list[float] = []
    for _ in procs:
        latencies += queue.get(timeout=seconds + 60)
    for p in procs:
        p.join(30)
    return len(latencies) / seconds, latencies


def run(ctx: Context) -> list[Result]:
    from outbox.daemons.producer import ProducerConfig
    from outbox.transports import kafka_producer

    seconds = 1.5 if ctx.smoke else 5.0
    url = ctx.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
    results: list[Result] = []
    variants = [
        ("business only", "business only", False),
        ("+ plain INSERT (floor)", "floor", False),
        ("+ broker.send", "send", False),
        ("+ broker.send, relay running", "send", True),
        ("+ queue INSERT + NOTIFY (naive)", "naive", False),
    ]
    for writers in WRITERS:
        floor_rate = 0.0
        for label, variant, with_relay in variants:
            relay = None
            thread = None
            if with_relay:
                import threading

                relay = kafka_producer(
                    ProducerConfig(database_url=url, kafka_bootstrap=ctx.bootstrap)
                )
                thread = threading.Thread(target=relay.run, daemon=True)
                thread.start()
                time.sleep(1.0)
            try:
                rate, latencies = _run_variant(url, variant, writers, seconds)
            finally:
                if relay is not None and thread is not None:
                    relay.stop()
                    thread.join(60)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE orders, bare, naive_queue, outbox.producer_queue")
                conn.execute("VACUUM ANALYZE")
            if variant == "floor":
                floor_rate = rate
            p = percentiles(latencies)
            metrics = {
                "writers": writers,
                "commits/s": rate,
                "p50 ms": p["p50"],
                "p99 ms": p["p99"],
            }
            if floor_rate and variant != "business only":
                metrics["% of floor"] = 100 * rate / floor_rate
            results.append(Result("a. send overhead", label, metrics, samples=latencies))
    return results
