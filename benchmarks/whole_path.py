"""(w) The whole path at once: service A's producer_queue -> Kafka -> service B's inbox -> handler.

Two services, a database each on the one PostgreSQL server, and the three daemons as separate
processes, all running at the same time: A's `outbox producer`, B's `outbox consumer` and B's
`outbox handler` with a callback that inserts one row in the handler's transaction (per message,
or as a `batch_handler` with one `executemany`). A's backlog (JSON messages of about 100 B, keys
spread over 1,000 keys) is written and VACUUM ANALYZEd first; the consumer and the handler are
started and a few warm-up records are taken through them (so that joining the consumer group,
which Tansu makes take half of session.timeout.ms, is not timed); then the producer starts.
Timed from the producer's start until the last effect row is committed: every message crossed
the three legs within that time, with all three daemons busy at once.

Each row also says where the CPU went, per message: each daemon's own process, the PostgreSQL
backends serving it (by application_name), the rest of PostgreSQL (autovacuum, checkpointer,
the warm-up and the benchmark's own polling), and the broker, read from /proc before and after.
With OUTBOX_BENCH_STATEMENTS=1 the server is restarted with pg_stat_statements loaded and each
row's notes list the statements that took the most server time, per message.
OUTBOX_BENCH_HANDLER_ARGS adds flags to the handler's command line (an experiment, noted).

Each row shows its msg/s as `figure` beside a `floor` measured in the same run: the bare loops
of `benchmarks/floors.py` chained over the same servers and run at once (`pipeline_floor`), a
bare relay over a backlog of as many messages of the same size -> Kafka -> a bare consumer ->
a bare handler (one INSERT per message; one executemany for the `batch_handler` row), timed the
same way: from the relay's start until the last effect is committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable, Sequence

import psycopg

from benchmarks.floors import against_floor, pipeline_floor
from benchmarks.harness import Context, Result
from benchmarks.throughput import (
    BATCH_HANDLERS_TARGET,
    HANDLERS_TARGET,
    PIPELINED_HANDLERS_TARGET,
    Daemon,
    consumer_args,
    handler_env,
    produce_direct,
    scalar,
    stop_all,
    timeout_for,
    vacuum_analyze,
    wait_for,
)

SCENARIO = "w. whole path, three daemons at once"
KEYS = 1000
TX_ROWS = 1000
WARMUP = 10
#: (registry, label) of each variant; the handler runs with its default concurrency and batch.
VARIANTS = {
    "per message": (HANDLERS_TARGET, "per-message handler, one INSERT"),
    "pipelined": (PIPELINED_HANDLERS_TARGET, "per-message handler, Handlers(pipeline=True)"),
    "batch": (BATCH_HANDLERS_TARGET, "batch_handler, one executemany"),
}
STATEMENTS_ENV = "OUTBOX_BENCH_STATEMENTS"
#: Extra flags for the handler (an experiment: `--batch-size 1000`); the table notes them.
HANDLER_ARGS_ENV = "OUTBOX_BENCH_HANDLER_ARGS"
TICKS = os.sysconf("SC_CLK_TCK")


# -- CPU accounting from /proc -------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    """Direct children of `pid` (PostgreSQL's backends and workers are the postmaster's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with (
            contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError),
            open(f"/proc/{entry}/stat") as f,
        ):
            if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


