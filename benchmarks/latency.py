"""(e) End-to-end latency: from the sender's commit to the start of the handler callback.

Two services, each with its own database, and the real daemons as separate processes: the
sender's `outbox producer`, and the receiver's `outbox consumer` and `outbox handler
benchmarks.latency_handlers:handlers`, all with their default settings (the consumer's group
timings are set so the local broker joins the group in 3 s). The callback records `time.time()`
at its start into `arrivals` in its own transaction; the sender records `time.time()` right
after each commit. Both clocks are this machine's, so latency = started - committed.

One sender sends one message per transaction at a target rate (100/s, then 1,000/s), then
several senders send as fast as they can (saturation: the latency then includes the queue
that builds up wherever the pipeline is slower than the senders). Each run waits until every
message it sent was handled before the next starts. "to inbox" columns split off the part up to
the consumer's insert into the inbox (`consumer_queue.received_at`, the start of that
transaction, on the same clock).

Last, the broker floor: the same rates from a bare confluent-kafka producer (outbox's producer
settings) to a plain consumer, with no database or daemon, to show what the broker and
librdkafka's fetch cycle alone cost on this machine.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.harness import Context, Result, percentiles
from outbox.kafka.subscriber import DEFAULTS as CONSUMER_DEFAULTS

SCENARIO = "e. end-to-end latency"
REPO = Path(__file__).resolve().parent.parent
RATES = (100, 1000)
SATURATION_WRITERS = 4
WARMUP = 10
#: The consumer's group timings: Tansu joins a group in half of session.timeout.ms.
CONSUMER_KAFKA = ("session.timeout.ms=6000", "heartbeat.interval.ms=1000")


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
    """Callback start times and inbox arrival times (`consumer_queue.received_at`) by id."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT a.message_id::text, a.started, extract(epoch FROM q.received_at) "
            "FROM arrivals a LEFT JOIN outbox.consumer_queue q ON q.message_id = a.message_id "
            "WHERE a.message_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    started = {r[0]: float(r[1]) for r in rows}
    received = {r[0]: float(r[2]) for r in rows if r[2] is not None}
    return started, received


def latency_result(
    variant: str,
    committed: dict[str, float],
    arrived: dict[str, float],
    metrics: dict[str, float],
    notes: str,
    *,
    stage: tuple[str, dict[str, float]] | None = None,
    scenario: str = SCENARIO,
) -> Result:
    """Latencies (ms) of the messages that arrived; the missing ones are counted in the notes.

    `stage` = (name, times by id) adds the p50 and p99 of the part up to that stage.
    """
    samples = [(arrived[m] - t) * 1000 for m, t in committed.items() if m in arrived]
    p = percentiles(samples)
    missing = len(committed) - len(samples)
    if missing:
        notes = f"{missing} of {len(committed)} messages not received in time; " + notes
    values = {
        **metrics,
        "messages": len(committed),
        "p50 ms": p["p50"],
        "p95 ms": p["p95"],
        "p99 ms": p["p99"],
        "max ms": p["max"],
    }
    if stage is not None:
        name, times = stage
        part = percentiles([(times[m] - t) * 1000 for m, t in committed.items() if m in times])
        values[f"p50 ms {name}"] = part["p50"]
        values[f"p99 ms {name}"] = part["p99"]
    return Result(scenario, variant, values, notes=notes, samples=samples)


