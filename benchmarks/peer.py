"""(g) A peer side by side: faststream-outbox, on the same servers and in the same run.

faststream-outbox (PyPI) is a FastStream broker whose queue is a Postgres table: the caller
writes a row with `await broker.publish(body, queue=..., session=...)` in its own SQLAlchemy
asyncio transaction, and a relay is a subscriber on that queue stacked under a FastStream Kafka
publisher; it claims rows with `FOR UPDATE SKIP LOCKED` under a lease, publishes each one,
awaits its delivery report, then deletes the row. It has no inbox.

Where it has an equivalent of outbox's scenarios, each is measured for both, with the same
client stack, payloads and broker:

* (a) send overhead: the business transaction of scenario (a) (insert one order row) alone,
  plus outbox's `send_async`, plus the peer's `publish`, from 1, 4 and 16 writer processes,
  all through SQLAlchemy `AsyncConnection` on the psycopg driver (the peer is asyncio and
  SQLAlchemy only, so this is the stack both support), without a relay running.
* (b) relay throughput on a backlog committed in one transaction: outbox's `outbox producer`
  process, and the peer's relay process (`benchmarks.peer_app`, asyncpg driver so that it
  LISTENs) with the package's defaults and with a tuned configuration.
* (e) end-to-end latency at 100/s from the sender's commit to receipt by a plain
  confluent-kafka consumer reading the topic (not outbox's consumer and handler: the peer has
  no inbox, so scenario (e)'s end point does not exist for it).

Every row of (a), (b) and (e) shows its `figure` beside a `floor` measured in the same run, the
floors of scenarios (a), (b) and (e) (`benchmarks/floors.py`): for (a) the business transaction
plus one plain INSERT into a bare table through the same SQLAlchemy stack and writer count; for
(b) the bare relay loop (select 1,000 in id order, produce, flush, delete) over a backlog of as
many messages of the same size, timed from its start as the relays here are; for (e) a producer
that sends each record at once (`linger.ms=0`, as a relay that flushes or awaits each delivery
does) -> the same plain consumer at the same rate (`latency.broker_floor`).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from benchmarks.floors import against_floor, relay_floor
from benchmarks.harness import Context, Result, percentiles
from benchmarks.latency import (
    Daemon,
    Reader,
    Variant,
    broker_floor,
    latency_result,
    outbox_daemon,
)
from benchmarks.send_overhead import PAYLOAD, SETUP, WRITERS

SCENARIO = "g. peer: faststream-outbox"
PEER = "faststream-outbox"
TABLE = "fs_outbox"
QUEUE = "orders"
#: The peer's relay settings: its defaults, and one tuned for throughput.
RELAYS = {
    "defaults": [],
    "tuned": [
        "--max-workers=8",
        "--fetch-batch-size=200",
        "--terminal-flush-batch-size=50",
        "--quiet",
    ],
}
RELAY_NOTES = {
    "defaults": "package defaults: 1 worker, fetch batch 10, one DELETE per row, FastStream's "
    "INFO log lines per message (to a file)",
    "tuned": "8 workers, fetch batch 200, DELETE batches of 50, no per-message log",
}
E2E_RATE = 100


def _driver_url(url: str, driver: str) -> str:
    from sqlalchemy.engine import make_url

    return (
        make_url(url).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)
    )


def _peer_table() -> Any:
    from faststream_outbox import make_outbox_table
    from sqlalchemy import MetaData

    return make_outbox_table(MetaData(), table_name=TABLE)


def _unavailable(reason: str) -> list[Result]:
    return [Result(SCENARIO, "not measured", {}, notes=reason)]


# -- (a) send overhead -----------------------------------------------------------------------

Body = Callable[[Any, int], Awaitable[None]]


def _bodies(variant: str) -> Body:
    from faststream_outbox import OutboxBroker
    from sqlalchemy import text

    from outbox import Broker

    order = text("INSERT INTO orders (customer, total) VALUES (:customer, :total)")
    ours = Broker()
    peer = OutboxBroker(outbox_table=_peer_table())

    bare = text("INSERT INTO bare (payload) VALUES (:payload)")

    async def business(conn: Any, i: int) -> None:
        await conn.execute(order, {"customer": "c", "total": i})

    async def floor(conn: Any, i: int) -> None:
        await business(conn, i)
        await conn.execute(bare, {"payload": b"x" * 80})

    async def send(conn: Any, i: int) -> None:
        await business(conn, i)
        await ours.send_async(conn, "bench.orders", PAYLOAD, key=f"order-{i}")

    async def publish(conn: Any, i: int) -> None:
        await business(conn, i)
        await peer.publish(PAYLOAD, queue=QUEUE, session=conn)

    bodies = {"business only": business, "floor": floor, "send": send, "publish": publish}
    return bodies[variant]


async def _write(url: str, variant: str, seconds: float, start_at: float) -> list[float]:
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    body = _bodies(variant)
    engine = create_async_engine(url, poolclass=NullPool)
    latencies: list[float] = []
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")
            await conn.commit()
            await asyncio.sleep(max(0.0, start_at - time.time()))
            end = start_at + seconds
            i = 0
            while True:
                t0 = time.perf_counter()
                if time.time() >= end:
                    break
                async with conn.begin():
                    await body(conn, i)
                latencies.append((time.perf_counter() - t0) * 1000)
                i += 1
    finally:
        await engine.dispose()
    return latencies


def _writer(url: str, variant: str, seconds: float, start_at: float, out: Any) -> None:
    out.put(asyncio.run(_write(url, variant, seconds, start_at)))


def _run_writers(url: str, variant: str, writers: int, seconds: float) -> tuple[float, list[float]]:
    """send_overhead's runner for asyncio writers: N processes, one transaction at a time each."""
    context = mp.get_context("fork")
    queue = context.Queue()
    start_at = time.time() + 0.5 + 0.05 * writers
    procs = [
        context.Process(target=_writer, args=(url, variant, seconds, start_at, queue))
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


def _send_overhead(ctx: Context, url: str) -> list[Result]:
    seconds = 1.0 if ctx.smoke else 5.0
    psycopg_url = _driver_url(url, "psycopg")
    variants = [
        ("business only", "business only", "insert one order row"),
        ("+ plain INSERT (floor)", "floor", "one more plain INSERT into a bare table"),
        (
            "+ outbox send_async",
            "send",
            "outbox: one INSERT into producer_queue (NOTIFY only while a relay sleeps)",
        ),
        (
            f"+ {PEER} publish",
            "publish",
            "peer: INSERT ... RETURNING id, pg_notify(...) into "
            "its table, NOTIFY on every first publish of a transaction",
        ),
    ]
    results: list[Result] = []
    for writers in WRITERS:
        base = floor = 0.0
        for label, variant, what in variants:
            rate, latencies = _run_writers(psycopg_url, variant, writers, seconds)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"TRUNCATE orders, bare, {TABLE}, outbox.producer_queue")
                conn.execute("VACUUM ANALYZE")
            if variant == "business only":
                base = rate
            if variant == "floor":
                floor = rate
            p = percentiles(latencies)
            metrics = {
                "writers": writers,
                "commits/s": rate,
                "p50 ms": p["p50"],
                "p99 ms": p["p99"],
            }
            if base and variant != "business only":
                metrics["% of business only"] = 100 * rate / base
                metrics = against_floor(metrics, rate, floor)
            results.append(
                Result(
                    SCENARIO,
                    f"(a) {writers} writers: {label}",
                    metrics,
                    notes=f"{what}; SQLAlchemy AsyncConnection, psycopg driver; no relay running",
                )
            )
    return results


