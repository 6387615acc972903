"""(f) Backlog and retention: a long stream through the whole path, and what it leaves behind.

Two databases (the sender and the receiver), one 3-partition topic, and the three daemons as
processes, all running at once: `outbox producer` on the sender, `outbox consumer` and
`outbox handler --dedup-window 0` (the benchmark callback: one INSERT) on the receiver. One
warm-up message first travels the whole path, so that process start-up and the consumer's group
join are reported apart ("startup s") instead of being counted in the rate. Then this process
sends the messages (100 B payloads, keys over 1,000 keys) with `Broker.send_many`, 1,000 per
transaction, as fast as it can, and the clock runs until the handler has processed the last.

Table sizes (pg_total_relation_size, so indexes and TOAST included), rows and dead tuples
(pg_stat_user_tables.n_dead_tup) of producer_queue (sender) and consumer_queue (receiver) are
taken before the run, at their peak while it runs (sizes only, sampled every 0.5 s), at the end,
after retention, and after a plain VACUUM. Statistics are flushed lazily, so each snapshot is
taken after the daemons have stopped (a backend flushes its statistics when it exits) and a
1 s pause.

Retention: `--dedup-window 0` makes a processed row eligible for deletion at once, but the
handler deletes only every `HandlerConfig.retention_interval` (5 s; 30 s before 2026-11-26),
and the CLI does not expose that interval. So "at the end" shows what the running handler left: the
rows processed since its last retention pass. "after retention" starts a fresh handler process,
whose first idle moment runs a retention pass at once, and waits until consumer_processed (the
handled messages' ids, decision 17) is empty.

The end-to-end row shows its msg/s as `figure` beside a `floor` measured in the same run: the
bare loops of `benchmarks/floors.py` chained over the same servers and run at once
(`pipeline_floor`): a writer inserting as many messages of the same size 1,000 per transaction
-> a bare relay -> Kafka -> a bare consumer -> a bare handler (one INSERT per message, one
loop), timed the same way, from the writer's start until the last effect is committed.

OUTBOX_BENCH_NAPTIME=10 runs it with the server's autovacuum_naptime at 10 s instead of 60 (the
queue tables' own autovacuum settings come from migration 0006).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.floors import against_floor, pipeline_floor
from benchmarks.harness import Context, Result
from benchmarks.throughput import (
    KEYS,
    Daemon,
    consumer_args,
    handler_args,
    handler_env,
    producer_args,
    scalar,
    send_backlog,
    stop_all,
    timeout_for,
    wait_for,
)

SCENARIO = "f. backlog and retention"
CONCURRENCY = 4
PAYLOAD = b"x" * 100
#: Seconds: run with the server's autovacuum_naptime set to this (default: the server's, 60 s).
NAPTIME_ENV = "OUTBOX_BENCH_NAPTIME"


def _table(url: str, table: str) -> dict[str, int]:
    """Size, rows, dead tuples and autovacuum runs of one outbox table."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT pg_total_relation_size('outbox.{table}'), "
            f"(SELECT count(*) FROM outbox.{table}), n_dead_tup, autovacuum_count "
            "FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname = %s",
            (table,),
        ).fetchone()
    assert row is not None
    size, rows, dead, autovacuums = row
    return {"bytes": size, "rows": rows, "dead": dead, "autovacuums": autovacuums}


def _snapshot(sender: str, receiver: str, *, settle: float = 1.0) -> dict[str, dict[str, int]]:
    time.sleep(settle)  # pg_stat_user_tables is updated lazily
    return {
        "producer_queue": _table(sender, "producer_queue"),
        "consumer_queue": _table(receiver, "consumer_queue"),
        "consumer_processed": _table(receiver, "consumer_processed"),
    }


def _row(variant: str, snap: dict[str, dict[str, int]], notes: str = "") -> Result:
    p, c, h = snap["producer_queue"], snap["consumer_queue"], snap["consumer_processed"]
    return Result(
        SCENARIO,
        variant,
        {
            "producer_queue MB": p["bytes"] / 1e6,
            "producer_queue dead tuples": p["dead"],
            "consumer_queue MB": c["bytes"] / 1e6,
            "consumer_queue rows": c["rows"],
            "consumer_queue dead tuples": c["dead"],
            "consumer_processed MB": h["bytes"] / 1e6,
            "consumer_processed rows": h["rows"],
        },
        notes=notes,
    )


class _Peaks:
    """Samples both tables' sizes every `interval` seconds in a thread; keeps the largest."""

    def __init__(self, sender: str, receiver: str, interval: float = 0.5) -> None:
        self.sender, self.receiver, self.interval = sender, receiver, interval
        self.producer_queue = 0
        self.consumer_queue = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-peaks", daemon=True)

    def _run(self) -> None:
        try:
            with (
                psycopg.connect(self.sender, autocommit=True) as s,
                psycopg.connect(self.receiver, autocommit=True) as r,
            ):
                while True:
                    p = scalar(s, "SELECT pg_total_relation_size('outbox.producer_queue')")
                    c = scalar(r, "SELECT pg_total_relation_size('outbox.consumer_queue')")
                    self.producer_queue = max(self.producer_queue, int(p))
                    self.consumer_queue = max(self.consumer_queue, int(c))
                    if self._stop.wait(self.interval):
                        return
        except BaseException as exc:  # reported by stop(), not lost in the thread
            self.error = exc

    def __enter__(self) -> _Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _effects_done(conn: psycopg.Connection[Any], expected: int) -> bool:
    top = scalar(conn, "SELECT max(id) FROM effects")
    if top is None or top < expected:
        return False
    pending = "SELECT count(*) FROM outbox.consumer_queue WHERE processed_at IS NULL"
    return bool(scalar(conn, pending) == 0)