class Reader:
    """A plain confluent-kafka consumer in a thread: partitions assigned (no group join), from
    the start, with the fetch wait outbox's consumer uses (`fetch.wait.max.ms`).

    Records, by the "id" field of each JSON value, when it was received and the record's
    CreateTime (set by the producing client when it called produce(); millisecond resolution).
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"reader-{topic}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": CONSUMER_DEFAULTS["fetch.wait.max.ms"],
            }
        )
        metadata = self._consumer.list_topics(topic, timeout=10)
        self._consumer.assign(
            [TopicPartition(topic, p, 0) for p in metadata.topics[topic].partitions]
        )
        self.received: dict[str, float] = {}
        self.produced: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import TIMESTAMP_CREATE_TIME

        try:
            while not self._stop.is_set():
                batch = self._consumer.consume(1000, 0.05)
                now = time.time()
                for m in batch:
                    if m.error() is not None:
                        continue
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        key = str(json.loads(m.value())["id"])
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


def broker_floor(bootstrap: str, topic: str, rate: float, count: int) -> Result:
    """No database: a producer with outbox's settings -> the plain Reader, at `rate`/s."""
    from confluent_kafka import Producer

    from outbox.kafka.publisher import producer_config

    reader = Reader(bootstrap, topic)
    producer = Producer(producer_config(bootstrap))
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
        f"broker floor at {rate:,}/s: produce() -> plain consumer",
        sent,
        reader.received,
        {"writers": 1, "target /s": rate, "achieved /s": count / elapsed},
        "no database or daemon: a confluent-kafka producer with outbox's producer settings "
        "(linger.ms=5, idempotent) and the plain consumer below, through the same broker; "
        "time from produce() to receipt, the part of every other row that the broker and "
        "librdkafka's fetch account for",
    )


def run(ctx: Context) -> list[Result]:
    seconds = 2.0 if ctx.smoke else 20.0
    sender_url = ctx.new_database()
    receiver_url = ctx.new_database()
    topic = ctx.new_topic("latency")
    with psycopg.connect(receiver_url, autocommit=True) as conn:
        from benchmarks.latency_handlers import SCHEMA

        conn.execute(SCHEMA)
    group = f"bench-latency-{topic.rsplit('.', 1)[-1]}"
    kafka_config = [f"--kafka-config={setting}" for setting in CONSUMER_KAFKA]
    daemons = [
        outbox_daemon(
            "outbox producer",
            "producer",
            "--database-url",
            sender_url,
            "--kafka-bootstrap",
            ctx.bootstrap,
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
            *kafka_config,
        ),
        outbox_daemon(
            "outbox handler",
            "handler",
            "benchmarks.latency_handlers:handlers",
            "--database-url",
            receiver_url,
            env={"LATENCY_TOPIC": topic},
        ),
    ]
    results: list[Result] = []
    common = (
        "producer, consumer and handler (4 workers) as separate processes with default "
        "settings; callback start - sender commit; 'to inbox' = sender commit -> start of the "
        "consumer's insert transaction"
    )
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
        for rate in RATES:
            count = int(rate * seconds)
            committed, elapsed = send_paced(sender_url, topic, rate, count)
            total += count
            wait_arrivals(receiver_url, total, 60 + count / 100, daemons)
            started, received = arrivals_of(receiver_url, list(committed))
            results.append(
                latency_result(
                    f"{rate:,}/s, 1 sender",
                    committed,
                    started,
                    {"writers": 1, "target /s": rate, "achieved /s": count / elapsed},
                    f"one send per transaction; {common}",
                    stage=("to inbox", received),
                )
            )
        committed = send_flood(sender_url, topic, SATURATION_WRITERS, seconds)
        total += len(committed)
        wait_arrivals(receiver_url, total, 60 + len(committed) / 100, daemons)
        started, received = arrivals_of(receiver_url, list(committed))
        results.append(
            latency_result(
                f"saturation, {SATURATION_WRITERS} senders",
                committed,
                started,
                {
                    "writers": SATURATION_WRITERS,
                    "target /s": float("nan"),
                    "achieved /s": len(committed) / seconds,
                },
                f"{SATURATION_WRITERS} sender processes as fast as they can, one send per "
                f"transaction; includes the queueing wherever the pipeline is slower than the "
                f"senders; {common}",
                stage=("to inbox", received),
            )
        )
    finally:
        for d in daemons:
            d.stop()
    # The same rates through the broker alone, after the daemons stopped.
    for rate in RATES:
        results.append(
            broker_floor(ctx.bootstrap, ctx.new_topic("floor"), rate, int(rate * seconds))
        )
    return results