# -- relays and a plain reader -----------------------------------------------------------------


async def _send_paced(
    url: str, which: str, rate: float, count: int, topic: str
) -> tuple[dict[str, float], float]:
    """One sender, one message per transaction at `rate`/s; commit times by payload id."""
    from faststream_outbox import OutboxBroker
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from outbox import Broker

    ours = Broker()
    peer = OutboxBroker(outbox_table=_peer_table())
    engine = create_async_engine(_driver_url(url, "psycopg"), poolclass=NullPool)
    committed: dict[str, float] = {}
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("SELECT 1")
            await conn.commit()
            start = time.perf_counter() + 0.01
            for i in range(count):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = {"id": str(uuid.uuid4()), "note": "x" * 60}
                async with conn.begin():
                    if which == "ours":
                        await ours.send_async(conn, topic, body, key=f"order-{i}")
                    else:
                        await peer.publish(body, queue=QUEUE, session=conn)
                committed[body["id"]] = time.time()
            elapsed = time.perf_counter() - start
    finally:
        await engine.dispose()
    return committed, elapsed


def _count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


async def _fill_peer(url: str, count: int) -> None:
    from faststream_outbox import OutboxBroker
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    peer = OutboxBroker(outbox_table=_peer_table())
    engine = create_async_engine(_driver_url(url, "psycopg"), poolclass=NullPool)
    try:
        async with engine.connect() as conn, conn.begin():
            for first in range(0, count, 1000):
                bodies = [_backlog_body(i) for i in range(first, min(count, first + 1000))]
                await peer.publish_batch(*bodies, queue=QUEUE, session=conn)
    finally:
        await engine.dispose()


