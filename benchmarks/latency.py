"""(e) End-to-end latency: from the sender's commit to the start of the handler callback.

Two services, each with its own database, and the real daemons as separate processes: the
sender's `outbox producer`, and the receiver's `outbox consumer` and `outbox handler
benchmarks.latency_handlers:handlers` (the consumer's group timings are set so the local broker
joins the group in 3 s). The callback records `time.time()` at its start into `arrivals` in its
own transaction; the sender records `time.time()` right after each commit. Every clock is this
machine's, so latency = started - committed.

Each variant of the daemons' settings (`VARIANTS`: outbox's defaults, and the low-latency
settings) runs its own daemons: one sender sends one message per transaction at each target
rate (`RATES`), then, for the defaults, several senders send as fast as they can (saturation:
the latency then includes the queue that builds up wherever the pipeline is slower than the
senders). Each rate waits until every message it sent was handled before the next starts.

The stages of a message, each measured from the sender's commit:

- "to Kafka": the record's CreateTime, which librdkafka stamps when the relay calls produce()
  (read back from the topic once the daemons stopped; 1 ms resolution, truncated, so about
  0.5 ms early on average);
- "to inbox": the message's `received_at`, the start of the consumer's insert (the callback
  records it: handled rows leave `consumer_queue`);
- the total: the callback's start.

Each row also gets a hop budget (`HOPS`, its own table): commit -> relayed (the record's
CreateTime) -> stored (`received_at`) -> claimed (the start of the handler's transaction, whose
first statement is the claim) -> handled (the callback's start), each hop's p50 and p99, beside
the same run's floor, so a change shows the hop it acted on. The variant "low latency (outbox
run)" runs the low-latency settings as one `outbox run` process on one database (sender and
receiver alike) instead of three processes; its floor is that of "low latency".

Last, the broker floor of each variant: the same rates from a bare confluent-kafka producer with
that variant's producer settings to a plain consumer with its consumer's `fetch.wait.max.ms`, no
database or daemon: what the broker and librdkafka alone cost on this machine with the same
settings. Outbox's own share is a variant's total less its floor. Each row at a target rate
shows its p50 as `figure`, the floor's p50 at that rate as `floor` and `ratio` = floor / figure
(the p99s are beside them: `floor p99 ms`). A quick run (`--quick`) measures the low-latency
settings, three processes and `outbox run`, at 500/s and 1,000/s for 5 s each.

`python -m benchmarks.latency --help` runs a part of it (some rates, variants, shorter) for
measurements while working on the daemons.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.floors import against_floor
from benchmarks.harness import Context, Result, percentiles
from outbox.kafka.subscriber import DEFAULTS as CONSUMER_DEFAULTS

SCENARIO = "e. end-to-end latency"
REPO = Path(__file__).resolve().parent.parent
RATES = (100, 500, 1000)
#: A quick run's rates (and variant, below): the issue's targets.
QUICK_RATES = (500, 1000)
SATURATION_WRITERS = 4
WARMUP = 10
#: The consumer's group timings: Tansu joins a group in half of session.timeout.ms.
CONSUMER_KAFKA = ("session.timeout.ms=6000", "heartbeat.interval.ms=1000")


@dataclass(frozen=True)
class Variant:
    """One set of daemon settings: librdkafka settings and flags per daemon."""

    name: str
    producer_kafka: tuple[str, ...] = ()
    consumer_kafka: tuple[str, ...] = ()
    producer_flags: tuple[str, ...] = ()
    consumer_flags: tuple[str, ...] = ()
    handler_flags: tuple[str, ...] = ()
    #: Whether this variant also runs the saturation row.
    saturation: bool = False
    #: One `outbox run` process on one database (sender and receiver alike) instead of
    #: three processes; the producer's and the consumer's librdkafka settings both reach it.
    single: bool = False

    def describe(self) -> str:
        parts = [
            *(f"producer {s}" for s in (*self.producer_kafka, *self.producer_flags)),
            *(f"consumer {s}" for s in (*self.consumer_kafka, *self.consumer_flags)),
            *(f"handler {s}" for s in self.handler_flags),
        ]
        described = ", ".join(parts) or "outbox's defaults"
        return f"one `outbox run`; {described}" if self.single else described


#: The daemons' settings compared: outbox's defaults (chosen for a real Kafka cluster), and
#: the settings docs/performance.md names for low latency (two consumer waits).
VARIANTS = (
    Variant("defaults", saturation=True),
    Variant(
        "low latency",
        producer_kafka=("linger.ms=0",),
        consumer_kafka=("fetch.wait.max.ms=1",),
    ),
    # On a broker that answers a fetch only at fetch.wait.max.ms (Tansu), 1 ms falls behind
    # from about 500/s; 5 ms kept up at 1,000/s in a bare check.
    Variant(
        "low latency 5 ms",
        producer_kafka=("linger.ms=0",),
        consumer_kafka=("fetch.wait.max.ms=5",),
    ),
    # The low-latency settings under `outbox run` (one process, one database).
    Variant(
        "low latency (outbox run)",
        producer_kafka=("linger.ms=0",),
        consumer_kafka=("fetch.wait.max.ms=1",),
        single=True,
    ),
)


def _settings(pairs: Sequence[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pairs)


class Daemon:
    """A process started from the repository root; its output goes to a temporary file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self, limit: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:]

    def check(self) -> None:
        """Raise, with the end of its output, if the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with {code}:\n{self.output()}")

    def wait_for_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output(limit=1_000_000):
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not print {text!r}:\n{self.output()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 30) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def outbox_daemon(name: str, *args: str, env: dict[str, str] | None = None) -> Daemon:
    """`python -m outbox.cli ARGS` as a separate process."""
    return Daemon(name, ["-m", "outbox.cli", *args], env=env)


def _payload(i: int) -> dict[str, Any]:
    return {"i": i, "note": "x" * 60}


def send_paced(url: str, topic: str, rate: float, count: int) -> tuple[dict[str, float], float]:
    """Send `count` messages, one per transaction, at `rate`/s; returns commit times and seconds.

    The schedule is absolute: a sender that falls behind sends at once until it catches up.
    """
    from outbox import Broker

    broker = Broker()
    committed: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        start = time.perf_counter() + 0.01
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            with conn.transaction():
                message_id = broker.send(conn, topic, _payload(i), key=f"order-{i}")
            committed[str(message_id)] = time.time()
        elapsed = time.perf_counter() - start
    return committed, elapsed


def _paced_sender(url: str, topic: str, rate: float, count: int, start_at: float, out: Any) -> None:
    """One process of `send_paced_by`: `count` sends at `rate`/s from `start_at` (epoch s)."""
    from outbox import Broker

    broker = Broker()
    sent: list[tuple[str, float]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        for i in range(count):
            delay = start_at + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            with conn.transaction():
                message_id = broker.send(conn, topic, _payload(i), key=f"order-{os.getpid()}-{i}")
            sent.append((str(message_id), time.time()))
    out.put(sent)


def send_paced_by(
    url: str, topic: str, rate: float, count: int, senders: int
) -> tuple[dict[str, float], float]:
    """`send_paced` from `senders` processes: each sends `count / senders` messages, one per
    transaction, at `rate / senders` per second, their schedules interleaved so that the
    commits come at `rate` in all; returns commit times and seconds."""
    if senders <= 1:
        return send_paced(url, topic, rate, count)
    context = mp.get_context("fork")
    queue = context.Queue()
    start_at = time.time() + 0.5 + 0.05 * senders
    each = count // senders
    procs = [
        context.Process(
            target=_paced_sender,
            args=(url, topic, rate / senders, each, start_at + k / rate, queue),
        )
        for k in range(senders)
    ]
    for p in procs:
        p.start()
    committed: dict[str, float] = {}
    for _ in procs:
        committed.update(queue.get(timeout=each * senders / rate + 60))
    for p in procs:
        p.join(30)
    return committed, max(committed.values()) - start_at


def _flood_writer(url: str, topic: str, seconds: float, start_at: float, out: Any) -> None:
    from outbox import Broker

    broker = Broker()
    sent: list[tuple[str, float]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        i = 0
        while time.time() < end:
            with conn.transaction():
                message_id = broker.send(conn, topic, _payload(i), key=f"order-{os.getpid()}-{i}")
            sent.append((str(message_id), time.time()))
            i += 1
    out.put(sent)


def send_flood(url: str, topic: str, writers: int, seconds: float) -> dict[str, float]:
    """`writers` processes each send one message per transaction as fast as they can."""
    context = mp.get_context("fork")
    queue = context.Queue()
    start_at = time.time() + 0.5 + 0.05 * writers
    procs = [
        context.Process(target=_flood_writer, args=(url, topic, seconds, start_at, queue))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    committed: dict[str, float] = {}
    for _ in procs:
        committed.update(queue.get(timeout=seconds + 60))
    for p in procs:
        p.join(30)
    return committed


def _count(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM arrivals").fetchone()
    return int(row[0]) if row else 0


def wait_arrivals(
    url: str, expected_total: int, timeout: float, daemons: list[Daemon]
) -> tuple[bool, float]:
    """Wait until `arrivals` holds `expected_total` rows; returns (complete, seconds waited)."""
    start = time.monotonic()
    while _count(url) < expected_total:
        for d in daemons:
            d.check()
        if time.monotonic() - start > timeout:
            return False, time.monotonic() - start
        time.sleep(0.25)
    return True, time.monotonic() - start


def arrivals_of(url: str, ids: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Callback start times and inbox arrival times (the message's `received_at`, which the
    callback records) by id."""
    found = stages_of(url, ids)
    return found.handled, found.stored


