"""(delayed) Messages due later (decision 21): what they cost the relay of the messages due now,
and how late the relay takes them.

`relay with due-later rows`: a backlog of 200,000 messages due now (100 B, 1,000 keys; a tenth
in `--quick`) drained by one `outbox producer`, in a database whose `producer_scheduled` is
empty (the floor) and in one holding 1,000,000 messages due in an hour (a tenth in `--quick`),
after an untimed warm-up drain in each, three rounds with the two in turn (the order
alternating), each figure the median of its rounds; "msg/s after 1st" as in (b), and the ratio figure / floor has the target >= 0.9. The
empty one also stands beside the bare relay loop over the same backlog, as (b) does.

`lateness at 1,000 due/s`: one `outbox producer` already running and idle; messages are written
ahead with `deliver_at` one millisecond apart (1,000 fall due each second, 10 s of them; 3 s
in `--quick`); lateness is the record's Kafka create time (set by the relay's client as it
produces) minus its due time, p50 and p99 (target p99 < 50 ms). Its floor is a bare loop over
a plain table of the same due times: select what is due (by the database's clock), produce,
flush, delete, sleep a millisecond when nothing is due.

`python -m benchmarks --quick --only delayed`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg

from benchmarks.floors import against_floor, relay_floor
from benchmarks.harness import Context, Result, percentiles
from benchmarks.throughput import (
    Daemon,
    producer_args,
    scalar,
    send_backlog,
    stop_all,
    timeout_for,
    vacuum_analyze,
    wait_for,
)

RELAY = "delayed. relay with due-later rows"
LATENESS = "delayed. lateness at 1,000 due/s"
RATE = 1000
#: Seconds between writing the due messages and the first due time.
LEAD = 3.0


def run(ctx: Context) -> list[Result]:
    return [*relay(ctx), lateness(ctx)]


# -- the relay beside a million messages due later --------------------------------------------


def _schedule_later(url: str, count: int) -> float:
    """`count` messages due in an hour in producer_scheduled, written in bulk (the rows
    `send(..., delay=)` writes); returns seconds."""
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for first in range(0, count, 100_000):
            n = min(100_000, count - first)
            conn.execute(
                "INSERT INTO outbox.producer_scheduled "
                "(message_id, topic, key, payload, content_type, lane, deliver_at) "
                "SELECT gen_random_uuid(), 'bench.later', convert_to('later-' || (i %% 1000), "
                "'UTF8'), '\\x7b7d', 'application/json', i %% 64, "
                "now() + interval '1 hour' + i * interval '1 ms' "
                "FROM generate_series(1, %s) AS i",
                (n,),
            )
            conn.commit()
    vacuum_analyze(url, "outbox.producer_scheduled")
    # The load's WAL written out now, not by a checkpoint during the first timed drain (its
    # round ran at a third of the others' rate without this).
    with (
        psycopg.connect(url, autocommit=True) as conn,
        contextlib.suppress(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def _drain(ctx: Context, url: str, topic: str, messages: int) -> tuple[float, float]:
    """One producer drains a fresh backlog of `messages` written to `url`'s producer_queue
    (beside whatever producer_scheduled holds): (msg/s after the first batch, seconds)."""
    send_backlog(url, topic, messages, b"x" * 100)
    vacuum_analyze(url, "outbox.producer_queue")
    min_id = "SELECT min(id) FROM outbox.producer_queue"
    with psycopg.connect(url, autocommit=True) as conn:
        first = scalar(conn, min_id)
        started = time.perf_counter()
        daemons = [Daemon(*producer_args(url, ctx.bootstrap))]
        try:
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
    return (messages / (seconds - startup) if seconds > startup else math.nan), seconds


def relay(ctx: Context) -> list[Result]:
    """Rounds of the two databases in turn (one empty producer_scheduled, one holding the rows
    due later; the order alternates): each figure is the median of its rounds, so that the
    load of a shared machine, which moves from one minute to the next, falls on both."""
    messages = ctx.scale(200_000, 5_000, quick=20_000)
    scheduled = ctx.scale(1_000_000, 10_000, quick=100_000)
    rounds = 1 if ctx.smoke else 3
    bare_url = ctx.new_database()
    bare_topic = ctx.new_topic("delayed-floor", partitions=3)
    send_backlog(bare_url, bare_topic, messages, b"x" * 100)
    vacuum_analyze(bare_url, "outbox.producer_queue")
    bare = relay_floor(bare_url, ctx.bootstrap, bare_topic)
    empty_url, later_url = ctx.new_database(), ctx.new_database()
    _schedule_later(later_url, scheduled)
    topic = ctx.new_topic("delayed", partitions=3)
    rates: dict[str, list[float]] = {empty_url: [], later_url: []}
    for url in (empty_url, later_url):  # untimed: each database's first relay start warms it
        _drain(ctx, url, topic, min(messages, 2_000))
    for n in range(rounds):
        for url in (empty_url, later_url) if n % 2 == 0 else (later_url, empty_url):
            rates[url].append(_drain(ctx, url, topic, messages)[0])
    with psycopg.connect(later_url) as conn:
        left = scalar(conn, "SELECT count(*) FROM outbox.producer_scheduled")
    if left != scheduled:
        raise RuntimeError(f"{scheduled - left} messages due in an hour were relayed")
    empty, later = statistics.median(rates[empty_url]), statistics.median(rates[later_url])
    per_round = ", ".join(
        f"{b / a:.2f}" for a, b in zip(rates[empty_url], rates[later_url], strict=True)
    )
    common = {"messages": messages, "rounds": rounds}
    return [
        Result(
            RELAY,
            "producer_scheduled empty",
            against_floor({**common, "scheduled": 0}, empty, bare),
            notes="figure: median msg/s after 1st; floor: the bare relay loop over the same "
            "backlog",
        ),
        Result(
            RELAY,
            f"{scheduled:,} due in an hour",
            against_floor({**common, "scheduled": scheduled}, later, empty),
            notes="figure: median msg/s after 1st; floor: the same relay with "
            f"producer_scheduled empty (row above), rounds in turn; ratio per round {per_round}; "
            "target ratio >= 0.9",
        ),
    ]


# -- lateness --------------------------------------------------------------------------------


def _due_times(conn: psycopg.Connection[Any], count: int) -> list[datetime]:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    start: datetime = row[0] + timedelta(seconds=LEAD)
    return [start + timedelta(seconds=i / RATE) for i in range(count)]


def _created_times(ctx: Context, topic: str, count: int, timeout: float) -> dict[str, float]:
    """message id (the record's value) -> the record's create time (seconds since the epoch)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": ctx.bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    meta = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions])
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < count and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is None:
                    seen[_id_of(m)] = m.timestamp()[1] / 1000
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {m.error()}")
    finally:
        consumer.close()
    return seen


def _id_of(message: Any) -> str:
    for name, value in message.headers() or []:
        if name == "outbox-message-id":
            return bytes(value).decode()
    return bytes(message.value()).decode()  # the bare loop's records: the id is the value


def _late_ms(due: dict[str, datetime], created: dict[str, float]) -> list[float]:
    missing = set(due) - set(created)
    if missing:
        raise RuntimeError(f"{len(missing)} due messages never reached the topic")
    return [(created[m] - due[m].timestamp()) * 1000 for m in due]


def _outbox_lateness(ctx: Context, count: int) -> list[float]:
    from outbox import Broker, Message

    url = ctx.new_database()
    topic = ctx.new_topic("lateness", partitions=3)
    broker = Broker()
    with psycopg.connect(url) as conn:
        daemons = [Daemon(*producer_args(url, ctx.bootstrap))]
        try:
            with conn.transaction():  # the relay is up once this one has left
                broker.send(conn, topic, {"warm": "up"})
            wait_for(
                lambda: scalar(conn, "SELECT count(*) FROM outbox.producer_queue") == 0,
                since=time.perf_counter(),
                timeout=60,
                daemons=daemons,
                what="the producer to start",
            )
            conn.commit()
            time.sleep(1.5)  # idle: asleep on its poll interval
            due: dict[str, datetime] = {}
            with conn.transaction():
                times = _due_times(conn, count)
                for first in range(0, count, 1000):
                    batch = [
                        Message(topic, {"n": i}, key=f"key-{i % 1000}", deliver_at=times[i])
                        for i in range(first, min(count, first + 1000))
                    ]
                    for message_id, at in zip(
                        broker.send_many(conn, batch), times[first:], strict=False
                    ):
                        due[str(message_id)] = at
            created = _created_times(ctx, topic, count + 1, LEAD + count / RATE + 60)
        finally:
            stop_all(daemons)
    return _late_ms(due, {k: v for k, v in created.items() if k in due})  # less the warm-up


def _bare_lateness(ctx: Context, count: int) -> list[float]:
    """The floor: a bare loop over a plain table of due times."""
    from confluent_kafka import Producer

    from outbox.kafka.publisher import producer_config

    url = ctx.new_database(migrated=False)
    topic = ctx.new_topic("lateness-floor", partitions=3)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE due (id bigserial PRIMARY KEY, mid text, due timestamptz)")
        conn.execute("CREATE INDEX ON due (due)")
        times = _due_times(conn, count)
        ids = [str(uuid.uuid4()) for _ in range(count)]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO due (mid, due) VALUES (%s, %s)", list(zip(ids, times, strict=True))
            )
    producer = Producer(producer_config(ctx.bootstrap))
    producer.list_topics(topic, timeout=10)
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + LEAD + count / RATE + 60
        while done < count and time.monotonic() < deadline:
            rows = conn.execute(
                "SELECT id, mid FROM due WHERE due <= clock_timestamp() ORDER BY due LIMIT 1000"
            ).fetchall()
            if not rows:
                time.sleep(0.001)
                continue
            for _, mid in rows:
                producer.produce(topic, mid.encode(), key=mid.encode())
            producer.flush(30)
            conn.execute("DELETE FROM due WHERE id = ANY(%s)", ([r[0] for r in rows],))
            done += len(rows)
    created = _created_times(ctx, topic, count, 60)
    return _late_ms(dict(zip(ids, times, strict=True)), created)


def lateness(ctx: Context) -> Result:
    count = ctx.scale(10_000, 500, quick=3_000)
    floor = percentiles(_bare_lateness(ctx, count))
    late = _outbox_lateness(ctx, count)
    figure = percentiles(late)
    metrics = {
        "messages": count,
        "p50 ms": figure["p50"],
        "p99 ms": figure["p99"],
        "max ms": figure["max"],
        "% over 50 ms": 100 * sum(1 for x in late if x > 50) / len(late),
        "floor p50 ms": floor["p50"],
    }
    return Result(
        LATENESS,
        f"{count:,} due, {RATE:,}/s",
        against_floor(metrics, figure["p99"], floor["p99"], lower_is_better=True),
        notes="figure: p99 of Kafka create time minus due time; floor: the bare loop's p99 "
        "(select due, produce, flush, delete); target p99 < 50 ms",
        samples=late,
    )
