"""(b, c, d) Throughput of each relay alone, draining a backlog, with the daemons as real processes.

(b) `relay`: the Producer (`outbox producer`), producer_queue -> Kafka. A backlog of messages
(100 B and 1 KiB payloads, keys spread over 1,000 keys; and last a backlog of 1,000,000 x 100 B
for one producer) is written with `Broker.send_many`,
VACUUM ANALYZEd, then drained by 1 and by 2 producer processes. Timed from the start of the
processes until producer_queue is empty, nothing subtracted; "startup s" is the time until the
first batch was delivered and deleted (process start, imports, connections, lane locks).

(c) `inbox`: the Consumer (`outbox consumer`), Kafka -> consumer_queue. Messages with outbox
headers are produced straight to a 3-partition topic, then one consumer process stores them.
The rate is measured from the first stored row to the last; joining the consumer group (Tansu
takes half of session.timeout.ms) and starting up is reported apart as "startup s".

(d) `handler`: the Handler (`outbox handler`), consumer_queue -> a callback that inserts one row
in the handler's transaction. consumer_queue is filled with the Consumer's own statement, then
one handler process runs with 1 and with 4 workers. Timed from process start until every row is
processed, nothing subtracted; "startup s" is the time until the first callback committed.

Every run uses a fresh database (and topic), so the scenarios and variants are independent.
Each scenario also runs its bare loop (`benchmarks/floors.py`) over the same input in the same
run, and every row shows its `figure` beside that `floor` and their `ratio`; for (b) and (d) the
figure is "msg/s after 1st" (from the first batch done to the last, start-up left out), as the
bare loops are timed. A quick run
(`--quick`) drains a tenth of the backlogs with one producer, handles 10,000 messages at
concurrency 1, and leaves out the million-message backlog.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.floors import against_floor, handler_floor, inbox_floor, relay_floor
from benchmarks.harness import Context, Result

ROOT = Path(__file__).resolve().parent.parent
KEYS = 1000
TX_ROWS = 1000

RELAY = "b. relay throughput"
INBOX = "c. inbox throughput"
HANDLER = "d. handler throughput"

PAYLOADS = (("100 B", 100), ("1 KiB", 1024))
PRODUCERS = (1, 2)
CONCURRENCY = (1, 4)
HANDLERS_TARGET = "benchmarks.bench_handlers:handlers"
PIPELINED_HANDLERS_TARGET = "benchmarks.bench_handlers:pipelined_handlers"
BATCH_HANDLERS_TARGET = "benchmarks.bench_handlers:batch_handlers"
#: (d)'s variants: the registry each runs, and what the table says about it.
HANDLER_VARIANTS = {
    "plain": (HANDLERS_TARGET, ""),
    "pipelined": (PIPELINED_HANDLERS_TARGET, ", Handlers(pipeline=True)"),
    "batch": (BATCH_HANDLERS_TARGET, ", batch_handler + executemany, 100 per transaction"),
}
#: Tansu joins a consumer group in half of session.timeout.ms.
CONSUMER_KAFKA = ("session.timeout.ms=6000", "heartbeat.interval.ms=1000")


# -- daemons as processes ------------------------------------------------------------------------


class Daemon:
    """One `python -m outbox.cli ...` process; its output goes to a temporary file."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.name = args[0]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "--log-level", "WARNING", *args],
            cwd=ROOT,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
                **(env or {}),
            },
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self, limit: int = 3000) -> str:
        if self._log.closed:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:]

    def check(self) -> None:
        """Raise if the process has exited (daemons only exit on a fatal error)."""
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(
                f"outbox {self.name} (pid {self.process.pid}) exited with code {code}:\n"
                f"{self.output()}"
            )

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM (finish the batch in hand), then SIGKILL after `grace` seconds."""
        self.terminate()
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


def stop_all(daemons: Sequence[Daemon], grace: float = 20.0) -> None:
    """Ask every daemon to stop at once, then wait for each (killing the ones that linger)."""
    for d in daemons:
        d.terminate()
    deadline = time.monotonic() + grace
    for d in daemons:
        d.stop(max(0.1, deadline - time.monotonic()))


def producer_args(url: str, bootstrap: str) -> list[str]:
    return ["producer", "--database-url", url, "--kafka-bootstrap", bootstrap]


def consumer_args(url: str, bootstrap: str, topic: str, group: str) -> list[str]:
    args = ["consumer", "--database-url", url, "--kafka-bootstrap", bootstrap]
    args += ["--topic", topic, "--group", group, "--batch-size", "1000"]
    for setting in CONSUMER_KAFKA:
        args += ["--kafka-config", setting]
    return args


def handler_args(
    url: str, concurrency: int, *extra: str, target: str = HANDLERS_TARGET
) -> list[str]:
    args = ["handler", target, "--database-url", url]
    return [*args, "--concurrency", str(concurrency), "--batch-size", "500", *extra]


def handler_env(*topics: str) -> dict[str, str]:
    from benchmarks.bench_handlers import TOPICS_ENV

    return {TOPICS_ENV: ",".join(topics)}


# -- waiting -------------------------------------------------------------------------------------


def timeout_for(messages: int) -> float:
    """A generous bound for one step, so that a stuck run fails instead of hanging."""
    return 120.0 + messages / 200


def wait_for(
    predicate: Callable[[], bool],
    *,
    since: float,
    timeout: float,
    daemons: Sequence[Daemon] = (),
    interval: float = 0.02,
    what: str = "benchmark step",
) -> float:
    """Poll until `predicate()`; returns seconds since `since` (a perf_counter reading)."""
    deadline = time.perf_counter() + timeout
    while True:
        if predicate():
            return time.perf_counter() - since
        for d in daemons:
            d.check()
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what} did not finish within {timeout:.0f}s")
        time.sleep(interval)


def scalar(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    return row[0] if row else None


def vacuum_analyze(url: str, *tables: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE " + ", ".join(tables) if tables else "VACUUM ANALYZE")


# -- building input ------------------------------------------------------------------------------


def send_backlog(url: str, topic: str, messages: int, payload: bytes) -> float:
    """Write `messages` rows with Broker.send_many, 1,000 per transaction; returns seconds."""
    from outbox import Broker, Message

    broker = Broker()
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for first in range(0, messages, TX_ROWS):
            batch = [
                Message(topic, payload, key=f"key-{i % KEYS}")
                for i in range(first, min(messages, first + TX_ROWS))
            ]
            with conn.transaction():
                broker.send_many(conn, batch)
    return time.perf_counter() - started


def fill_inbox(url: str, topic: str, messages: int) -> float:
    """Store `messages` JSON rows in consumer_queue with the Consumer's own statement."""
    from outbox.core.batches import InboxBatch
    from outbox.core.lanes import lane_for
    from outbox.core.serializers import JSON
    from outbox.kafka.subscriber import InboxRow
    from outbox.postgres.inbox import insert_params
    from outbox.postgres.queries import channel, queries

    sql = queries("outbox")["inbox_insert"]
    wake = channel("outbox", "consumer_queue")
    created = datetime.now(UTC)
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for first in range(0, messages, TX_ROWS):
            rows = []
            for i in range(first, min(messages, first + TX_ROWS)):
                key = f"key-{i % KEYS}".encode()
                message_id = uuid.uuid4()
                rows.append(
                    InboxRow(
                        message_id=message_id,
                        topic=topic,
                        key=key,
                        payload=json.dumps({"n": i, "note": "x" * 60}).encode(),
                        headers={},
                        content_type=JSON,
                        lane=lane_for(key, message_id),
                        created_at=created,
                        partition=i % 3,
                        offset=i // 3,
                    )
                )
            with conn.transaction():
                conn.execute(sql, insert_params(InboxBatch.of(rows), wake))
    return time.perf_counter() - started


