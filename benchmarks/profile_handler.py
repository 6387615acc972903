"""Where the Handler's time goes per message: CPU per message and a profile of its threads.

    PYTHONPATH=. python -m benchmarks.profile_handler [--messages 20000] [--concurrency 1]
        [--variant plain|pipelined|batch|noop] [--rounds 3] [--profile [--top 20]]

Starts the servers the tests use, and per round: fills a fresh database's `consumer_queue`
with `--messages` JSON rows (the Consumer's own statement), runs the bare select-insert-delete
loop over them (the floor, `floors.handler_floor`), fills another database alike and runs a
`HandlerRunner` in this process over it with the benchmarks' one-INSERT callback
(`bench_handlers`; `--variant noop`: a callback that does nothing, so that the CPU per message
is what the Handler costs around a callback). It prints the floor and the Handler in msg/s with their ratio, and the
process CPU per message (all threads: the Handler's Python, psycopg and libpq; the server's
CPU is not counted). With `--profile`, every thread the Handler starts runs under cProfile
(which slows it: read the CPU figures of a run without it), and the functions with the most
time of their own, summed over the rounds, follow. No daemon process: what it measures is
the Handler's own loop, without start-up.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import threading
import time
from typing import Any

import psycopg

from benchmarks.bench_handlers import DEFAULT_TOPIC, EFFECTS_TABLE
from benchmarks.floors import handler_floor
from benchmarks.harness import Context
from benchmarks.throughput import fill_inbox, vacuum_analyze
from outbox import Handlers
from outbox.runtime import App, Databases, HandlerConfig, Settings


def _handlers(variant: str) -> Handlers:
    from benchmarks import bench_handlers

    if variant == "noop":  # a callback that does nothing: what the Handler costs around it
        noop = Handlers()
        noop.handler(DEFAULT_TOPIC)(lambda message, conn: None)
        return noop
    return {
        "plain": bench_handlers.handlers,
        "pipelined": bench_handlers.pipelined_handlers,
        "batch": bench_handlers.batch_handlers,
    }[variant]


def _filled(ctx: Context, messages: int) -> str:
    url = ctx.new_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(EFFECTS_TABLE)
    fill_inbox(url, DEFAULT_TOPIC, messages)
    vacuum_analyze(url, "outbox.consumer_queue")
    return url


def _profiled_threads(profiles: list[cProfile.Profile]) -> Any:
    """Profile every thread started from now on (each with a profiler of its own)."""
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    return original


def _handle(
    url: str, messages: int, concurrency: int, variant: str, profiles: list[Any] | None
) -> tuple[float, float]:
    config = HandlerConfig(batch_size=500, concurrency=concurrency, poll_interval=0.5)
    runner = App(
        Settings(databases=Databases.of(url), handler=config), _handlers(variant)
    ).handler()
    original = _profiled_threads(profiles) if profiles is not None else threading.Thread.run
    try:
        cpu0 = time.process_time()
        started = time.perf_counter()
        thread = threading.Thread(target=runner.run, name="handler-runner")
        thread.start()
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                done = conn.execute("SELECT count(*) FROM outbox.consumer_processed").fetchone()
                if done is not None and done[0] >= messages:
                    break
                time.sleep(0.01)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu0
        runner.stop()
        thread.join(30)
    finally:
        threading.Thread.run = original  # type: ignore[method-assign]
    return messages / seconds, cpu * 1e6 / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--variant", choices=("plain", "pipelined", "batch", "noop"), default="plain"
    )
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile the Handler's threads")
    args = parser.parse_args()

    import tempfile
    from pathlib import Path

    from outbox.testing.servers import start_servers

    base = Path(tempfile.mkdtemp(prefix="outbox-profile-"))
    with start_servers(base) as servers:
        ctx = Context(servers=servers, smoke=False, out_dir=base)
        profiles: list[cProfile.Profile] | None = [] if args.profile else None
        for n in range(args.rounds):
            floor = handler_floor(_filled(ctx, args.messages), batch=args.variant == "batch")
            rate, cpu_us = _handle(
                _filled(ctx, args.messages), args.messages, args.concurrency, args.variant, profiles
            )
            print(
                f"round {n + 1}: handler {rate:,.0f} msg/s, floor {floor:,.0f} msg/s, "
                f"ratio {rate / floor:.2f}; handler process CPU {cpu_us:.1f} µs/msg",
                flush=True,
            )
        if not profiles:
            return
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        print(f"\nfunctions by own time, {args.rounds} rounds of {args.messages:,} messages:")
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
