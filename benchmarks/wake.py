"""The wake-up path alone: a row stored in consumer_queue -> the handler's callback (issue 35).

    python -m benchmarks.wake [--messages 300] [--rounds 1]

No transport and no producer: the benchmark inserts one row at a time with the Consumer's own
statement (`inbox_insert`, with its NOTIFY to a sleeping handler), at random gaps of 30-120 ms
so the handler is idle and woken for each, into a database served by one `outbox handler
benchmarks.latency_handlers:handlers` process (4 workers, each connected by a warm-up of 40
rows of random keys). Latency = the callback's start - the insert's commit; this is the
stored -> handled part of the hop budget (`latency.HOPS`), without the noise of the hops before.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from benchmarks.harness import Context, Result, machine, markdown
from benchmarks.latency import latency_result, outbox_daemon, wait_arrivals

SCENARIO = "wake-up: consumer_queue insert -> handler callback"
WARMUP = 40


def wake_latency(ctx: Context, messages: int) -> Result:
    """One round: `messages` rows, each stored alone while the handler sleeps."""
    from benchmarks.latency_handlers import SCHEMA
    from outbox.core.batches import InboxBatch
    from outbox.core.envelope import InboxRow
    from outbox.core.lanes import lane_for
    from outbox.postgres.inbox import insert_params
    from outbox.postgres.queries import channel, queries

    url = ctx.new_database()
    topic = f"bench.wake.{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    handler = outbox_daemon(
        "outbox handler",
        "handler",
        "benchmarks.latency_handlers:handlers",
        "--database-url",
        url,
        "--concurrency",
        "4",
        env={"LATENCY_TOPIC": topic},
    )
    insert = queries("outbox")["inbox_insert"]
    wake = channel("outbox", "consumer_queue")
    committed: dict[str, float] = {}
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for i in range(-WARMUP, messages):
                key, message_id = uuid.uuid4().bytes, uuid.uuid4()
                row = InboxRow(
                    message_id,
                    topic,
                    key,
                    b'{"i": %d}' % i,
                    {},
                    "application/json",
                    lane_for(key, message_id),
                    datetime.now(UTC),
                    0,
                    i + WARMUP,
                )
                conn.execute(insert, insert_params(InboxBatch.of([row]), wake))
                if i >= 0:
                    committed[str(message_id)] = time.time()
                time.sleep(random.uniform(0.03, 0.12))
        wait_arrivals(url, WARMUP + messages, 60, [handler])
    finally:
        handler.stop()
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT message_id::text, started FROM arrivals").fetchall()
    started = {r[0]: float(r[1]) for r in rows}
    return latency_result(
        f"{messages} rows, one at a time",
        committed,
        started,
        {},
        "inbox_insert with its NOTIFY, 30-120 ms apart; one `outbox handler`, 4 workers",
        scenario=SCENARIO,
    )


def main(argv: list[str] | None = None) -> int:
    """The wake-up path's latency, `--rounds` times on the same servers."""
    from outbox.testing.servers import start_servers

    parser = argparse.ArgumentParser(prog="python -m benchmarks.wake", description=main.__doc__)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    with start_servers(Path(tempfile.mkdtemp(prefix="outbox-wake-"))) as servers:
        ctx = Context(servers=servers, smoke=False, out_dir=Path("."))
        results = [wake_latency(ctx, args.messages) for _ in range(args.rounds)]
        print(markdown(results, machine(servers), False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