def _fill_ours(url: str, topic: str, count: int) -> None:
    from outbox import Broker, Message

    broker = Broker()
    with psycopg.connect(url) as conn, conn.transaction():
        for first in range(0, count, 1000):
            broker.send_many(
                conn,
                [
                    Message(topic, _backlog_body(i), key=f"order-{i}")
                    for i in range(first, min(count, first + 1000))
                ],
            )


def _backlog_body(i: int) -> dict[str, Any]:
    """About 100 bytes of JSON."""
    return {"id": f"b{i}", "note": "x" * (80 - len(str(i)))}


def _relay_rounds(
    ctx: Context,
    url: str,
    which: str,
    relay: Daemon,
    topic: str,
    table: str,
    label: str,
    notes: str,
    floors: tuple[float, Result],
) -> list[Result]:
    """With a relay running: warm up, (e) at 100/s, then (b) a backlog; one Result each, beside
    `floors`: the bare relay loop's msg/s and the broker floor's latency row."""
    relay_rate, latency_floor = floors
    results: list[Result] = []
    reader = Reader(ctx.bootstrap, topic)
    try:
        warm, _ = asyncio.run(_send_paced(url, which, 20, 5, topic))
        if not reader.wait_for(list(warm), 60):
            relay.check()
            raise TimeoutError(
                f"{label}: warm-up messages did not reach {topic}:\n{relay.output()}"
            )
        count = int(E2E_RATE * _e2e_seconds(ctx))
        committed, elapsed = asyncio.run(_send_paced(url, which, E2E_RATE, count, topic))
        reader.wait_for(list(committed), 30 + count / 50)
        relay.check()
        row = latency_result(
            f"(e) {E2E_RATE}/s: {label}",
            committed,
            reader.received,
            {"writers": 1, "target /s": E2E_RATE, "achieved /s": count / elapsed},
            f"{notes}; sender commit -> receipt by a plain confluent-kafka consumer "
            "(outbox's consumer + handler do not apply: the peer has no inbox); 'to relay "
            "produce' = commit -> the record's CreateTime, set when the relay called "
            "produce() (1 ms resolution)",
            stage=("to relay produce", reader.produced),
            scenario=SCENARIO,
        )
        row.metrics = against_floor(
            {**row.metrics, "floor p99 ms": latency_floor.metrics["p99 ms"]},
            row.metrics["p50 ms"],
            latency_floor.metrics["p50 ms"],
            lower_is_better=True,
        )
        results.append(row)
    finally:
        reader.close()
    # (b) without a reader running; what reached the topic is read back afterwards.
    backlog = _backlog_size(ctx)
    if which == "ours":
        _fill_ours(url, topic, backlog)
    else:
        asyncio.run(_fill_peer(url, backlog))
    committed_at = time.perf_counter()
    timeout = 60 + backlog / 50
    while _count(url, table) > 0:
        relay.check()
        if time.perf_counter() - committed_at > timeout:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - committed_at
    left = _count(url, table)
    relayed = backlog - left
    reader = Reader(ctx.bootstrap, topic)
    try:
        ids = [f"b{i}" for i in range(backlog)]
        reader.wait_for(ids, 30 + backlog / 2000)
        in_topic = sum(1 for i in ids if i in reader.received)
    finally:
        reader.close()
    check = "" if in_topic == backlog else f"; only {in_topic} of them read back from the topic"
    if left:
        check += f"; {left} rows still queued after {timeout:.0f} s"
    results.append(
        Result(
            SCENARIO,
            f"(b) {backlog:,} backlog: {label}",
            against_floor(
                {"messages": backlog, "relayed/s": relayed / elapsed}, relayed / elapsed, relay_rate
            ),
            notes=f"{notes}; about 100 B of JSON each, committed in one transaction; from the "
            f"commit until the queue table is empty, then read back from the topic{check}; "
            "floor: the bare relay loop over as many messages, from its start to empty",
        )
    )
    return results


