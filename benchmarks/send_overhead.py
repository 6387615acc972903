"""(a) What broker.send costs a business transaction, beside the floor and the naive design.

Each variant runs the same business transaction (insert one order row) from N writer processes
for a fixed time: alone; plus one more plain INSERT into a bare table (the floor any outbox
pays); plus `broker.send` (with no relay, and with the Producer relay running and draining to
Kafka); plus the naive design (insert into a queue table and NOTIFY in the same transaction).
A full run measures each writer count in three interleaved rounds and shows the median round
(the shares of the floor are taken within a round, so a VM whose load drifts during the
scenario weighs on every variant alike). Each row shows its median commits/s as `figure`, the
floor's median as `floor` and the median of its in-round ratios to the floor as `ratio`; a
quick run (`--quick`) measures 16 writers only.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks.harness import Context, Result, percentiles

WRITERS = (1, 4, 16)
#: A quick run's writer counts: the issue's measure.
QUICK_WRITERS = (16,)
#: Rounds per writer count in a full run (each runs every variant once).
ROUNDS = 3
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
    # Interleaved rounds, each running every variant once (in a rotated order), so that a VM
    # that gets busier or quieter during the scenario weighs on every variant alike: each
    # variant's share of the floor is taken within its round, and the median round is shown.
    rounds = 1 if ctx.smoke else ROUNDS
    seconds = 0.75 if ctx.smoke else 2.0 if ctx.quick else 3.0
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
    # A smoke run checks that the code runs: one writer count, the quick run's.
    for writers in QUICK_WRITERS if ctx.quick or ctx.smoke else WRITERS:
        rates: dict[str, list[float]] = {label: [] for label, _, _ in variants}
        shares: dict[str, list[float]] = {label: [] for label, _, _ in variants}
        samples: dict[str, list[float]] = {label: [] for label, _, _ in variants}
        for round_ in range(rounds):
            shift = round_ % len(variants)
            measured: dict[str, float] = {}
            for label, variant, with_relay in variants[shift:] + variants[:shift]:
                rate, latencies = _measure(ctx, url, variant, writers, seconds, with_relay)
                measured[label] = rate
                rates[label].append(rate)
                samples[label] += latencies
            floor_rate = measured["+ plain INSERT (floor)"]
            for label, rate in measured.items():
                shares[label].append(rate / floor_rate)
        floor_median = statistics.median(rates["+ plain INSERT (floor)"])
        for label, variant, _ in variants:
            p = percentiles(samples[label])
            metrics = {
                "writers": writers,
                "commits/s": statistics.median(rates[label]),
                "p50 ms": p["p50"],
                "p99 ms": p["p99"],
            }
            if variant != "business only":
                if rounds > 1:
                    metrics["min ratio"] = min(shares[label])
                    metrics["max ratio"] = max(shares[label])
                metrics["figure"] = metrics["commits/s"]
                metrics["floor"] = floor_median
                metrics["ratio"] = statistics.median(shares[label])
            results.append(
                Result(
                    "a. send overhead",
                    label,
                    metrics,
                    notes=f"median of {rounds} interleaved rounds of {seconds:g} s"
                    if rounds > 1
                    else "",
                    samples=samples[label],
                )
            )
    return results


def _measure(
    ctx: Context, url: str, variant: str, writers: int, seconds: float, with_relay: bool
) -> tuple[float, list[float]]:
    """One run of one variant (with the Producer relaying to Kafka meanwhile if `with_relay`),
    then the tables emptied for the next."""
    from outbox import transports
    from outbox.runtime import App, Databases, Settings

    relay = None
    thread = None
    if with_relay:
        where = transports.settings_of("kafka", kafka_bootstrap=ctx.bootstrap)
        relay = App(Settings(databases=Databases.of(url), transport=where)).producer()
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
    return rate, latencies
