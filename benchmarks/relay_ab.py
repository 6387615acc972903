"""(b) before / after: the relay of two checkouts over the same kind of backlog, in alternating
order, each round beside the bare relay loop of the same round.

    python -m benchmarks.relay_ab [--messages 300000] [--rounds 6] before=/path/a after=/path/b

Each `LABEL=PATH` names a checkout whose `outbox producer` drains a fresh backlog of
`--messages` x 100 B (1,000 keys) in each round; the order of the checkouts alternates from
round to round. Each round first drains another such backlog with the bare loop of
`floors.relay_floor`. Rate: msg/s from the first delete to empty, as (b) measures it; ratio:
rate / the round's floor; CPU: the producer process's CPU (all threads) over the same span, per
message. Prints a markdown table and the median of each column.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks.floors import relay_floor
from benchmarks.harness import Context
from benchmarks.throughput import (
    _backlog,
    producer_args,
    scalar,
    timeout_for,
    wait_for,
)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(ctx: Context, messages: int, checkout: Path) -> tuple[float, float]:
    """(msg/s from the first delete to empty, producer CPU µs per message) of the checkout's
    `outbox producer` over a fresh backlog."""
    url, _topic = _backlog(ctx, messages, 100)
    min_id = "SELECT min(id) FROM outbox.producer_queue"
    code = "import sys; from outbox.cli import main; sys.exit(main())"
    with psycopg.connect(url, autocommit=True) as conn, tempfile.TemporaryFile() as out:
        first = scalar(conn, min_id)
        started = time.perf_counter()
        # -c, run from the checkout: its outbox is imported, not this one's.
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                "--log-level",
                "WARNING",
                *producer_args(url, ctx.bootstrap),
            ],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            timeout = timeout_for(messages)
            startup = wait_for(
                lambda: scalar(conn, min_id) != first,
                since=started,
                timeout=timeout,
                interval=0.005,
            )
            cpu = _cpu(process.pid)
            seconds = wait_for(
                lambda: scalar(conn, min_id) is None, since=started, timeout=timeout, interval=0.005
            )
            cpu = _cpu(process.pid) - cpu
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    return messages / (seconds - startup), cpu / messages * 1e6


def main(argv: list[str] | None = None) -> int:
    from outbox.testing.servers import start_servers

    parser = argparse.ArgumentParser(prog="python -m benchmarks.relay_ab", description=__doc__)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("checkouts", nargs="+", metavar="LABEL=PATH")
    args = parser.parse_args(argv)
    checkouts: list[tuple[str, Path]] = []
    for item in args.checkouts:
        label, _, path = item.partition("=")
        if not path or not (Path(path) / "outbox" / "cli").is_dir():
            parser.error(f"{item}: not LABEL=PATH of a checkout with outbox/cli")
        checkouts.append((label, Path(path).resolve()))
    labels = [label for label, _ in checkouts]
    columns = ["floor msg/s"] + [
        f"{label} {what}" for label in labels for what in ("msg/s", "ratio", "CPU µs/msg")
    ]
    rows: list[list[float]] = []
    print("| round | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    with start_servers(Path(tempfile.mkdtemp(prefix="outbox-relay-ab-"))) as servers:
        ctx = Context(servers=servers, smoke=False, out_dir=Path("."))
        for r in range(args.rounds):
            url, topic = _backlog(ctx, args.messages, 100)
            floor = relay_floor(url, ctx.bootstrap, topic)
            measured: dict[str, tuple[float, float]] = {}
            for label, path in checkouts if r % 2 == 0 else checkouts[::-1]:
                measured[label] = drain(ctx, args.messages, path)
            row = [floor]
            for label in labels:
                rate, cpu = measured[label]
                row += [rate, rate / floor, cpu]
            rows.append(row)
            print(f"| {r} | " + " | ".join(_fmt(v) for v in row) + " |", flush=True)
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    print("| median | " + " | ".join(_fmt(v) for v in medians) + " |")
    return 0


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
