"""The bare loops each scenario is measured against, in the same run: what the simplest code
doing the same work costs on this machine at that moment.

- send (a): one plain INSERT into a bare table, and the naive INSERT + NOTIFY (`send_overhead`);
- relay (b): select 1,000 rows of `producer_queue` in id order, produce them (idempotent
  producer, outbox's producer settings), flush, delete them, commit; until the queue is empty;
- inbox (c): a plain consumer polls up to 1,000 records, INSERTs them into a bare table in one
  statement, commits, commits its offsets;
- handler (d): select 500 rows of `consumer_queue` in id order, one INSERT per message (the
  callback's effect; one executemany for the `batch_handler` variant), delete them, commit;
- latency (e): a producer to a plain consumer with the variant's settings (`latency.broker_floor`);
- the log kept in PostgreSQL (transports): the relay and inbox loops above with the log's
  clients in place of Kafka's (`log_relay_floor`: `PgLogPublisher.publish` of each batch;
  `log_inbox_floor`: one `PgLogSubscriber` member); its latency floor is
  `transports.log_floor`;
- the whole path (f, w): the bare loops above run together as one bare pipeline
  (`pipeline_floor`), each stage its own process as the daemons are, over the same servers and
  the same number of messages: (f) also writes the messages meanwhile, 1,000 per transaction.

A result row shows its `figure`, the `floor` and the `ratio` (`ratio` says how much of the floor
the figure reaches: figure / floor for rates, floor / figure for latencies; 1 is as good as the
bare loop).
"""

from __future__ import annotations

import contextlib
import queue
import time
import uuid
from typing import Any

import psycopg

#: Rows a bare relay loop selects, produces and deletes per transaction.
RELAY_BATCH = 1000
#: Rows a bare handler loop selects, handles and deletes per transaction.
HANDLER_BATCH = 500
#: Records a bare consumer loop polls and inserts per transaction.
INBOX_BATCH = 1000
#: Seconds a bare stage of `pipeline_floor` sleeps when its input table is empty.
IDLE = 0.005


def against_floor(
    metrics: dict[str, float], figure: float, floor: float, *, lower_is_better: bool = False
) -> dict[str, float]:
    """`metrics` with `figure`, `floor` and `ratio` added (in that order, last)."""
    if floor != floor or figure != figure or not floor or not figure:  # NaN or zero
        ratio = float("nan")
    else:
        ratio = floor / figure if lower_is_better else figure / floor
    return {**metrics, "figure": figure, "floor": floor, "ratio": ratio}


def relay_floor(
    url: str,
    bootstrap: str,
    topic: str,
    *,
    table: str = "outbox.producer_queue",
    messages: int | None = None,
    from_start: bool = False,
) -> float:
    """Drain `table` (`id, key, payload`) with the bare loop; returns its msg/s from the first
    delete (the first batch done) to empty, as the relay's figure is measured, or with
    `from_start` from before the first select (every row counted; one warm-up record is
    produced and flushed first, so that the producer has its id and the partitions' leaders
    before the clock, as a relay that is already running has). With `messages` it waits
    for rows while the table is empty until it has relayed that many (a stage of
    `pipeline_floor`, whose writer fills the table meanwhile)."""
    from confluent_kafka import Producer

    from outbox.kafka.publisher import producer_config

    producer = Producer(producer_config(bootstrap))
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    producer.list_topics(topic, timeout=10)  # metadata and producer id before the clock
    if from_start:
        producer.produce(topic, b"warm-up", key=b"warm-up", on_delivery=report)
        if producer.flush(30) or failed:
            raise RuntimeError(f"bare relay loop: warm-up delivery failed: {failed[:1]}")
    done = first = 0
    first_at = 0.0
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        while True:
            with conn.transaction():
                rows = conn.execute(
                    f"SELECT id, key, payload FROM {table} ORDER BY id LIMIT %s", (RELAY_BATCH,)
                ).fetchall()
                for _, key, payload in rows:
                    while True:
                        try:
                            producer.produce(topic, payload, key=key, on_delivery=report)
                            break
                        except BufferError:
                            producer.poll(0.01)
                if rows:
                    if producer.flush(60) or failed:
                        raise RuntimeError(f"bare relay loop: delivery failed: {failed[:1]}")
                    conn.execute(
                        f"DELETE FROM {table} WHERE id = ANY(%s)", ([row[0] for row in rows],)
                    )
            if not rows:
                if messages is None or done >= messages:
                    break
                time.sleep(IDLE)
                continue
            if not done:
                first, first_at = len(rows), time.perf_counter()
                if from_start:
                    first, first_at = 0, started
            done += len(rows)
        seconds = time.perf_counter() - first_at
    return (done - first) / seconds if done > first else float("nan")