class CpuMeter:
    """CPU seconds per group of processes between `start()` and `stop()`.

    Backends come and go (the handler's sessions open after start-up), so every process seen
    at either end is counted with what it had used at the other (0 if it did not exist yet); a
    process that lives only between the two readings is missed, which the daemons' long-lived
    connections do not do.
    """

    def __init__(self, admin_url: str, postmaster: int, broker: int | None) -> None:
        self.admin_url = admin_url
        self.postmaster = postmaster
        self.broker = broker
        self.daemons: dict[str, int] = {}
        self._before: dict[int, float] = {}
        self._groups: dict[int, str] = {}

    def _backends(self) -> dict[int, str]:
        """pid -> group of each backend of a daemon: 'postgres for <application_name>'."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE application_name LIKE 'outbox-%'"
            ).fetchall()
        return {
            pid: "pg for " + name.removesuffix("-probe").removeprefix("outbox-")
            for pid, name in rows
        }

    def _read(self) -> dict[int, float]:
        pids = set(children(self.postmaster)) | {self.postmaster, *self.daemons.values()}
        if self.broker:
            pids.add(self.broker)
        self._groups.update(self._backends())
        return {pid: cpu_seconds(pid) for pid in pids}

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> dict[str, float]:
        after = self._read()
        names = {pid: name for name, pid in self.daemons.items()}
        if self.broker:
            names[self.broker] = "broker"
        used: dict[str, float] = {}
        for pid in set(after) | set(self._before):
            spent = after.get(pid, 0.0) - self._before.get(pid, 0.0)
            group = names.get(pid) or self._groups.get(pid) or "pg other"
            used[group] = used.get(group, 0.0) + max(0.0, spent)
        return used


# -- pg_stat_statements --------------------------------------------------------------------------


def statements_enabled() -> bool:
    return os.environ.get(STATEMENTS_ENV, "") not in ("", "0")


def load_pg_stat_statements(ctx: Context) -> None:
    """Restart the server with pg_stat_statements preloaded (once per benchmark run)."""
    with psycopg.connect(ctx.admin_url, autocommit=True) as conn:
        loaded = scalar(conn, "SHOW shared_preload_libraries")
        if "pg_stat_statements" in (loaded or ""):
            return
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    ctx.servers.postgres.restart()


def reset_statements(urls: Iterable[str]) -> None:
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")


def top_statements(url: str, messages: int, limit: int = 8) -> list[str]:
    """The statements of the whole server that took the most time: 'µs/msg calls query'."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT total_exec_time, calls, regexp_replace(query, '\\s+', ' ', 'g') "
            "FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT %s",
            (limit,),
        ).fetchall()
    return [
        f"{ms * 1000 / messages:.1f} µs/msg, {calls} calls: {query[:90]}"
        for ms, calls, query in rows
    ]


# -- the run -------------------------------------------------------------------------------------


def send_backlog(url: str, topic: str, messages: int) -> None:
    """`messages` JSON messages of about 100 B in A's producer_queue, 1,000 per transaction."""
    from outbox import Broker, Message

    broker = Broker()
    note = "x" * 70
    with psycopg.connect(url) as conn:
        for first in range(0, messages, TX_ROWS):
            batch = [
                Message(topic, {"n": i, "note": note}, key=f"key-{i % KEYS}")
                for i in range(first, min(messages, first + TX_ROWS))
            ]
            with conn.transaction():
                broker.send_many(conn, batch)


def run(ctx: Context) -> list[Result]:
    messages = ctx.scale(60_000, 3_000)
    if statements_enabled():
        load_pg_stat_statements(ctx)
    floors = {batch: _floor(ctx, messages, batch) for batch in (False, True)}
    results = []
    for variant in VARIANTS:
        result = _run(ctx, messages, variant)
        batch = variant == "batch"
        result.metrics = against_floor(result.metrics, result.metrics["msg/s"], floors[batch])
        floor_note = (
            "floor: the bare relay, consumer and handler loops at once over the same backlog, "
            "one INSERT per message" + (" (executemany)" if batch else "")
        )
        result.notes = "; ".join(n for n in (result.notes, floor_note) if n)
        results.append(result)
    return results


def _floor(ctx: Context, messages: int, batch: bool) -> float:
    """msg/s of the bare pipeline over a backlog of `messages` messages of the same size."""
    payload = json.dumps({"n": 0, "note": "x" * 70}).encode()
    url = ctx.new_database(migrated=False)
    topic = ctx.new_topic("whole-floor", partitions=3)
    rate, _ = pipeline_floor(
        url, ctx.bootstrap, topic, messages, payload=payload, write=False, batch=batch
    )
    return rate


