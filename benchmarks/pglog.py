"""The PostgreSQL log transport alone: publish rate, read rate, end-to-end latency.

    python -m benchmarks.pglog [--messages 50000] [--seconds 10] [--fast]

Starts its own PostgreSQL (durable: fsync and synchronous_commit on, unless --fast), or uses
OUTBOX_TEST_DATABASE_URL (an admin URL; a fresh database is created in it). Not run by the
tests.

- publish: `PgLogPublisher.publish` of batches of 1,000 messages (200-byte payloads, 1,000
  keys, a topic of 8 partitions), by 1 and by 4 publishers (threads, each its own connection).
- read: one `PgLogSubscriber` of a new group reads them all, `poll(1000)` then `commit`, as
  the Consumer does (decoding each record into an inbox row included).
- latency: a publisher at a target rate (100/s: one message every 10 ms; 1,000/s: ten every
  10 ms) while a subscriber polls; latency = the subscriber has the row - the message was
  created (just before its publish), on this machine's clock. The subscriber waits on
  LISTEN/NOTIFY with its 0.2 s poll fallback (the Consumer's poll timeout).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.harness import outgoing_records
from outbox.core.batches import OutgoingRecord
from outbox.pglog import PgLog, PgLogPublisher, PgLogSubscriber
from outbox.pglog.log import upgrade
from outbox.testing.servers import PostgresServer, create_database, url_for_database

PAYLOAD = b'{"order_id": 12345, "customer": "c-0001", "lines": [' + b"1," * 70 + b"0]}"


def _messages(topic: str, n: int, keys: int = 1000) -> list[OutgoingRecord]:
    """`n` JSON records with keys drawn at random from `keys`."""
    return outgoing_records(
        topic, n, PAYLOAD, lambda _i: f"key-{random.randrange(keys)}".encode(), "application/json"
    )


def publish_rate(url: str, topic: str, total: int, publishers: int) -> float:
    """Messages/s appended by `publishers` threads, batches of 1,000."""
    per = total // publishers
    batches = [_messages(topic, 1000) for _ in range(max(1, per // 1000))]
    errors: list[BaseException] = []

    def work() -> None:
        publisher = PgLogPublisher(url)
        try:
            for batch in batches:
                results = publisher.publish(batch)
                if any(r is not None for r in results):
                    raise RuntimeError(f"publish failed: {results[0]}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            publisher.close()

    threads = [threading.Thread(target=work) for _ in range(publishers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return publishers * len(batches) * 1000 / elapsed


def read_rate(url: str, topic: str, expected: int) -> float:
    """Records/s read (and committed) by one member of a new group."""
    subscriber = PgLogSubscriber(url, [topic], f"reader-{uuid.uuid4().hex[:6]}")
    got = 0
    try:
        started = time.perf_counter()  # joining the group (taking the partitions) included
        while got < expected:
            rows = subscriber.poll(1000, 1.0)
            if not rows:
                raise RuntimeError(f"read stalled at {got} of {expected}")
            subscriber.commit(rows)
            got += len(rows)
        return got / (time.perf_counter() - started)
    finally:
        subscriber.close()


def latency(
    url: str, topic: str, rate: int, seconds: float, *, notify: bool = True
) -> dict[str, float]:
    """Latency percentiles (ms) of messages published at `rate`/s in a batch every 10 ms.

    `notify=False`: the subscriber never waits in poll (so never announces a nap, and no
    publisher notifies); it polls every 50 ms, as the reference design's readers do."""
    subscriber = PgLogSubscriber(url, [topic], f"lat-{uuid.uuid4().hex[:6]}")
    # Join the group and wait until every partition is held before the clock starts.
    deadline = time.monotonic() + 10
    while len(subscriber.partitions) < 8 and time.monotonic() < deadline:
        subscriber.poll(1000, 0.05)
    samples: list[float] = []
    stop = threading.Event()
    per_batch = max(1, rate // 100)
    sent = 0

    def produce() -> None:
        nonlocal sent
        publisher = PgLogPublisher(url)
        next_at = time.monotonic()
        end = next_at + seconds
        try:
            while time.monotonic() < end:
                batch = _messages(topic, per_batch)  # created_at: now
                assert publisher.publish(batch) == [None] * per_batch
                sent += per_batch
                next_at += 0.01
                time.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            publisher.close()
            stop.set()

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        while not (stop.is_set() and len(samples) >= sent):
            rows = subscriber.poll(1000, 0.2 if notify else 0)
            if not rows and not notify:
                time.sleep(0.05)
            now = datetime.now(UTC)
            samples.extend((now - c).total_seconds() * 1000 for c in rows.created_ats)
            if rows:
                subscriber.commit(rows)
    finally:
        thread.join()
        subscriber.close()
    samples.sort()

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, int(p * len(samples)))]

    return {
        "messages": len(samples),
        "achieved/s": len(samples) / seconds,
        "p50": statistics.median(samples),
        "p95": pct(0.95),
        "p99": pct(0.99),
        "max": samples[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pglog", description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fast", action="store_true", help="fsync off (not durable)")
    args = parser.parse_args()

    server = None
    admin = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    if not admin:
        server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="pglog-bench-")), fast=args.fast)
        admin = server.url
    try:
        name = f"pglog_bench_{uuid.uuid4().hex[:8]}"
        create_database(admin, name)
        url = url_for_database(admin, name)
        upgrade(url)
        log = PgLog(url)
        print(f"# PostgreSQL log transport, {os.cpu_count()} CPUs, durable={not args.fast}")
        print()
        print("| measure | variant | result |")
        print("|---|---|---|")
        for publishers in (1, 4):
            topic = f"bench.publish.{publishers}"
            log.create_topic(topic, 8)
            rate = publish_rate(url, topic, args.messages, publishers)
            print(f"| publish | {publishers} publisher(s), batches of 1,000 | {rate:,.0f} msg/s |")
            reads = read_rate(url, topic, log.count(topic))
            print(f"| read | 1 member, poll(1000) + commit | {reads:,.0f} msg/s |")
        for notify in (True, False):
            for rate in (100, 1000):
                topic = f"bench.latency.{rate}.{notify}"
                log.create_topic(topic, 8)
                result = latency(url, topic, rate, args.seconds, notify=notify)
                how = "LISTEN/NOTIFY" if notify else "polling every 50 ms"
                print(
                    f"| latency, {how} | {rate}/s for {args.seconds:g} s "
                    f"({result['achieved/s']:,.0f}/s achieved) | p50 {result['p50']:.1f} ms, p95 {result['p95']:.1f} ms, "
                    f"p99 {result['p99']:.1f} ms, max {result['max']:.1f} ms |"
                )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