def inbox_floor(
    url: str, bootstrap: str, topic: str, messages: int, *, eager: bool = False
) -> tuple[float, float]:
    """Store `messages` records of `topic` with the bare consumer loop; returns (msg/s from the
    first stored batch to the last, seconds until the first).

    With `eager` (a stage of `pipeline_floor`, whose records arrive while it runs) it reads as
    outbox's consumer does: its fetch wait (`fetch.wait.max.ms`), and it waits for one record,
    then takes what else is there without waiting; otherwise it waits up to 0.5 s for a full
    batch, with librdkafka's fetch wait, which on a backlog costs nothing."""
    from confluent_kafka import Consumer

    from outbox.kafka.subscriber import DEFAULTS as CONSUMER_DEFAULTS

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bare_inbox (id bigserial PRIMARY KEY, key bytea, payload bytea NOT NULL,"
            " source_partition int NOT NULL, source_offset bigint NOT NULL)"
        )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-floor-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            **({"fetch.wait.max.ms": CONSUMER_DEFAULTS["fetch.wait.max.ms"]} if eager else {}),
        }
    )
    consumer.subscribe([topic])
    stored = 0
    first_at = first_rows = 0.0
    started = time.perf_counter()
    deadline = started + 120 + messages / 200
    try:
        with psycopg.connect(url) as conn:
            while stored < messages:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"bare consumer loop stored {stored} of {messages}")
                if eager:
                    first = consumer.poll(0.5)
                    batch = [first, *consumer.consume(INBOX_BATCH - 1, 0)] if first else []
                else:
                    batch = consumer.consume(INBOX_BATCH, 0.5)
                records = [r for r in batch if r.error() is None]
                if not records:
                    continue
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO bare_inbox (key, payload, source_partition, source_offset) "
                        "SELECT * FROM unnest(%s::bytea[], %s::bytea[], %s::int[], %s::bigint[])",
                        (
                            [r.key() for r in records],
                            [r.value() for r in records],
                            [r.partition() for r in records],
                            [r.offset() for r in records],
                        ),
                    )
                consumer.commit(asynchronous=True)
                if not stored:
                    first_at, first_rows = time.perf_counter(), len(records)
                stored += len(records)
            ended = time.perf_counter()
    finally:
        consumer.close()
    steady = ended - first_at
    rate = (stored - first_rows) / steady if steady > 0 else float("nan")
    return rate, first_at - started


def handler_floor(
    url: str,
    *,
    batch: bool = False,
    table: str = "outbox.consumer_queue",
    column: str = "message_id",
    messages: int | None = None,
) -> float:
    """Handle every row of `table` with the bare loop (one INSERT of its `column` into
    `effects` per message, or one executemany per transaction with `batch`); returns its msg/s
    from the first committed transaction to the last, as the handler's figure is measured. With
    `messages` it waits for rows while the table is empty until it has handled that many (a
    stage of `pipeline_floor`)."""
    done = first = 0
    first_at = 0.0
    effect = "INSERT INTO effects (message_id) VALUES (%s)"
    with psycopg.connect(url) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(
                    f"SELECT id, {column} FROM {table} ORDER BY id LIMIT %s", (HANDLER_BATCH,)
                ).fetchall()
                if rows and batch:
                    with conn.cursor() as cur:
                        cur.executemany(effect, [(row[1],) for row in rows])
                elif rows:
                    for row in rows:
                        conn.execute(effect, (row[1],))
                if rows:
                    conn.execute(
                        f"DELETE FROM {table} WHERE id = ANY(%s)", ([row[0] for row in rows],)
                    )
            if not rows:
                if messages is None or done >= messages:
                    break
                time.sleep(IDLE)
                continue
            if not done:
                first, first_at = len(rows), time.perf_counter()
            done += len(rows)
        seconds = time.perf_counter() - first_at
    return (done - first) / seconds if done > first else float("nan")