def retention(ctx: Context) -> list[Result]:
    messages = ctx.scale(1_000_000, 5_000)
    naptime = os.environ.get(NAPTIME_ENV, "").strip()
    if naptime:
        _set_naptime(ctx.admin_url, f"{float(naptime):g}s")
    try:
        results = _retention(ctx, messages)
    finally:
        if naptime:
            _set_naptime(ctx.admin_url, None)
    if naptime:
        first = results[0]
        first.notes = "; ".join(filter(None, [first.notes, f"autovacuum_naptime = {naptime} s"]))
    return results


def _set_naptime(admin_url: str, value: str | None) -> None:
    """Set (or with None, reset) the server's autovacuum_naptime: how often autovacuum looks
    at each database."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if value is None:
            conn.execute("ALTER SYSTEM RESET autovacuum_naptime")
        else:
            # A utility statement takes no bound parameters: the value is a quoted literal.
            conn.execute(
                sql.SQL("ALTER SYSTEM SET autovacuum_naptime = {}").format(sql.Literal(value))
            )
        conn.execute("SELECT pg_reload_conf()")


def _retention(ctx: Context, messages: int) -> list[Result]:
    from benchmarks.bench_handlers import EFFECTS_TABLE
    from outbox import Broker

    sender = ctx.new_database()
    receiver = ctx.new_database()
    with psycopg.connect(receiver, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    topic = ctx.new_topic("retention", partitions=3)
    group = f"bench-retention-{uuid.uuid4().hex[:8]}"
    env = handler_env(topic)
    timeout = timeout_for(messages)
    floor_topic = ctx.new_topic("retention-floor", partitions=3)
    floor, _ = pipeline_floor(
        ctx.new_database(migrated=False),
        ctx.bootstrap,
        floor_topic,
        messages,
        payload=PAYLOAD,
        write=True,
    )
    results = [_row("before the run", _snapshot(sender, receiver))]

    daemons: list[Daemon] = []
    with psycopg.connect(receiver, autocommit=True) as conn:
        try:
            started = time.perf_counter()
            daemons.append(Daemon(*producer_args(sender, ctx.bootstrap)))
            daemons.append(Daemon(*consumer_args(receiver, ctx.bootstrap, topic, group)))
            daemons.append(
                Daemon(*handler_args(receiver, CONCURRENCY, "--dedup-window", "0"), env=env)
            )
            with psycopg.connect(sender) as tx, tx.transaction():
                Broker().send(tx, topic, PAYLOAD, key="warm-up")
            startup = wait_for(
                lambda: _effects_done(conn, 1),
                since=started,
                timeout=timeout,
                daemons=daemons,
                interval=0.05,
                what="the warm-up message",
            )
            with _Peaks(sender, receiver) as peaks:
                started = time.perf_counter()
                send_s = send_backlog(sender, topic, messages, PAYLOAD)
                seconds = wait_for(
                    lambda: _effects_done(conn, messages + 1),
                    since=started,
                    timeout=timeout,
                    daemons=daemons,
                    interval=0.1,
                    what="the whole path",
                )
            if peaks.error is not None:
                raise peaks.error
        finally:
            stop_all(daemons)
        handled = scalar(conn, "SELECT count(*) FROM effects") - 1

    notes = [f"{KEYS} keys, handler concurrency {CONCURRENCY}"]
    notes.append(
        "floor: a writer, the bare relay, consumer and handler loops at once, as many messages"
    )
    if handled != messages:
        notes.append(f"effects holds {handled} rows, expected {messages}")
    results.insert(
        0,
        Result(
            SCENARIO,
            f"{messages:,} messages end to end",
            against_floor(
                {
                    "messages": messages,
                    "seconds": seconds,
                    "msg/s": messages / seconds,
                    "send msg/s": messages / send_s,
                    "startup s": startup,
                },
                messages / seconds,
                floor,
            ),
            notes="; ".join(notes),
        ),
    )
    results.append(
        Result(
            SCENARIO,
            "peak during the run",
            {
                "producer_queue MB": peaks.producer_queue / 1e6,
                "consumer_queue MB": peaks.consumer_queue / 1e6,
            },
            notes="sizes sampled every 0.5 s",
        )
    )
    end = _snapshot(sender, receiver)
    autovacuums = (
        f"autovacuum ran {end['producer_queue']['autovacuums']}x on producer_queue, "
        f"{end['consumer_queue']['autovacuums']}x on consumer_queue"
    )
    results.append(_row("at the end", end, notes=autovacuums))

    # A fresh handler runs a retention pass at its first idle moment (the interval is not on
    # the CLI): wait until it has forgotten every handled message's id (decision 17).
    daemons = []
    with psycopg.connect(receiver, autocommit=True) as conn:
        try:
            retention_started = time.perf_counter()
            daemons.append(
                Daemon(*handler_args(receiver, 1, "--dedup-window", "0"), env=env),
            )
            retention_s = wait_for(
                lambda: (
                    scalar(conn, "SELECT min(processed_at) FROM outbox.consumer_processed") is None
                ),
                since=retention_started,
                timeout=timeout,
                daemons=daemons,
                interval=0.1,
                what="retention",
            )
        finally:
            stop_all(daemons)
    results.append(
        _row(
            "after retention",
            _snapshot(sender, receiver),
            notes=f"a fresh handler process emptied consumer_queue in {retention_s:.1f}s",
        )
    )

    for url, table in ((sender, "producer_queue"), (receiver, "consumer_queue")):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"VACUUM outbox.{table}")
    results.append(_row("after VACUUM", _snapshot(sender, receiver), notes="plain VACUUM"))
    return results


#: The scenario registry calls `run`.
run = retention
