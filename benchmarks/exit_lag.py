"""How many backends a server lists for a client that holds one connection at a time.

    python -m benchmarks.exit_lag [--url URL] [--hogs 4] [--seconds 15]

A client opens and closes connections one after another (a connection budget of 1) while
another session counts the backends of its application name in `pg_stat_activity`, with
`--hogs` processes spinning on the CPU beside it. A closed connection's backend exits on its
own after the client has moved on: on a saturated machine the server lists, and counts against
`max_connections`, more backends than the client holds. Without `--url` it starts its own
PostgreSQL (the test harness).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

NAME = "outbox-bench-exit-lag"


def measure(url: str, hogs: int, seconds: float) -> tuple[int, int]:
    """(connects made, the most backends of the client listed at once)."""
    stop = threading.Event()
    peak = 0

    def sample() -> None:
        nonlocal peak
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (NAME,)
                ).fetchone()
                peak = max(peak, int(row[0]) if row else 0)

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    connects = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            psycopg.connect(url, application_name=NAME).close()
            connects += 1
    finally:
        stop.set()
        sampler.join(10)
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return connects, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exit_lag", description=__doc__)
    parser.add_argument("--url", help="a PostgreSQL URL (default: start one)")
    parser.add_argument("--hogs", type=int, default=4, help="processes spinning on the CPU")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)

    def run(url: str) -> None:
        for hogs in sorted({0, args.hogs}):
            connects, peak = measure(url, hogs, args.seconds)
            print(f"{hogs} CPU hogs: {connects} connects, one at a time; at most {peak} listed")

    if args.url:
        run(args.url)
        return 0
    from outbox.testing.servers import start_servers

    with start_servers(Path(tempfile.mkdtemp(prefix="outbox-exit-lag-"))) as servers:
        run(servers.postgres.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
