"""(transports) Kafka and the log kept in PostgreSQL side by side, in one run, on the same servers.

    python -m benchmarks --only transports
    python -m benchmarks.transports [--rate 1000] [--senders 4] [--seconds 10] [--rounds 1]

The second form measures only the log's commit -> handler latency, from several sender
processes, beside the log's bare round trip in the same run (`log_latency`, `log_floor`).

For each transport, with the daemons as real processes (as production runs them), each row
beside its floor measured in the same run (`figure`, `floor`, `ratio`, as `benchmarks/floors.py`
defines them; one row per transport):

- relay throughput: a backlog of 100 B messages (1,000 keys) in producer_queue, drained by one
  `outbox producer`; the figure from the first delete seen until producer_queue is empty
  ("msg/s from start": from process start). Floor: the bare relay loop over a backlog as big
  (select 1,000 in id order, send, delete): Kafka `floors.relay_floor`, the log
  `floors.log_relay_floor` (`PgLogPublisher.publish` of each batch), from its first delete.
- inbox throughput: records with outbox's headers already on the topic (Kafka: produced with
  librdkafka in big batches; the log: `PgLogPublisher`, batches of 1,000), stored by one
  `outbox consumer --batch-size 1000`; the rate from the first stored row to the last. Floor:
  the bare consumer loop over the same records in a new group (poll 1,000, one INSERT into a
  bare table, commit, commit the position): Kafka `floors.inbox_floor`, the log
  `floors.log_inbox_floor`.
- transport write and read: the clients alone, no outbox table: Kafka produce() of the same
  records, and a plain consumer reading them; the log's `PgLogPublisher.publish` of batches of
  1,000 and one `PgLogSubscriber` member reading them with poll(1000) + commit. These are the
  figures the reference design publishes (writes/s, reads/s), and floors themselves: their rows
  show them as `floor`.
- end-to-end latency, sender commit -> handler callback start, at 100/s and 1,000/s (one
  message per transaction), through `outbox producer`, `outbox consumer` and `outbox handler`.
  Kafka runs on the Tansu broker, which answers a fetch only when fetch.wait.max.ms runs out:
  the consumer runs with fetch.wait.max.ms=1 and the producer with linger.ms=0, its best case
  (outbox's defaults are 25 and 5). The log's consumer waits on LISTEN/NOTIFY (0.2 s fallback).
  Floor: the transport's bare round trip at the same rate for half as long, right after:
  Kafka `latency.broker_floor` with the same settings, the log `log_floor` (one sender); the
  p50 row's ratio is floor p50 / p50, the p99 row's floor p99 / p99. Each latency row also has
  its hop budget (`latency.HOPS`: commit -> relayed -> stored -> claimed -> handled, beside the
  floor); relayed is the record's time on the transport (a Kafka record's CreateTime, a log
  record's `created_at`).

Topics have 3 partitions on both transports. Beside them, the reference design's published
figures (/work/shared/reference/postgres-log-design.md: 4 vCPU, readers polling, no NOTIFY).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import floors
from benchmarks.floors import against_floor
from benchmarks.harness import Context, Result, outgoing_records
from benchmarks.latency import (
    WARMUP,
    Reader,
    Stages,
    Variant,
    broker_floor,
    budget_floor,
    header_id,
    hop_budget,
    latency_result,
    log_record_times,
    outbox_daemon,
    send_paced,
    send_paced_by,
    stages_of,
    wait_arrivals,
)
from benchmarks.throughput import (
    KEYS,
    Daemon,
    produce_direct,
    scalar,
    send_backlog,
    stop_all,
    timeout_for,
    vacuum_analyze,
    wait_for,
)

SCENARIO = "transports: Kafka (Tansu) and the PostgreSQL log side by side"
DETAIL = "transports: end-to-end latency in detail"
TRANSPORTS = ("kafka", "postgres")
LABELS = {"kafka": "Kafka (Tansu)", "postgres": "PostgreSQL log", "reference": "reference design"}
PARTITIONS = 3
RATES = (100, 1000)
#: The reference design's published figures (4 vCPU; readers poll, no NOTIFY).
REFERENCE = {"write": 5_000.0, "read": 25_000.0, "p50": 8.8, "p99": 60.0}
#: Tansu joins a group in half of session.timeout.ms.
GROUP_TIMINGS = ("session.timeout.ms=2000", "heartbeat.interval.ms=500")
#: Kafka's best case for latency on Tansu (outbox's defaults: fetch.wait.max.ms=25, linger.ms=5).
KAFKA_CONSUMER_LATENCY = ("fetch.wait.max.ms=1",)
KAFKA_PRODUCER_LATENCY = ("linger.ms=0",)


class Endpoint:
    """Where one transport is: its topics, and the daemons' flags for it."""

    def __init__(self, ctx: Context, name: str) -> None:
        self.ctx = ctx
        self.name = name
        self.log_url = ""
        if name == "postgres":
            from outbox.pglog.log import upgrade

            self.log_url = ctx.new_database(migrated=False)
            upgrade(self.log_url)

    def topic(self, prefix: str) -> str:
        if self.name == "kafka":
            return self.ctx.new_topic(prefix, partitions=PARTITIONS)
        from outbox.pglog import PgLog

        name = f"bench.{prefix}.{uuid.uuid4().hex[:8]}"
        PgLog(self.log_url).create_topic(name, PARTITIONS)
        return name

    def flags(self, *kafka_config: str) -> list[str]:
        if self.name == "postgres":
            return ["--transport", "postgres", "--log-url", self.log_url]
        extra = [f"--kafka-config={setting}" for setting in kafka_config]
        return ["--kafka-bootstrap", self.ctx.bootstrap, *extra]

    def producer(self, url: str, *kafka_config: str) -> list[str]:
        return ["producer", "--database-url", url, *self.flags(*kafka_config)]

    def consumer(self, url: str, topic: str, group: str, *kafka_config: str) -> list[str]:
        flags = self.flags(*GROUP_TIMINGS, *kafka_config)
        return ["consumer", "--database-url", url, *flags, "--topic", topic, "--group", group]