def produce_direct(bootstrap: str, topic: str, messages: int, size: int) -> float:
    """Produce `messages` records with outbox headers straight to Kafka; returns seconds."""
    from confluent_kafka import Producer

    from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID
    from outbox.core.serializers import BYTES

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "batch.size": 1048576,
            "queue.buffering.max.messages": 1000000,
            "queue.buffering.max.kbytes": 1048576,
            "partitioner": "murmur2_random",
        }
    )
    errors: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    payload = b"x" * size
    created = datetime.now(UTC).isoformat()
    started = time.perf_counter()
    for i in range(messages):
        headers = [
            (MESSAGE_ID, str(uuid.uuid4()).encode()),
            (CREATED_AT, created.encode()),
            (CONTENT_TYPE, BYTES.encode()),
        ]
        while True:
            try:
                producer.produce(
                    topic, payload, key=f"key-{i % KEYS}", headers=headers, on_delivery=report
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise RuntimeError(
            f"producing the input failed: {remaining} undelivered, {len(errors)} errors "
            f"(first: {errors[:1]})"
        )
    return time.perf_counter() - started


# -- (b) relay -----------------------------------------------------------------------------------


def relay(ctx: Context) -> list[Result]:
    messages = ctx.scale(200_000, 10_000)
    results = []
    for label, size in PAYLOADS:
        floor = _relay_floor(ctx, messages, size)
        for producers in (1,) if ctx.quick else PRODUCERS:
            results.append(_relay_run(ctx, messages, label, size, producers, floor))
    if not ctx.quick:
        # The scale: a backlog of a million (what an outage of Kafka leaves behind).
        big = ctx.scale(1_000_000, 20_000)
        floor = _relay_floor(ctx, big, 100)
        results.append(_relay_run(ctx, big, "100 B", 100, 1, floor))
    return results


def _backlog(ctx: Context, messages: int, size: int) -> tuple[str, str]:
    """A fresh database whose producer_queue holds `messages` rows for a fresh topic."""
    url = ctx.new_database()
    topic = ctx.new_topic("relay", partitions=3)
    send_backlog(url, topic, messages, b"x" * size)
    vacuum_analyze(url, "outbox.producer_queue")
    return url, topic


def _relay_floor(ctx: Context, messages: int, size: int) -> float:
    """msg/s of the bare relay loop over the same backlog."""
    url, topic = _backlog(ctx, messages, size)
    return relay_floor(url, ctx.bootstrap, topic)


def _relay_run(
    ctx: Context, messages: int, label: str, size: int, producers: int, floor: float
) -> Result:
    url, _topic = _backlog(ctx, messages, size)
    min_id = "SELECT min(id) FROM outbox.producer_queue"  # the primary key: cheap to poll
    daemons: list[Daemon] = []
    with psycopg.connect(url, autocommit=True) as conn:
        first = scalar(conn, min_id)
        started = time.perf_counter()
        try:
            for _ in range(producers):
                daemons.append(Daemon(*producer_args(url, ctx.bootstrap)))
            timeout = timeout_for(messages)
            startup = wait_for(
                lambda: scalar(conn, min_id) != first,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="the first relayed batch",
            )
            seconds = wait_for(
                lambda: scalar(conn, min_id) is None,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="draining producer_queue",
            )
        finally:
            stop_all(daemons)
    plural = "s" if producers > 1 else ""
    # The measure: from the first delete (the first batch done) to empty.
    after_first = messages / (seconds - startup) if seconds > startup else math.nan
    return Result(
        RELAY,
        f"{label}, {producers} producer{plural}",
        against_floor(
            {
                "messages": messages,
                "msg/s": messages / seconds,
                "msg/s after 1st": after_first,
                "payload MB/s": messages * size / seconds / 1e6,
                "seconds": seconds,
                "startup s": startup,
            },
            after_first,
            floor,
        ),
        notes="figure: msg/s after 1st; floor: select 1,000 in id order, produce, flush, "
        "delete, over the same backlog",
    )


# -- (c) inbox -----------------------------------------------------------------------------------


def inbox(ctx: Context) -> list[Result]:
    messages = ctx.scale(200_000, 20_000)
    url = ctx.new_database()
    topic = ctx.new_topic("inbox", partitions=3)
    produce_s = produce_direct(ctx.bootstrap, topic, messages, 100)
    # The bare consumer loop first, over the same records (a group of its own).
    floor, _ = inbox_floor(ctx.new_database(migrated=False), ctx.bootstrap, topic, messages)
    group = f"bench-inbox-{uuid.uuid4().hex[:8]}"
    max_id = "SELECT max(id) FROM outbox.consumer_queue"
    count = "SELECT count(*) FROM outbox.consumer_queue"

    def all_stored() -> bool:
        top = scalar(conn, max_id)
        return top is not None and top >= messages and scalar(conn, count) >= messages

    daemons: list[Daemon] = []
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        try:
            daemons.append(Daemon(*consumer_args(url, ctx.bootstrap, topic, group)))
            timeout = timeout_for(messages)
            startup = wait_for(
                lambda: scalar(conn, max_id) is not None,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="the first stored batch",
            )
            first_rows = scalar(conn, count)
            seconds = wait_for(
                all_stored,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="storing every message",
            )
        finally:
            stop_all(daemons)
        stored = scalar(conn, count)
    notes = [f"input produced in {produce_s:.1f}s"]
    if stored != messages:
        notes.append(f"consumer_queue holds {stored} rows, expected {messages}")
    steady = seconds - startup
    rate = (messages - first_rows) / steady if steady > 0 else float("nan")
    notes.append("floor: poll 1,000, one INSERT into a bare table, commit, commit offsets")
    return [
        Result(
            INBOX,
            "100 B, 1 consumer, batch 1000",
            against_floor(
                {"messages": messages, "msg/s": rate, "seconds": seconds, "startup s": startup},
                rate,
                floor,
            ),
            notes="; ".join(notes),
        )
    ]


# -- (d) handler ---------------------------------------------------------------------------------


def handler(ctx: Context) -> list[Result]:
    from benchmarks.bench_handlers import DEFAULT_TOPIC, EFFECTS_TABLE

    messages = ctx.scale(100_000, 3_000)

    def filled() -> str:
        url = ctx.new_database()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(EFFECTS_TABLE)
        fill_inbox(url, DEFAULT_TOPIC, messages)
        vacuum_analyze(url, "outbox.consumer_queue")
        return url

    floors = {batch: handler_floor(filled(), batch=batch) for batch in (False, True)}
    results = []
    for variant in HANDLER_VARIANTS:
        for concurrency in (1,) if ctx.quick else CONCURRENCY:
            result = _handler_run(filled(), messages, concurrency, DEFAULT_TOPIC, variant)
            batch = variant == "batch"
            figure = result.metrics["msg/s after 1st"]
            result.metrics = against_floor(result.metrics, figure, floors[batch])
            floor_note = (
                "figure: msg/s after 1st; floor: select 500 in id order, one INSERT per message"
                + (" (executemany)" if batch else "")
                + ", delete, commit"
            )
            result.notes = "; ".join(n for n in (result.notes, floor_note) if n)
            results.append(result)
    return results


def _handler_run(
    url: str, messages: int, concurrency: int, topic: str, variant: str = "plain"
) -> Result:
    effects = "SELECT max(id) FROM effects"
    pending = "SELECT count(*) FROM outbox.consumer_queue WHERE processed_at IS NULL"

    def all_processed() -> bool:
        top = scalar(conn, effects)
        return top is not None and top >= messages and scalar(conn, pending) == 0

    daemons: list[Daemon] = []
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        try:
            daemons.append(
                Daemon(
                    *handler_args(
                        url,
                        concurrency,
                        target=HANDLER_VARIANTS[variant][0],
                    ),
                    env=handler_env(topic),
                ),
            )
            timeout = timeout_for(messages)
            startup = wait_for(
                lambda: scalar(conn, effects) is not None,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="the first handled message",
            )
            seconds = wait_for(
                all_processed,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what="handling every message",
            )
        finally:
            stop_all(daemons)
        done = scalar(conn, "SELECT count(*) FROM effects")
        dead = scalar(conn, "SELECT count(*) FROM outbox.consumer_queue WHERE dead_at IS NOT NULL")
    notes = []
    if done != messages:
        notes.append(f"effects holds {done} rows, expected {messages}")
    if dead:
        notes.append(f"{dead} dead rows")
    return Result(
        HANDLER,
        f"concurrency {concurrency}, batch 500{HANDLER_VARIANTS[variant][1]}",
        {
            "messages": messages,
            "msg/s": messages / seconds,
            # From the first committed callback to the last, as the floor is measured.
            "msg/s after 1st": messages / (seconds - startup) if seconds > startup else math.nan,
            "seconds": seconds,
            "startup s": startup,
        },
        notes="; ".join(notes),
    )