#: Records taken through a bare pipeline's consumer and handler before its clock starts (the
#: consumer's group join is not timed, as it is not in the scenarios).
PIPELINE_WARMUP = 10
#: Rows a bare pipeline's writer inserts per transaction (the scenarios send 1,000 at a time).
WRITE_BATCH = 1000
#: Distinct keys of the rows a bare writer inserts (as the scenarios' messages).
WRITE_KEYS = 1000


def write_floor(url: str, table: str, messages: int, payload: bytes) -> float:
    """Insert `messages` rows `(key, payload)` into `table`, 1,000 per transaction in one
    multi-row INSERT each; returns msg/s."""
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for first in range(0, messages, WRITE_BATCH):
            last = min(messages, first + WRITE_BATCH)
            keys = [f"key-{i % WRITE_KEYS}".encode() for i in range(first, last)]
            with conn.transaction():
                conn.execute(
                    f"INSERT INTO {table} (key, payload) "
                    "SELECT * FROM unnest(%s::bytea[], %s::bytea[])",
                    (keys, [payload] * len(keys)),
                )
    return messages / (time.perf_counter() - started)


def _stage(
    name: str, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any], errors: Any
) -> None:
    """One stage of a bare pipeline, in a process of its own; its error goes to `errors`."""
    try:
        function(*args, **kwargs)
    except BaseException as exc:
        errors.put(f"bare {name}: {exc!r}")
        raise


def pipeline_floor(
    url: str,
    bootstrap: str,
    topic: str,
    messages: int,
    *,
    payload: bytes,
    write: bool,
    batch: bool = False,
) -> tuple[float, float]:
    """The bare loops chained over the same servers, all running at once, each in a process of
    its own: (a writer inserting `messages` rows 1,000 per transaction if `write`, else a
    backlog written before the clock) -> the bare relay loop -> Kafka -> the bare consumer
    loop -> the bare handler loop (one INSERT per message, or one executemany with `batch`).

    `url` is a fresh database without outbox's tables. The consumer and the handler run and
    take a few records first, then the clock starts with the relay (and the writer) and stops
    when the handler has committed the last message. Returns (msg/s, seconds)."""
    import multiprocessing as mp

    from confluent_kafka import Producer

    total = messages + PIPELINE_WARMUP
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bare_queue (id bigserial PRIMARY KEY, key bytea, payload bytea NOT NULL)"
        )
        conn.execute("CREATE TABLE effects (id bigserial PRIMARY KEY, message_id bigint NOT NULL)")
    if not write:
        write_floor(url, "bare_queue", messages, payload)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE bare_queue")
    context = mp.get_context("fork")
    errors = context.Queue()
    processes: list[Any] = []

    def start(name: str, function: Any, *args: Any, **kwargs: Any) -> None:
        process = context.Process(
            target=_stage, args=(name, function, args, kwargs, errors), name=f"bare-{name}"
        )
        process.start()
        processes.append(process)

    def wait(predicate: Any, timeout: float, what: str) -> float:
        started = time.perf_counter()
        while not predicate():
            failed = [p for p in processes if p.exitcode not in (None, 0)]
            if failed:
                reasons = [f"{p.name} exited with {p.exitcode}" for p in failed]
                with contextlib.suppress(queue.Empty):
                    while True:
                        reasons.append(errors.get(timeout=1))
                raise RuntimeError(f"bare pipeline: {'; '.join(reasons)}")
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"bare pipeline: {what} took more than {timeout:.0f}s")
            time.sleep(IDLE)
        return time.perf_counter() - started

    try:
        with psycopg.connect(url, autocommit=True) as conn:

            def scalar(query: str) -> Any:
                row = conn.execute(query).fetchone()
                return row[0] if row else None

            start("consumer", inbox_floor, url, bootstrap, topic, total, eager=True)
            wait(lambda: scalar("SELECT to_regclass('bare_inbox')") is not None, 60, "start")
            start(
                "handler",
                handler_floor,
                url,
                batch=batch,
                table="bare_inbox",
                column="id",
                messages=total,
            )
            warm_up = Producer({"bootstrap.servers": bootstrap})
            for i in range(PIPELINE_WARMUP):
                warm_up.produce(topic, payload, key=f"warm-up-{i}".encode())
            warm_up.flush(30)
            del warm_up
            handled = "SELECT coalesce(max(id), 0) FROM effects"
            wait(lambda: scalar(handled) >= PIPELINE_WARMUP, 120, "the warm-up records")
            started = time.perf_counter()
            if write:
                start("writer", write_floor, url, "bare_queue", messages, payload)
            start(
                "relay", relay_floor, url, bootstrap, topic, table="bare_queue", messages=messages
            )
            wait(lambda: scalar(handled) >= total, 120 + messages / 200, "the whole path")
            seconds = time.perf_counter() - started
        for process in processes:
            process.join(60)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(10)
    return messages / seconds, seconds