def _run(ctx: Context, messages: int, variant: str) -> Result:
    from benchmarks.bench_handlers import EFFECTS_TABLE

    target, label = VARIANTS[variant]
    sender = ctx.new_database()
    receiver = ctx.new_database()
    topic = ctx.new_topic("whole", partitions=3)
    with psycopg.connect(receiver, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    send_backlog(sender, topic, messages)
    vacuum_analyze(sender, "outbox.producer_queue")
    group = f"bench-whole-{uuid.uuid4().hex[:8]}"
    effects = "SELECT max(id) FROM effects"
    total = messages + WARMUP
    broker_pid = getattr(ctx.servers.kafka, "pid", None)
    meter = CpuMeter(ctx.admin_url, ctx.servers.postgres.pid, broker_pid)
    daemons: list[Daemon] = []
    with psycopg.connect(receiver, autocommit=True) as conn:
        try:
            consumer = Daemon(*consumer_args(receiver, ctx.bootstrap, topic, group))
            handler = Daemon(
                "handler",
                target,
                "--database-url",
                receiver,
                *os.environ.get(HANDLER_ARGS_ENV, "").split(),
                env=handler_env(topic),
            )
            daemons += [consumer, handler]
            # Warm-up straight to Kafka: the group joins, every daemon makes its connections.
            produce_direct(ctx.bootstrap, topic, WARMUP, 100)
            wait_for(
                lambda: (scalar(conn, effects) or 0) >= WARMUP,
                since=time.perf_counter(),
                timeout=120,
                daemons=daemons,
                what="the warm-up records",
            )
            meter.daemons = {"consumer": consumer.process.pid, "handler": handler.process.pid}
            if statements_enabled():
                reset_statements([receiver])
            meter.start()
            started = time.perf_counter()
            producer = Daemon(
                "producer", "--database-url", sender, "--kafka-bootstrap", ctx.bootstrap
            )
            daemons.append(producer)
            meter.daemons["producer"] = producer.process.pid
            timeout = timeout_for(messages)
            first = wait_for(
                lambda: (scalar(conn, effects) or 0) > WARMUP,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="the first message through the whole path",
            )
            seconds = wait_for(
                lambda: (scalar(conn, effects) or 0) >= total,
                since=started,
                timeout=timeout,
                daemons=daemons,
                interval=0.005,
                what="every message through the whole path",
            )
            cpu = meter.stop()
            statements = top_statements(receiver, messages) if statements_enabled() else []
        finally:
            stop_all(daemons)
        done = scalar(conn, "SELECT count(*) FROM effects")
        dead = scalar(conn, "SELECT count(*) FROM outbox.consumer_queue WHERE dead_at IS NOT NULL")
    extra = os.environ.get(HANDLER_ARGS_ENV, "").strip()
    notes = [label, f"handler {extra}" if extra else "every daemon with its default settings"]
    if done != total:
        notes.append(f"effects holds {done} rows, expected {total}")
    if dead:
        notes.append(f"{dead} dead rows")
    metrics: dict[str, float] = {
        "messages": messages,
        "msg/s": messages / seconds,
        "seconds": seconds,
        "first s": first,
    }
    for group_name in _cpu_order(cpu):
        metrics[f"{group_name} µs/msg"] = cpu[group_name] * 1e6 / messages
    metrics["CPU µs/msg"] = sum(cpu.values()) * 1e6 / messages
    notes += statements
    return Result(SCENARIO, variant, metrics, notes="; ".join(notes))


def _cpu_order(cpu: dict[str, float]) -> Sequence[str]:
    order = ["producer", "pg for producer", "broker", "consumer", "pg for consumer"]
    order += ["handler", "pg for handler"]
    order += ["pg other"]
    return [name for name in order if name in cpu] + sorted(set(cpu) - set(order))
