"""Run the benchmarks: `python -m benchmarks [--smoke | --quick] [--only a,ceilings,...]`.

Starts its own PostgreSQL and Kafka-protocol broker (or uses OUTBOX_TEST_DATABASE_URL /
OUTBOX_TEST_KAFKA_BOOTSTRAP), runs each scenario, prints the tables, and writes JSON, markdown
and PNG plots to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.harness import RESULTS_DIR, Context, Result, machine, markdown, write_results

#: Scenario key -> module with run(ctx); in the order they run.
SCENARIOS = {
    "ceilings": "benchmarks.ceilings",
    "a": "benchmarks.send_overhead",
    "b": "benchmarks.throughput:relay",
    "c": "benchmarks.throughput:inbox",
    "d": "benchmarks.throughput:handler",
    "e": "benchmarks.latency",
    "f": "benchmarks.retention",
    "g": "benchmarks.peer",
    "w": "benchmarks.whole_path",
    "spark": "benchmarks.spark_inbox",
    "transports": "benchmarks.transports",
    "http": "benchmarks.serve_http",
}


def _load(target: str):  # type: ignore[no-untyped-def]
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, function or "run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--smoke", action="store_true", help="tiny sizes: checks, not numbers")
    sizes.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, each figure beside its floor: ratios in a few minutes a scenario",
    )
    parser.add_argument(
        "--only", default="", help="comma-separated scenario keys: " + ",".join(SCENARIOS)
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or list(SCENARIOS)
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")

    from outbox.testing.servers import start_servers

    base = Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    results: list[Result] = []
    failed: list[str] = []
    with start_servers(base) as servers:
        ctx = Context(servers=servers, smoke=args.smoke, out_dir=args.out, quick=args.quick)
        info = machine(servers)
        for key in keys:
            try:
                run = _load(SCENARIOS[key])
            except (ImportError, AttributeError):
                print(f"-- scenario {key}: not available in this checkout", file=sys.stderr)
                continue
            started = time.perf_counter()
            print(f"-- scenario {key} ...", file=sys.stderr, flush=True)
            try:
                results += run(ctx)
            except Exception:
                failed.append(key)
                traceback.print_exc()
            print(f"   {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    print(markdown(results, info, args.smoke, quick=args.quick))
    complete = set(keys) == set(SCENARIOS) and not failed
    json_path, md_path = write_results(
        results, info, args.out, args.smoke, complete=complete, quick=args.quick
    )
    try:
        from benchmarks.plots import plot

        prefix = "" if complete and not args.quick else f"{json_path.stem}-"
        for path in plot(results, args.out, smoke=args.smoke, prefix=prefix):
            print(f"plot: {path}", file=sys.stderr)
    except ImportError:
        print(
            "plots skipped: matplotlib is not installed (pip install matplotlib)", file=sys.stderr
        )
    print(f"results: {json_path} and {md_path}", file=sys.stderr)
    if failed:
        print(f"scenarios that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