def _backlog_size(ctx: Context) -> int:
    return ctx.scale(50_000, 2_000)


def _e2e_seconds(ctx: Context) -> float:
    return 2.0 if ctx.smoke else 20.0


def _floors(ctx: Context) -> tuple[float, Result]:
    """This run's floors of (b) and (e): the bare relay loop over a backlog like (b)'s, and the
    broker floor at (e)'s rate: a producer sending each record at once -> the plain reader with
    its fetch wait (outbox's consumer's)."""
    url = ctx.new_database()
    topic = ctx.new_topic("peer-floor")
    _fill_ours(url, topic, _backlog_size(ctx))
    relay_rate = relay_floor(url, ctx.bootstrap, topic, from_start=True)
    count = int(E2E_RATE * _e2e_seconds(ctx) / 2)
    at_once = Variant("peer floor", producer_kafka=("linger.ms=0",))
    latency = broker_floor(ctx.bootstrap, ctx.new_topic("peer-floor"), E2E_RATE, count, at_once)
    latency.scenario = SCENARIO
    latency.variant = f"(e) {E2E_RATE}/s: broker floor"
    return relay_rate, latency


def run(ctx: Context) -> list[Result]:
    try:
        import asyncpg  # noqa: F401
        import faststream.confluent  # noqa: F401
        import faststream_outbox  # noqa: F401
        import sqlalchemy.ext.asyncio  # noqa: F401
    except ImportError as exc:
        return _unavailable(
            f"{PEER} is not installed ({exc}); pip install 'faststream-outbox[asyncpg]' "
            "'faststream[confluent]'"
        )
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    url = ctx.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SETUP)
    table = _peer_table()
    engine = create_engine(_driver_url(url, "psycopg"), poolclass=NullPool)
    try:
        table.metadata.create_all(engine)
    finally:
        engine.dispose()

    results = _send_overhead(ctx, url)
    floors = _floors(ctx)
    results.append(floors[1])

    topic = ctx.new_topic("peer-ours")
    producer = outbox_daemon(
        "outbox producer", "producer", "--database-url", url, "--kafka-bootstrap", ctx.bootstrap
    )
    try:
        results += _relay_rounds(
            ctx,
            url,
            "ours",
            producer,
            topic,
            "outbox.producer_queue",
            "outbox producer",
            "`outbox producer` process, defaults (reference)",
            floors,
        )
    finally:
        producer.stop()

    for name, options in RELAYS.items():
        topic = ctx.new_topic(f"peer-{name}")
        relay = Daemon(
            f"{PEER} relay ({name})",
            [
                "-m",
                "benchmarks.peer_app",
                "--database-url",
                _driver_url(url, "asyncpg"),
                "--bootstrap",
                ctx.bootstrap,
                "--table",
                TABLE,
                "--queue",
                QUEUE,
                "--topic",
                topic,
                *options,
            ],
        )
        try:
            relay.wait_for_output("ready", 60)
            results += _relay_rounds(
                ctx,
                url,
                "peer",
                relay,
                topic,
                TABLE,
                f"{PEER} relay, {name}",
                f"relay process (benchmarks.peer_app, asyncpg driver, LISTEN on), "
                f"{RELAY_NOTES[name]}",
                floors,
            )
        finally:
            relay.stop()
    # Group the rows by scenario letter: (a), then (b), then (e).
    return sorted(results, key=lambda r: r.variant[:3])
