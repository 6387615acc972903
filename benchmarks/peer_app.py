"""The peer's relay as a process: faststream-outbox rows of one queue -> Kafka, for scenario (g).

`python -m benchmarks.peer_app --database-url postgresql+asyncpg://... --bootstrap HOST:PORT
--table T --queue Q --topic K [--max-workers N ...]` builds the relay exactly as the package's
quickstart does (an `OutboxBroker` subscriber on the queue, stacked under a FastStream Kafka
publisher, here the confluent-kafka one, so both relays use librdkafka), prints "ready" once
both brokers are started, and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any


def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The outbox broker, the Kafka broker and the engine of the relay."""
    from faststream.confluent import KafkaBroker
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine

    table = make_outbox_table(MetaData(), table_name=args.table)
    # The pool must hold the fetch connection plus one writer per worker (the broker checks).
    engine = create_async_engine(args.database_url, pool_size=args.max_workers + 2)
    # FastStream's own logger (a line per message received and processed) unless --quiet.
    quiet: dict[str, Any] = {"logger": None} if args.quiet else {}
    outbox = OutboxBroker(engine, outbox_table=table, **quiet)
    kafka = KafkaBroker(args.bootstrap, **quiet)
    publisher = kafka.publisher(args.topic)

    @publisher
    @outbox.subscriber(
        args.queue,
        max_workers=args.max_workers,
        fetch_batch_size=args.fetch_batch_size,
        terminal_flush_batch_size=args.terminal_flush_batch_size,
    )
    async def relay(body: dict[str, Any]) -> dict[str, Any]:
        return body

    return outbox, kafka, engine


async def serve(args: argparse.Namespace) -> None:
    outbox, kafka, engine = build(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await kafka.start()
    await outbox.start()
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        await outbox.stop()
        await kafka.stop()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_app", description=__doc__)
    parser.add_argument("--database-url", required=True, help="postgresql+asyncpg://...")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--table", default="fs_outbox")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--topic", required=True)
    # The package's defaults (OutboxBroker.subscriber) unless told otherwise.
    parser.add_argument("--max-workers", type=int, default=1)
    parser.add_argument("--fetch-batch-size", type=int, default=10)
    parser.add_argument("--terminal-flush-batch-size", type=int, default=1)
    parser.add_argument(
        "--quiet", action="store_true", help="no FastStream log line per message (logger=None)"
    )
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