def log_relay_floor(url: str, log_url: str, topic: str) -> float:
    """The bare relay loop over the log kept in PostgreSQL: drain `outbox.producer_queue` of
    `url` as `relay_floor` does, each batch of 1,000 appended to `topic` of the log at `log_url`
    by `PgLogPublisher.publish` (one transaction) before it is deleted; returns msg/s from the
    first delete (the first batch done) to empty, as `relay_floor`. The records carry the rows' message ids and the batch's time as outbox's headers (the
    log stores them); nothing else of outbox's relay runs."""
    from datetime import UTC, datetime

    from outbox.core.batches import OutgoingRecord
    from outbox.pglog import PgLogPublisher

    publisher = PgLogPublisher(log_url)
    done = first = 0
    first_at = 0.0
    try:
        with psycopg.connect(url) as conn:
            while True:
                with conn.transaction():
                    rows = conn.execute(
                        "SELECT id, key, payload, message_id::text FROM outbox.producer_queue "
                        "ORDER BY id LIMIT %s",
                        (RELAY_BATCH,),
                    ).fetchall()
                    if not rows:
                        break
                    now = datetime.now(UTC).isoformat()
                    records = [
                        OutgoingRecord(
                            row[0],
                            topic,
                            row[1],
                            row[2],
                            row[3],
                            now,
                            "application/octet-stream",
                            None,
                            0,
                        )
                        for row in rows
                    ]
                    if any(outcome is not None for outcome in publisher.publish(records)):
                        raise RuntimeError("bare log relay loop: publish failed")
                    conn.execute(
                        "DELETE FROM outbox.producer_queue WHERE id = ANY(%s)",
                        ([row[0] for row in rows],),
                    )
                if not done:
                    first, first_at = len(rows), time.perf_counter()
                done += len(rows)
            seconds = time.perf_counter() - first_at
    finally:
        publisher.close()
    return (done - first) / seconds if done > first else float("nan")


def log_inbox_floor(url: str, log_url: str, topic: str, messages: int) -> float:
    """The bare consumer loop over the log: one `PgLogSubscriber` member of a new group polls up
    to 1,000 records of `topic` (log at `log_url`), INSERTs them into a bare table of `url` in
    one statement, commits, commits its position; until `messages` are stored. Returns msg/s
    from the first stored batch to the last, as `inbox_floor`."""
    from outbox.pglog import PgLogSubscriber

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bare_inbox (id bigserial PRIMARY KEY, key bytea, payload bytea NOT NULL,"
            " source_partition int NOT NULL, source_offset bigint NOT NULL)"
        )
    subscriber = PgLogSubscriber(log_url, [topic], f"bench-floor-{uuid.uuid4().hex[:8]}")
    stored = first_rows = 0
    first_at = 0.0
    deadline = time.perf_counter() + 120 + messages / 200
    try:
        with psycopg.connect(url) as conn:
            while stored < messages:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"bare log consumer loop stored {stored} of {messages}")
                batch = subscriber.poll(INBOX_BATCH, 0.5)
                if not batch:
                    continue
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO bare_inbox (key, payload, source_partition, source_offset) "
                        "SELECT * FROM unnest(%s::bytea[], %s::bytea[], %s::int[], %s::bigint[])",
                        (batch.keys, batch.payloads, batch.partitions, batch.offsets),
                    )
                subscriber.commit(batch)
                if not stored:
                    first_at, first_rows = time.perf_counter(), len(batch)
                stored += len(batch)
            ended = time.perf_counter()
    finally:
        subscriber.close()
    steady = ended - first_at
    return (stored - first_rows) / steady if steady > 0 else float("nan")
