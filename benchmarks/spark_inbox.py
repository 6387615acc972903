"""(spark) The Kafka -> inbox leg on Spark against the Consumer daemon, on the same backlog.

One backlog (100 B messages with outbox headers over 1,000 keys, produced once to a 3-partition
topic) is stored into a fresh database by each of:

- the Consumer daemon (`outbox consumer`, one process, batch 1000), as scenario (c) runs it;
- `outbox spark consumer --available-now` on `local[1]` and on `local[2]`, in micro-batches of
  at most a fifth of the backlog (`--max-offsets-per-trigger`), a new checkpoint each time.

Each runs as a real process. "seconds" is from the start of the process until every message is
stored; "startup s" until the first row is stored (the Spark job pays for its JVM, its Python
workers and the query planning there); "msg/s" is the rate after that first row. Each row's
`floor` is the bare consumer loop (`floors.inbox_floor`: poll 1,000 records, one INSERT into a
bare table, commit, commit offsets) over the same topic and records, measured in the same run
before the relays (its own row shows it and its startup), `ratio` = msg/s / floor. Spark's rate
grows with Kafka partitions and executor cores; on this 2-core machine, shared with PostgreSQL
and the broker, the ratio between the variants is what to read, not the absolute numbers.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from typing import Any

import psycopg

from benchmarks.floors import against_floor, inbox_floor
from benchmarks.harness import Context, Result
from benchmarks.throughput import (
    Daemon,
    consumer_args,
    produce_direct,
    scalar,
    stop_all,
    timeout_for,
    wait_for,
)

SCENARIO = "spark. inbox relay: Spark vs the Consumer daemon"
MASTERS = ("local[1]", "local[2]")
COUNT = "SELECT count(*) FROM outbox.consumer_queue"
MAX_ID = "SELECT max(id) FROM outbox.consumer_queue"
FLOOR_NOTE = (
    "floor: the bare consumer loop (one plain consumer in a new group polls 1,000 records, "
    "INSERTs them into a bare table in one statement, commits, commits its offsets) over the "
    "same topic and records, msg/s from its first stored batch, in the same run"
)


def run(ctx: Context) -> list[Result]:
    """Produce one backlog, then store it with each relay into its own database."""
    messages = ctx.scale(100_000, 5_000)
    topic = ctx.new_topic("spark-inbox", partitions=3)
    produce_s = produce_direct(ctx.bootstrap, topic, messages, 100)
    note = f"input produced in {produce_s:.1f}s"
    floor, floor_startup = inbox_floor(ctx.new_database(), ctx.bootstrap, topic, messages)
    results = [_daemon(ctx, topic, messages, note)]
    for master in MASTERS:
        results.append(_spark(ctx, topic, messages, master, note))
    for result in results:
        result.metrics = against_floor(result.metrics, result.metrics["msg/s"], floor)
        result.notes += f"; {FLOOR_NOTE}"
    results.append(
        Result(
            SCENARIO,
            "floor: bare consumer loop",
            {"messages": messages, "startup s": floor_startup, "floor": floor},
            notes=FLOOR_NOTE,
        )
    )
    return results


def _daemon(ctx: Context, topic: str, messages: int, note: str) -> Result:
    url = ctx.new_database()
    group = f"bench-spark-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        daemons = [Daemon(*consumer_args(url, ctx.bootstrap, topic, group))]
        try:
            startup, first_rows, seconds = _measure(conn, messages, started, daemons)
        finally:
            stop_all(daemons)
        stored = scalar(conn, COUNT)
    return _result(
        "Consumer daemon, 1 process, batch 1000",
        messages,
        stored,
        startup,
        first_rows,
        seconds,
        note,
    )


def _spark(ctx: Context, topic: str, messages: int, master: str, note: str) -> Result:
    url = ctx.new_database()
    checkpoint = tempfile.mkdtemp(prefix="outbox-bench-spark-")
    per_trigger = max(1, messages // 5)
    args = [
        "spark",
        "consumer",
        "--database-url",
        url,
        "--kafka-bootstrap",
        ctx.bootstrap,
        "--topic",
        topic,
        "--checkpoint",
        checkpoint,
        "--available-now",
        "--max-offsets-per-trigger",
        str(per_trigger),
        "--master",
        master,
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        job = Daemon(*args)
        try:
            startup, first_rows, seconds = _measure(conn, messages, started, [], job)
            code = job.process.wait(timeout_for(messages))
            if code != 0:
                raise RuntimeError(f"outbox spark consumer exited with {code}:\n{job.output()}")
        finally:
            job.stop()
        stored = scalar(conn, COUNT)
    return _result(
        f"Spark {master}, micro-batches of {per_trigger}",
        messages,
        stored,
        startup,
        first_rows,
        seconds,
        note,
    )


def _measure(
    conn: psycopg.Connection[Any],
    messages: int,
    started: float,
    daemons: list[Daemon],
    job: Daemon | None = None,
) -> tuple[float, int, float]:
    """(startup seconds, rows stored at the first look, seconds until all are stored)."""
    timeout = timeout_for(messages)

    def first_row() -> bool:
        _failed(job)
        return scalar(conn, MAX_ID) is not None

    def all_stored() -> bool:
        _failed(job)
        done = int(scalar(conn, COUNT)) >= messages
        if not done and job is not None and job.process.poll() == 0:
            raise RuntimeError(f"outbox spark consumer ended before storing all:\n{job.output()}")
        return done

    startup = wait_for(
        first_row, since=started, timeout=timeout, daemons=daemons, what="the first stored row"
    )
    first_rows = int(scalar(conn, COUNT))
    seconds = wait_for(
        all_stored, since=started, timeout=timeout, daemons=daemons, what="storing every message"
    )
    return startup, first_rows, seconds


def _failed(job: Daemon | None) -> None:
    """Raise if a job ended with an error before storing everything."""
    if job is not None and job.process.poll() not in (None, 0):
        raise RuntimeError(f"outbox spark consumer failed:\n{job.output()}")


def _result(
    variant: str,
    messages: int,
    stored: int,
    startup: float,
    first_rows: int,
    seconds: float,
    note: str,
) -> Result:
    notes = [note]
    if stored != messages:
        notes.append(f"consumer_queue holds {stored} rows, expected {messages}")
    steady = seconds - startup
    return Result(
        SCENARIO,
        variant,
        {
            "messages": messages,
            "msg/s": (messages - first_rows) / steady if steady > 0 else float("nan"),
            "seconds": seconds,
            "startup s": startup,
        },
        notes="; ".join(notes),
    )