# -- the messages -----------------------------------------------------------------------------


def log_write(url: str, topic: str, messages: int, size: int = 100) -> float:
    """Messages/s appended by one `PgLogPublisher`, batches of 1,000 (as the relay's)."""
    from outbox.pglog import PgLogPublisher

    payload = b"x" * size
    batches = [
        outgoing_records(topic, 1000, payload, lambda i: f"key-{i % KEYS}".encode())
        for _ in range(max(1, messages // 1000))
    ]
    publisher = PgLogPublisher(url)
    try:
        started = time.perf_counter()
        for batch in batches:
            if any(r is not None for r in publisher.publish(batch)):
                raise RuntimeError("log publish failed")
        return len(batches) * 1000 / (time.perf_counter() - started)
    finally:
        publisher.close()


def log_read(url: str, topic: str, expected: int) -> float:
    """Records/s read by one member of a new group, poll(1000) + commit (joining included)."""
    from outbox.pglog import PgLogSubscriber

    subscriber = PgLogSubscriber(url, [topic], f"reader-{uuid.uuid4().hex[:6]}")
    got = 0
    try:
        started = time.perf_counter()
        while got < expected:
            rows = subscriber.poll(1000, 1.0)
            if not rows:
                raise RuntimeError(f"log read stalled at {got} of {expected}")
            subscriber.commit(rows)
            got += len(rows)
        return got / (time.perf_counter() - started)
    finally:
        subscriber.close()


def kafka_read(bootstrap: str, topic: str, expected: int) -> float:
    """Records/s read by a plain consumer (partitions assigned, no group join), from the
    first record received to the last."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 1,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got = after_first = 0
        first: float | None = None
        deadline = time.monotonic() + timeout_for(expected)
        while got < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafka read stalled at {got} of {expected}")
            batch = [m for m in consumer.consume(1000, 0.5) if m.error() is None]
            if first is None:
                if batch:
                    first = time.perf_counter()  # the rate counts what came after it
            else:
                after_first += len(batch)
            got += len(batch)
        assert first is not None
        return after_first / (time.perf_counter() - first)
    finally:
        consumer.close()


def log_fill(url: str, topic: str, messages: int, size: int = 100) -> float:
    """Put `messages` records on the log (batches of 1,000); seconds it took."""
    started = time.perf_counter()
    log_write(url, topic, messages, size)
    return time.perf_counter() - started


# -- relay and inbox ---------------------------------------------------------------------------


def relay_rate(ctx: Context, endpoint: Endpoint, messages: int) -> tuple[float, float]:
    """(msg/s from process start until producer_queue is empty, msg/s from the first delete
    seen (polled every 2 ms) until then, as (b) and the bare relay loop count)."""
    url = ctx.new_database()
    topic = endpoint.topic("relay")
    send_backlog(url, topic, messages, b"x" * 100)
    vacuum_analyze(url, "outbox.producer_queue")
    min_id = "SELECT min(id) FROM outbox.producer_queue"
    count = "SELECT count(*) FROM outbox.producer_queue"
    daemons: list[Daemon] = []
    with psycopg.connect(url, autocommit=True) as conn:
        lowest = scalar(conn, min_id)
        started = time.perf_counter()
        try:
            daemons.append(Daemon(*endpoint.producer(url)))
            timeout = timeout_for(messages)
            first = wait_for(
                lambda: scalar(conn, min_id) != lowest,
                since=started,
                timeout=timeout,
                daemons=daemons,
                interval=0.002,
                what=f"the first delete from producer_queue ({endpoint.name})",
            )
            left = scalar(conn, count)
            seconds = wait_for(
                lambda: scalar(conn, min_id) is None,
                since=started,
                timeout=timeout,
                daemons=daemons,
                interval=0.002,
                what=f"draining producer_queue ({endpoint.name})",
            )
        finally:
            stop_all(daemons)
    steady = seconds - first
    return messages / seconds, left / steady if left and steady > 0 else float("nan")


def inbox_rate(
    ctx: Context, endpoint: Endpoint, messages: int, topic: str | None = None
) -> tuple[float, float]:
    """(stored/s by one consumer, write/s of the input as the transport's client alone); the
    input is put on `topic` (a new one by default)."""
    url = ctx.new_database()
    topic = topic or endpoint.topic("inbox")
    if endpoint.name == "kafka":
        produced = produce_direct(ctx.bootstrap, topic, messages, 100)
    else:
        produced = log_fill(endpoint.log_url, topic, messages)
    max_id = "SELECT max(id) FROM outbox.consumer_queue"
    count = "SELECT count(*) FROM outbox.consumer_queue"
    daemons: list[Daemon] = []
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        try:
            args = endpoint.consumer(url, topic, f"bench-{uuid.uuid4().hex[:8]}")
            daemons.append(Daemon(*args, "--batch-size", "1000"))
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
                lambda: scalar(conn, count) >= messages,
                since=started,
                timeout=timeout,
                daemons=daemons,
                what=f"storing every message ({endpoint.name})",
            )
        finally:
            stop_all(daemons)
    return (messages - first_rows) / (seconds - startup), messages / produced


# -- latency -----------------------------------------------------------------------------------


def latencies(
    ctx: Context,
    endpoint: Endpoint,
    seconds: float,
    rates: Sequence[int] = RATES,
    senders: int = 1,
) -> list[tuple[Result, Result]]:
    """Commit -> handler latency at each of `rates`, one send per transaction, from `senders`
    processes (each at rate / senders, interleaved; `send_paced_by`): each row with its hop
    budget (`latency.HOPS`)."""
    from benchmarks.latency_handlers import SCHEMA

    sender, receiver = ctx.new_database(), ctx.new_database()
    topic = endpoint.topic("latency")
    with psycopg.connect(receiver, autocommit=True) as conn:
        conn.execute(SCHEMA)
    group = f"bench-latency-{uuid.uuid4().hex[:8]}"
    daemons = [
        outbox_daemon("outbox producer", *endpoint.producer(sender, *KAFKA_PRODUCER_LATENCY)),
        outbox_daemon(
            "outbox consumer", *endpoint.consumer(receiver, topic, group, *KAFKA_CONSUMER_LATENCY)
        ),
        outbox_daemon(
            "outbox handler",
            "handler",
            "benchmarks.latency_handlers:handlers",
            "--database-url",
            receiver,
            env={"LATENCY_TOPIC": topic},
        ),
    ]
    how = (
        "consumer fetch.wait.max.ms=1, producer linger.ms=0 (Tansu answers a fetch only when "
        "fetch.wait.max.ms runs out)"
        if endpoint.name == "kafka"
        else "consumer on LISTEN/NOTIFY (0.2 s fallback)"
    )
    results: list[Result] = []
    measured: list[tuple[str, dict[str, float], Stages]] = []
    try:
        send_paced(sender, topic, 20, WARMUP)
        complete, _ = wait_arrivals(receiver, WARMUP, 90, daemons)
        if not complete:
            raise TimeoutError(
                "warm-up messages were not handled within 90 s:\n"
                + "\n".join(f"-- {d.name}:\n{d.output()}" for d in daemons)
            )
        total = WARMUP
        plural = "es" if senders > 1 else ""
        for rate in rates:
            count = int(rate * seconds) // senders * senders
            committed, elapsed = send_paced_by(sender, topic, rate, count, senders)
            total += count
            wait_arrivals(receiver, total, 60 + count / 100, daemons)
            stages = stages_of(receiver, list(committed))
            name = f"{LABELS[endpoint.name]}, {rate:,}/s" + (
                f", {senders} sender processes" if senders > 1 else ""
            )
            measured.append((name, committed, stages))
            results.append(
                latency_result(
                    name,
                    committed,
                    stages.handled,
                    {"target /s": rate, "achieved /s": count / elapsed},
                    f"one send per transaction from {senders} process{plural}, daemons as "
                    f"processes, handler 4 workers; {how}",
                    stage=("to inbox", stages.stored),
                    scenario=DETAIL,
                )
            )
    finally:
        for d in daemons:
            d.stop()
    budgets = [
        hop_budget(name, committed, relayed_times(ctx, endpoint, topic, committed, stages), stages)
        for name, committed, stages in measured
    ]
    return list(zip(results, budgets, strict=True))


def relayed_times(
    ctx: Context, endpoint: Endpoint, topic: str, committed: dict[str, float], stages: Stages
) -> dict[str, float]:
    """When each message reached the transport: a Kafka record's CreateTime (read back once the
    daemons stopped), a log record's `created_at`."""
    if endpoint.name == "postgres":
        return log_record_times(endpoint.log_url, topic, stages.positions)
    reader = Reader(ctx.bootstrap, topic, key_of=header_id)
    try:
        reader.wait_for(list(committed), 60)
    finally:
        reader.close()
    return reader.produced


def _log_sender(url: str, topic: str, rate: float, count: int, start_at: float, out: Any) -> None:
    """One process of `log_floor`: `count` records, one `publish` each, at `rate`/s."""
    from outbox.pglog import PgLogPublisher

    publisher = PgLogPublisher(url, partitions=PARTITIONS)
    sent: list[tuple[str, float]] = []
    try:
        for i in range(count):
            delay = start_at + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            record = outgoing_records(topic, 1, b"x" * 80, lambda _i: uuid.uuid4().bytes)
            if publisher.publish(record) != [None]:
                raise RuntimeError("the log floor's publish failed")
            sent.append((record[0].message_id, time.time()))
    finally:
        publisher.close()
    out.put(sent)


def log_floor(url: str, rate: int, seconds: float, senders: int) -> Result:
    """The log's bare round trip, the floor of its commit -> handler latency: `senders`
    processes each append one record per transaction (`PgLogPublisher.publish`) at
    rate / senders, interleaved, and one `PgLogSubscriber` member holding every partition
    polls (waiting on LISTEN/NOTIFY, as the Consumer does) and commits; latency = the record
    polled - its append committed. No outbox table, no daemon."""
    from outbox.pglog import PgLog, PgLogSubscriber

    topic = f"bench.floor.{uuid.uuid4().hex[:8]}"
    PgLog(url).create_topic(topic, PARTITIONS)
    subscriber = PgLogSubscriber(url, [topic], f"floor-{uuid.uuid4().hex[:6]}")
    count = int(rate * seconds) // senders * senders
    received: dict[str, float] = {}
    context = mp.get_context("fork")
    queue = context.Queue()
    procs: list[Any] = []
    try:
        deadline = time.monotonic() + 30
        while len(subscriber.partitions) < PARTITIONS and time.monotonic() < deadline:
            subscriber.poll(1000, 0.05)
        start_at = time.time() + 0.5 + 0.05 * senders
        procs = [
            context.Process(
                target=_log_sender,
                args=(url, topic, rate / senders, count // senders, start_at + k / rate, queue),
            )
            for k in range(senders)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + seconds + 60
        while len(received) < count and time.monotonic() < deadline:
            batch = subscriber.poll(1000, 0.2)
            now = time.time()
            for message_id in batch.message_ids:
                received[message_id] = now
            if batch:
                subscriber.commit(batch)
        committed: dict[str, float] = {}
        for _ in procs:
            committed.update(queue.get(timeout=60))
    finally:
        for p in procs:
            p.join(30)
        subscriber.close()
    plural = "es" if senders > 1 else ""
    return latency_result(
        f"PostgreSQL log floor, {rate:,}/s, {senders} sender process{plural}",
        committed,
        received,
        {"target /s": rate, "achieved /s": count / (max(committed.values()) - start_at)},
        "floor: PgLogPublisher.publish of one record per transaction -> one PgLogSubscriber "
        "member (LISTEN/NOTIFY), no outbox table or daemon",
        scenario=DETAIL,
    )


def log_latency(ctx: Context, rate: int, seconds: float, senders: int) -> list[Result]:
    """The log's commit -> handler latency at `rate` from `senders` processes, beside its floor
    measured right after it on the same servers (`figure` the p50, `floor` the floor's p50,
    `ratio` floor / figure)."""
    endpoint = Endpoint(ctx, "postgres")
    ((result, budget),) = latencies(ctx, endpoint, seconds, (rate,), senders)
    floor = log_floor(endpoint.log_url, rate, seconds, senders)
    result.metrics = against_floor(
        {**result.metrics, "floor p99 ms": floor.metrics["p99 ms"]},
        result.metrics["p50 ms"],
        floor.metrics["p50 ms"],
        lower_is_better=True,
    )
    budget_floor(budget, floor)
    return [result, floor, budget]


# -- the scenario ------------------------------------------------------------------------------


def relay_floor_rate(ctx: Context, endpoint: Endpoint, messages: int) -> float:
    """The bare relay loop over a backlog like `relay_rate`'s, on the same transport, msg/s from
    its first delete (`floors.relay_floor`, `floors.log_relay_floor`)."""
    url = ctx.new_database()
    topic = endpoint.topic("relay-floor")
    send_backlog(url, topic, messages, b"x" * 100)
    vacuum_analyze(url, "outbox.producer_queue")
    if endpoint.name == "kafka":
        return floors.relay_floor(url, ctx.bootstrap, topic)
    return floors.log_relay_floor(url, endpoint.log_url, topic)


def inbox_floor_rate(ctx: Context, endpoint: Endpoint, topic: str, messages: int) -> float:
    """The bare consumer loop over `topic` (the records `inbox_rate` stored), in a new group."""
    url = ctx.new_database()
    if endpoint.name == "kafka":
        rate, _ = floors.inbox_floor(url, ctx.bootstrap, topic, messages)
        return rate
    return floors.log_inbox_floor(url, endpoint.log_url, topic, messages)


def latency_floors(ctx: Context, endpoint: Endpoint, seconds: float) -> list[Result]:
    """The transport's bare round trip at each of RATES, one sender: Kafka's broker floor with
    the latency rows' settings (`latency.broker_floor`), the log's `log_floor`."""
    results = []
    for rate in RATES:
        if endpoint.name == "kafka":
            variant = Variant(
                "Kafka (Tansu)",
                producer_kafka=KAFKA_PRODUCER_LATENCY,
                consumer_kafka=KAFKA_CONSUMER_LATENCY,
            )
            floor = broker_floor(
                ctx.bootstrap, endpoint.topic("latency-floor"), rate, int(rate * seconds), variant
            )
            floor.scenario = DETAIL
        else:
            floor = log_floor(endpoint.log_url, rate, seconds, 1)
        results.append(floor)
    return results


def _row(
    measure: str, name: str, figure: float, floor: float, reference: float, notes: str
) -> Result:
    return Result(
        SCENARIO,
        f"{measure}: {LABELS[name]}",
        against_floor({LABELS["reference"]: reference}, figure, floor),
        notes=notes,
    )


def _floor_row(measure: str, name: str, floor: float, reference: float, notes: str) -> Result:
    """A row that is a floor itself (the transport's client alone)."""
    return Result(
        SCENARIO,
        f"{measure}: {LABELS[name]}",
        {LABELS["reference"]: reference, "floor": floor},
        notes=notes,
    )


RELAY_FLOORS = {
    "kafka": "floor: the bare relay loop (select 1,000 in id order, produce, flush, delete; "
    "idempotent producer) over a backlog as big, from its first delete",
    "postgres": "floor: the bare relay loop (select 1,000 in id order, PgLogPublisher.publish, "
    "delete) over a backlog as big, from its first delete",
}
INBOX_FLOORS = {
    "kafka": "floor: the bare consumer loop (poll 1,000, one INSERT, commit, commit offsets) "
    "over the same records",
    "postgres": "floor: one PgLogSubscriber member, poll(1000), one INSERT, commit, commit its "
    "position, over the same records",
}
LATENCY_FLOORS = {
    "kafka": "floor: produce() -> a plain consumer, same settings, no database",
    "postgres": "floor: PgLogPublisher.publish of one record per transaction -> one "
    "PgLogSubscriber member on LISTEN/NOTIFY",
}


def run(ctx: Context) -> list[Result]:
    backlog = ctx.scale(50_000, 3_000)
    raw = ctx.scale(100_000, 5_000)
    seconds = 1.0 if ctx.smoke else 15.0
    endpoints = {name: Endpoint(ctx, name) for name in TRANSPORTS}
    relay: dict[str, tuple[float, float, float]] = {}
    inbox: dict[str, tuple[float, float]] = {}
    write: dict[str, float] = {}
    read: dict[str, float] = {}
    detail: list[Result] = []
    budgets: list[Result] = []
    for name, endpoint in endpoints.items():
        print(f"   {name}: relay and its floor", file=sys.stderr, flush=True)
        relay[name] = (
            *relay_rate(ctx, endpoint, backlog),
            relay_floor_rate(ctx, endpoint, backlog),
        )
        print(f"   {name}: inbox and its floor", file=sys.stderr, flush=True)
        topic = endpoint.topic("inbox")
        stored, _ = inbox_rate(ctx, endpoint, backlog, topic)
        inbox[name] = (stored, inbox_floor_rate(ctx, endpoint, topic, backlog))
        print(f"   {name}: write and read", file=sys.stderr, flush=True)
        topic = endpoint.topic("raw")
        if name == "kafka":
            write[name] = raw / produce_direct(ctx.bootstrap, topic, raw, 100)
            read[name] = kafka_read(ctx.bootstrap, topic, raw)
        else:
            write[name] = log_write(endpoint.log_url, topic, raw)
            read[name] = log_read(endpoint.log_url, topic, raw)
        print(f"   {name}: latency and its floor", file=sys.stderr, flush=True)
        measured = latencies(ctx, endpoint, seconds)
        floor_rows = latency_floors(ctx, endpoint, seconds / 2)
        for (result, budget), floor in zip(measured, floor_rows, strict=True):
            budget_floor(budget, floor)
            budgets.append(budget)
            result.metrics = against_floor(
                {**result.metrics, "floor p99 ms": floor.metrics["p99 ms"]},
                result.metrics["p50 ms"],
                floor.metrics["p50 ms"],
                lower_is_better=True,
            )
            detail += [result, floor]
    rows: list[Result] = []
    for name in TRANSPORTS:
        from_start, after_first, bare = relay[name]
        row = _row(
            f"relay msg/s, backlog of {backlog:,} x 100 B, 1 `outbox producer`",
            name,
            after_first,
            bare,
            REFERENCE["write"],
            "figure from the first delete (msg/s from start: from process start until empty); "
            + RELAY_FLOORS[name]
            + "; reference: its writes/s",
        )
        row.metrics = {"msg/s from start": from_start, **row.metrics}
        rows.append(row)
    for name in TRANSPORTS:
        rows.append(
            _row(
                f"inbox msg/s, {backlog:,} records stored by 1 `outbox consumer`",
                name,
                *inbox[name],
                REFERENCE["read"],
                "batch 1000, from the first stored row; "
                + INBOX_FLOORS[name]
                + "; reference: its reads/s",
            )
        )
    for name, how in (
        ("kafka", "librdkafka produce(), linger.ms=20, batches up to 10,000"),
        ("postgres", "PgLogPublisher.publish, batches of 1,000, one transaction each"),
    ):
        rows.append(
            _floor_row(
                f"transport write msg/s, {raw:,} x 100 B, the client alone",
                name,
                write[name],
                REFERENCE["write"],
                f"a floor itself (no outbox table): {how}",
            )
        )
    for name, how in (
        ("kafka", "plain consumer, partitions assigned"),
        ("postgres", "one PgLogSubscriber member, poll(1000) + commit, decoding included"),
    ):
        rows.append(
            _floor_row(
                f"transport read msg/s, {raw:,} records, one reader",
                name,
                read[name],
                REFERENCE["read"],
                f"a floor itself (no inbox table): {how}",
            )
        )
    for rate in RATES:
        for quantile in ("p50", "p99"):
            for name in TRANSPORTS:
                result, floor = next(
                    (r, f)
                    for r, f in zip(detail[::2], detail[1::2], strict=True)
                    if r.variant == f"{LABELS[name]}, {rate:,}/s"
                )
                rows.append(
                    Result(
                        SCENARIO,
                        f"commit -> handler start at {rate:,}/s, {quantile} ms: {LABELS[name]}",
                        against_floor(
                            {LABELS["reference"]: REFERENCE[quantile]},
                            result.metrics[f"{quantile} ms"],
                            floor.metrics[f"{quantile} ms"],
                            lower_is_better=True,
                        ),
                        notes=(
                            "consumer fetch.wait.max.ms=1, producer linger.ms=0; "
                            if name == "kafka"
                            else "LISTEN/NOTIFY; "
                        )
                        + LATENCY_FLOORS[name]
                        + "; reference: end to end, readers polling",
                    )
                )
    return rows + detail + budgets


def main(argv: list[str] | None = None) -> int:
    """The PostgreSQL log's commit -> handler latency from several sender processes, beside the
    log's bare round trip measured in the same run (issue 26); `--rounds` repeats both."""
    from benchmarks.harness import machine, markdown, write_results
    from outbox.testing.servers import start_servers

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transports", description=main.__doc__
    )
    parser.add_argument("--rate", type=int, default=1000, help="messages per second in all")
    parser.add_argument("--senders", type=int, default=4, help="sender processes")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write <stamp>.json and .md here")
    args = parser.parse_args(argv)
    if args.senders < 1 or args.rate < args.senders or args.rounds < 1:
        parser.error("need --senders >= 1, --rate >= --senders and --rounds >= 1")
    results: list[Result] = []
    with start_servers(Path(tempfile.mkdtemp(prefix="outbox-log-latency-"))) as servers:
        ctx = Context(servers=servers, smoke=False, out_dir=args.out or Path("."))
        for _ in range(args.rounds):
            results += log_latency(ctx, args.rate, args.seconds, args.senders)
        info = machine(servers)
    print(markdown(results, info, False))
    if args.out is not None:
        for path in write_results(results, info, args.out, False, complete=False):
            print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