@dataclass
class Stages:
    """When each message (by id) reached each hop the receiver sees, epoch seconds."""

    #: consumer_queue's `received_at`: the start of the consumer's insert transaction.
    stored: dict[str, float]
    #: The start of the handler's transaction, whose first statement claims the row.
    claimed: dict[str, float]
    #: The start of the callback.
    handled: dict[str, float]
    #: The record's (partition, offset) on the transport.
    positions: dict[str, tuple[int, int]]


def stages_of(url: str, ids: list[str]) -> Stages:
    """What `benchmarks.latency_handlers` recorded of the messages `ids`."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT message_id::text, started, received, claimed, source_partition, "
            "source_offset FROM arrivals WHERE message_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    return Stages(
        stored={r[0]: float(r[2]) for r in rows if r[2] is not None},
        claimed={r[0]: float(r[3]) for r in rows if r[3] is not None},
        handled={r[0]: float(r[1]) for r in rows},
        positions={r[0]: (int(r[4]), int(r[5])) for r in rows if r[4] is not None},
    )


def log_record_times(
    log_url: str, topic: str, positions: dict[str, tuple[int, int]], schema: str = "outbox_log"
) -> dict[str, float]:
    """The time each record was appended to the log kept in PostgreSQL (`log_records.created_at`:
    the start of the publisher's append transaction), by message id, from its position."""
    if not positions:
        return {}
    ids = list(positions)
    with psycopg.connect(log_url) as conn:
        rows = conn.execute(
            f"SELECT u.id, extract(epoch FROM r.created_at) "
            f"FROM unnest(%s::text[], %s::int[], %s::bigint[]) AS u(id, part, off) "
            f'JOIN "{schema}".log_topics t ON t.name = %s '
            f'JOIN "{schema}".log_partitions p ON p.topic_id = t.id AND p.partition = u.part '
            f'JOIN "{schema}".log_records r ON r.partition_id = p.id AND r.log_offset = u.off',
            (ids, [positions[i][0] for i in ids], [positions[i][1] for i in ids], topic),
        ).fetchall()
    return {r[0]: float(r[1]) for r in rows}


#: The scenario of the hop budgets: each latency row split at each hop.
HOPS = "latency per hop: commit -> relayed -> stored -> claimed -> handled"
HOPS_NOTE = (
    "ms per hop, each its own p50 and p99 over the messages (they do not add up to the "
    "total's). relayed: the record's time on the transport (Kafka: its CreateTime, stamped at "
    "produce(), 1 ms resolution, truncated; the log: log_records.created_at, the start of the "
    "append transaction); stored: consumer_queue.received_at (the start of the consumer's "
    "insert transaction); claimed: the start of the handler's transaction, whose first "
    "statement is the claim; handled: the callback's start"
)


def hop_budget(
    name: str,
    committed: dict[str, float],
    relayed: dict[str, float],
    stages: Stages,
    notes: str = "",
) -> Result:
    """A row of `HOPS`: p50 and p99 (ms) of each hop of the messages that reached every stage,
    and of the whole, commit -> handled."""
    points = [
        ("commit", committed),
        ("relayed", relayed),
        ("stored", stages.stored),
        ("claimed", stages.claimed),
        ("handled", stages.handled),
    ]
    complete = [m for m in committed if all(m in times for _, times in points)]
    values: dict[str, float] = {"messages": len(complete)}
    for (a, at), (b, bt) in itertools.pairwise(points):
        p = percentiles([(bt[m] - at[m]) * 1000 for m in complete])
        values[f"{a}->{b} p50"] = p["p50"]
        values[f"{a}->{b} p99"] = p["p99"]
    total = percentiles([(stages.handled[m] - committed[m]) * 1000 for m in complete])
    values["total p50"] = total["p50"]
    values["total p99"] = total["p99"]
    missing = len(committed) - len(complete)
    if missing:
        notes = f"{missing} of {len(committed)} messages lack a stage; " + notes
    return Result(HOPS, name, values, notes=notes)


def budget_floor(budget: Result, floor: Result) -> None:
    """Put the same-run floor's p50 and p99 beside a hop budget."""
    budget.metrics["floor p50"] = floor.metrics["p50 ms"]
    budget.metrics["floor p99"] = floor.metrics["p99 ms"]


def latency_result(
    variant: str,
    committed: dict[str, float],
    arrived: dict[str, float],
    metrics: dict[str, float],
    notes: str,
    *,
    stage: tuple[str, dict[str, float]] | None = None,
    stages: Sequence[tuple[str, dict[str, float]]] = (),
    scenario: str = SCENARIO,
) -> Result:
    """Latencies (ms) of the messages that arrived; the missing ones are counted in the notes.

    Each of `stages` (and `stage`) = (name, times by id) adds the p50 and p99 of the part up to
    that stage, before the total's.
    """
    samples = [(arrived[m] - t) * 1000 for m, t in committed.items() if m in arrived]
    p = percentiles(samples)
    missing = len(committed) - len(samples)
    if missing:
        notes = f"{missing} of {len(committed)} messages not received in time; " + notes
    parts = [*stages, *([stage] if stage is not None else [])]
    values: dict[str, float] = {**metrics, "messages": len(committed)}
    cuts = {
        name: percentiles([(times[m] - t) * 1000 for m, t in committed.items() if m in times])
        for name, times in parts
    }
    for name in cuts:
        values[f"p50 ms {name}"] = cuts[name]["p50"]
    values["p50 ms"] = p["p50"]
    for name in cuts:
        values[f"p99 ms {name}"] = cuts[name]["p99"]
    values.update({"p95 ms": p["p95"], "p99 ms": p["p99"], "max ms": p["max"]})
    return Result(scenario, variant, values, notes=notes, samples=samples)


def json_id(message: Any) -> str:
    """The "id" field of a record's JSON value (the floor's records)."""
    return str(json.loads(message.value())["id"])


def header_id(message: Any) -> str:
    """The outbox message id header of a record (the relay's records)."""
    from outbox.core.headers import MESSAGE_ID

    for name, value in message.headers() or ():
        if name == MESSAGE_ID:
            return bytes(value).decode()
    raise KeyError(MESSAGE_ID)


class Reader:
    """A plain confluent-kafka consumer in a thread: partitions assigned (no group join), from
    the start, with the fetch wait of outbox's consumer (`fetch.wait.max.ms`) unless told.

    Records, by `key_of(record)` (the "id" field of each JSON value by default), when it was
    received and the record's CreateTime (set by the producing client when it called produce();
    millisecond resolution). Like outbox's consumer it waits for one record, then takes what
    else is there without waiting: `consume(n, timeout)` would hold the first record until n
    arrived or the timeout ran out.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        fetch_wait_ms: int | str | None = None,
        key_of: Callable[[Any], str] = json_id,
    ) -> None:
        from confluent_kafka import Consumer, TopicPartition

        if fetch_wait_ms is None:
            fetch_wait_ms = CONSUMER_DEFAULTS["fetch.wait.max.ms"]
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{topic}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": int(fetch_wait_ms),
            }
        )
        metadata = self._consumer.list_topics(topic, timeout=10)
        self._consumer.assign(
            [TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions]
        )
        self._key_of = key_of
        self.received: dict[str, float] = {}
        self.produced: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import TIMESTAMP_CREATE_TIME

        try:
            while not self._stop.is_set():
                first = self._consumer.poll(0.05)
                if first is None:
                    continue
                now = time.time()
                for m in [first, *self._consumer.consume(1000, 0)]:
                    if m.error() is not None:
                        continue
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        key = self._key_of(m)
                        self.received[key] = now
                        kind, millis = m.timestamp()
                        if kind == TIMESTAMP_CREATE_TIME:
                            self.produced[key] = millis / 1000
        finally:
            self._consumer.close()

    def wait_for(self, ids: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(i not in self.received for i in ids):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def broker_floor(
    bootstrap: str, topic: str, rate: float, count: int, variant: Variant = VARIANTS[0]
) -> Result:
    """No database: a producer with the variant's settings -> a plain Reader with its consumer's
    fetch wait, at `rate`/s."""
    from confluent_kafka import Producer

    from outbox.kafka.publisher import producer_config
    from outbox.kafka.subscriber import consumer_config

    producer_settings = producer_config(bootstrap, _settings(variant.producer_kafka))
    fetch_wait = consumer_config(bootstrap, "floor", _settings(variant.consumer_kafka))[
        "fetch.wait.max.ms"
    ]
    reader = Reader(bootstrap, topic, fetch_wait_ms=fetch_wait)
    producer = Producer(producer_settings)
    try:

        def paced(n: int, prefix: str) -> tuple[dict[str, float], float]:
            sent: dict[str, float] = {}
            start = time.perf_counter() + 0.01
            for i in range(n):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                key = f"{prefix}{i}"
                producer.produce(topic, json.dumps({"id": key}).encode(), key=key.encode())
                sent[key] = time.time()
                producer.poll(0)
            producer.flush(30)
            return sent, time.perf_counter() - start

        warm, _ = paced(WARMUP, "warm-")
        if not reader.wait_for(list(warm), 60):
            raise TimeoutError(f"broker floor: warm-up records did not arrive on {topic}")
        sent, elapsed = paced(count, "")
        reader.wait_for(list(sent), 30)
    finally:
        producer.flush(10)
        reader.close()
    return latency_result(
        f"{variant.name}: broker floor, {rate:,}/s",
        sent,
        reader.received,
        {"target /s": rate, "achieved /s": count / elapsed},
        f"no database or daemon: produce() -> a plain consumer; linger.ms="
        f"{producer_settings['linger.ms']}, fetch.wait.max.ms={fetch_wait}",
    )


def _daemons(
    ctx: Context, variant: Variant, sender_url: str, receiver_url: str, topic: str
) -> list[Daemon]:
    group = f"bench-latency-{topic.rsplit('.', 1)[-1]}"
    producer_kafka = [f"--kafka-config={s}" for s in variant.producer_kafka]
    consumer_kafka = [f"--kafka-config={s}" for s in (*CONSUMER_KAFKA, *variant.consumer_kafka)]
    if variant.single:
        return [
            outbox_daemon(
                "outbox run",
                "run",
                "benchmarks.latency_handlers:handlers",
                "--database-url",
                receiver_url,
                "--kafka-bootstrap",
                ctx.bootstrap,
                *producer_kafka,
                *consumer_kafka,
                "--topic",
                topic,
                "--group",
                group,
                *variant.producer_flags,
                *variant.consumer_flags,
                *variant.handler_flags,
                env={"LATENCY_TOPIC": topic},
            )
        ]
    return [
        outbox_daemon(
            "outbox producer",
            "producer",
            "--database-url",
            sender_url,
            "--kafka-bootstrap",
            ctx.bootstrap,
            *producer_kafka,
            *variant.producer_flags,
        ),
        outbox_daemon(
            "outbox consumer",
            "consumer",
            "--database-url",
            receiver_url,
            "--kafka-bootstrap",
            ctx.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            *consumer_kafka,
            *variant.consumer_flags,
        ),
        outbox_daemon(
            "outbox handler",
            "handler",
            "benchmarks.latency_handlers:handlers",
            "--database-url",
            receiver_url,
            *variant.handler_flags,
            env={"LATENCY_TOPIC": topic},
        ),
    ]


def through_daemons(
    ctx: Context, variant: Variant, rates: Sequence[float], seconds: float
) -> list[Result]:
    """The variant's daemons at each of `rates`, then (if the variant says so) saturation."""
    from benchmarks.latency_handlers import SCHEMA

    receiver_url = ctx.new_database()
    sender_url = receiver_url if variant.single else ctx.new_database()
    topic = ctx.new_topic("latency")
    with psycopg.connect(receiver_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    daemons = _daemons(ctx, variant, sender_url, receiver_url, topic)
    #: (row name, commit times by id, metrics, what the receiver recorded)
    runs: list[tuple[str, dict[str, float], dict[str, float], Stages]] = []

    def measured(name: str, committed: dict[str, float], metrics: dict[str, float]) -> None:
        runs.append((name, committed, metrics, stages_of(receiver_url, list(committed))))

    try:
        # Warm-up: the consumer joins its group and every daemon has done its first round trip.
        send_paced(sender_url, topic, 20, WARMUP)
        complete, _ = wait_arrivals(receiver_url, WARMUP, 90, daemons)
        if not complete:
            raise TimeoutError(
                "warm-up messages were not handled within 90 s:\n"
                + "\n".join(f"-- {d.name}:\n{d.output()}" for d in daemons)
            )
        total = WARMUP
        for rate in rates:
            count = int(rate * seconds)
            committed, elapsed = send_paced(sender_url, topic, rate, count)
            total += count
            wait_arrivals(receiver_url, total, 60 + count / 100, daemons)
            metrics = {"target /s": rate, "achieved /s": count / elapsed}
            measured(f"{rate:,}/s, 1 sender", committed, metrics)
        if variant.saturation:
            committed = send_flood(sender_url, topic, SATURATION_WRITERS, seconds)
            total += len(committed)
            wait_arrivals(receiver_url, total, 60 + len(committed) / 100, daemons)
            metrics = {"target /s": float("nan"), "achieved /s": len(committed) / seconds}
            measured(f"saturation, {SATURATION_WRITERS} senders", committed, metrics)
    finally:
        for d in daemons:
            d.stop()
    # The records' CreateTimes, read back once the daemons stopped: on Tansu a second consumer
    # reading the topic meanwhile slowed every fetch of the daemons' consumer.
    reader = Reader(ctx.bootstrap, topic, key_of=header_id)
    try:
        reader.wait_for([m for _, committed, *_ in runs for m in committed], 60)
    finally:
        reader.close()
    rows = [
        latency_result(
            f"{variant.name}: {name}",
            committed,
            stages.handled,
            metrics,
            variant.describe(),
            stages=(("to Kafka", reader.produced), ("to inbox", stages.stored)),
        )
        for name, committed, metrics, stages in runs
    ]
    budgets = [
        hop_budget(f"{variant.name}: {name}", committed, reader.produced, stages)
        for name, committed, _, stages in runs
    ]
    for budget, (_, _, metrics, _) in zip(budgets, runs, strict=True):
        budget.metrics = {"target /s": metrics["target /s"], **budget.metrics}
    return rows + budgets


def run(
    ctx: Context,
    *,
    variants: Sequence[Variant] = VARIANTS,
    rates: Sequence[float] = RATES,
    seconds: float | None = None,
    floor: bool = True,
) -> list[Result]:
    if ctx.quick and variants is VARIANTS:
        variants = [
            v for v in VARIANTS if v.name.startswith("low latency") and "5 ms" not in v.name
        ]
    if ctx.quick and rates is RATES:
        rates = QUICK_RATES
    if ctx.smoke and rates is RATES:
        rates = QUICK_RATES[:1]  # every variant runs, at one rate: a check, not numbers
    if seconds is None:
        seconds = 1.5 if ctx.smoke else 5.0 if ctx.quick else 20.0
    results: list[Result] = []
    for variant in variants:
        results += through_daemons(ctx, variant, rates, seconds)
    # The same rates through the broker alone, with each variant's settings, once no daemon runs.
    if floor:
        floors = []
        for variant in variants:
            if variant.single:
                continue  # beside the floor of the same settings (`beside_floors`)
            for rate in rates:
                topic = ctx.new_topic("floor")
                floors.append(
                    broker_floor(ctx.bootstrap, topic, rate, int(rate * seconds / 2), variant)
                )
        beside_floors(results, floors)
        results += floors
    return results


def beside_floors(results: Sequence[Result], floors: Sequence[Result]) -> None:
    """Add to each row at a target rate its variant's floor at that rate: `figure` (its p50),
    `floor` (the floor's p50), `ratio` and `floor p99 ms`; to each hop budget its floor's p50
    and p99. An `outbox run` variant's floor is that of its settings' three-process variant."""
    by_name = {r.variant: r for r in floors}
    for r in results:
        name, _, rest = r.variant.partition(": ")
        name = name.removesuffix(" (outbox run)")
        rate = r.metrics.get("target /s", float("nan"))
        if rate != rate or not rest.endswith("1 sender"):
            continue
        f = by_name.get(f"{name}: broker floor, {rate:,}/s")
        if f is None:
            continue
        if r.scenario == HOPS:
            budget_floor(r, f)
            continue
        r.metrics = against_floor(
            {**r.metrics, "floor p99 ms": f.metrics["p99 ms"]},
            r.metrics["p50 ms"],
            f.metrics["p50 ms"],
            lower_is_better=True,
        )


def main(argv: list[str] | None = None) -> int:
    """A part of (e), for measurements while working on the daemons."""
    from benchmarks.harness import machine, markdown
    from outbox.testing.servers import start_servers

    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=main.__doc__)
    parser.add_argument("--rates", default=",".join(str(r) for r in RATES))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--variants",
        default=",".join(v.name for v in VARIANTS),
        help="comma-separated names of VARIANTS",
    )
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument("--no-saturation", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="run the daemons this many times")
    args = parser.parse_args(argv)
    chosen = [v for v in VARIANTS if v.name in args.variants.split(",")]
    if args.no_saturation:
        chosen = [Variant(**{**v.__dict__, "saturation": False}) for v in chosen]
    rates = [float(r) if "." in r else int(r) for r in args.rates.split(",")]
    base = Path(tempfile.mkdtemp(prefix="outbox-latency-"))
    with start_servers(base) as servers:
        ctx = Context(servers=servers, smoke=False, out_dir=base)
        results: list[Result] = []
        for _ in range(args.repeat):
            results += run(ctx, variants=chosen, rates=rates, seconds=args.seconds, floor=False)
        if not args.no_floor:
            floors = []
            for variant in chosen:
                if variant.single:
                    continue
                for rate in rates:
                    topic = ctx.new_topic("floor")
                    floors.append(
                        broker_floor(ctx.bootstrap, topic, rate, int(rate * args.seconds), variant)
                    )
            beside_floors(results, floors)
            results += floors
        print(markdown(results, machine(servers), False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
