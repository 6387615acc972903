"""What every benchmark scenario shares: servers, fresh databases and topics, the machine, results.

A scenario is a function `run(ctx: Context) -> list[Result]`. It measures against the same
local servers the tests use (PostgreSQL from the machine's binaries, the Tansu broker), created
once per benchmark run, and returns rows for the results table. Numbers from one run are
compared as ratios within that run: the machine is small and noisy.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import targets
from outbox.core.batches import OutgoingRecord, outgoing_batch
from outbox.core.envelope import StoredMessage
from outbox.core.ids import uuid7
from outbox.postgres.migrate import upgrade
from outbox.testing.servers import Servers, create_database, create_topic

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class Result:
    """One measured row: scenario, variant and the numbers (rates in /s, latencies in ms)."""

    scenario: str
    variant: str
    metrics: dict[str, float]
    notes: str = ""
    #: Optional raw samples (for example latencies in ms) used for plots; not printed.
    samples: list[float] = field(default_factory=list, repr=False)


@dataclass
class Context:
    """Handles a scenario needs; `smoke` asks for a short run that still exercises everything,
    `quick` for sizes that still give numbers (ratios to the floors) in a few minutes."""

    servers: Servers
    smoke: bool
    out_dir: Path
    quick: bool = False

    @property
    def admin_url(self) -> str:
        return self.servers.postgres.url

    @property
    def bootstrap(self) -> str:
        return self.servers.kafka.bootstrap

    def new_database(self, *, migrated: bool = True) -> str:
        """A fresh database (migrated to head by default); returns its URL."""
        name = f"bench_{uuid.uuid4().hex[:10]}"
        create_database(self.admin_url, name)
        url = self.servers.postgres.url_for(name)
        if migrated:
            upgrade(url)
        return url

    def new_topic(self, prefix: str, partitions: int = 3) -> str:
        name = f"bench.{prefix}.{uuid.uuid4().hex[:8]}"
        create_topic(self.bootstrap, name, partitions=partitions)
        return name

    def scale(self, full: int, smoke: int, quick: int | None = None) -> int:
        """The size for this run: `quick` defaults to a tenth of `full` (at least `smoke`)."""
        if self.smoke:
            return smoke
        if self.quick:
            return max(smoke, full // 10) if quick is None else quick
        return full


def outgoing_records(
    topic: str,
    n: int,
    payload: bytes,
    key_of: Callable[[int], bytes],
    content_type: str = "application/octet-stream",
) -> list[OutgoingRecord]:
    """`n` records as the relay hands them to a publisher (`key_of(i)` the key of the i-th)."""
    now = datetime.now(UTC)
    return outgoing_batch(
        [
            StoredMessage(
                id=i,
                message_id=uuid7(),
                topic=topic,
                key=key_of(i),
                payload=payload,
                content_type=content_type,
                headers={},
                created_at=now,
                attempts=0,
            )
            for i in range(n)
        ]
    )


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99 and max of latencies (same unit as the samples)."""
    if not samples:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": ordered[-1]}


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def wait_until(predicate: Any, timeout: float, interval: float = 0.01) -> float:
    """Poll until `predicate()` is true; returns the elapsed seconds, raises on timeout."""
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"benchmark step did not finish within {timeout}s")
        time.sleep(interval)
    return time.perf_counter() - start


def count_rows(url: str, table: str, where: str = "true") -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()
    return int(row[0]) if row else 0


def machine(servers: Servers) -> dict[str, Any]:
    """What the numbers were measured on."""
    with psycopg.connect(servers.postgres.url) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', "
                "'max_connections')"
            ).fetchall()
        )
    memory_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kib = int(line.split()[1])
    except OSError:
        pass
    broker = "unknown"
    binary = getattr(servers.kafka, "binary", None)
    try:
        from outbox.testing.servers import find_tansu_binary

        path = binary or find_tansu_binary()
        broker = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except Exception:  # a broker we did not start: say so rather than guess
        broker = f"{servers.kafka.source} broker"
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgresql": pg_version[0] if pg_version else "unknown",
        "postgresql_settings": settings,
        "broker": broker,
    }


def write_results(
    results: list[Result],
    info: dict[str, Any],
    out_dir: Path,
    smoke: bool,
    *,
    complete: bool,
    quick: bool = False,
    name: str = "",
) -> tuple[Path, Path]:
    """Write `<stamp>[-name].json` and `.md` to `out_dir`; a complete, full-size run also
    becomes latest.*. Returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "-smoke" if smoke else "-quick" if quick else ""
    suffix += f"-{name}" if name else ""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + suffix
    data = {
        "machine": info,
        "smoke": smoke,
        "quick": quick,
        "results": [{k: v for k, v in asdict(r).items() if k != "samples"} for r in results],
        "targets": [asdict(v) for v in targets.judge(results)],
    }
    json_path = out_dir / f"{stamp}.json"
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md_path = out_dir / f"{stamp}.md"
    md_path.write_text(markdown(results, info, smoke, quick=quick))
    if complete and not smoke and not quick:
        (out_dir / "latest.json").write_text(json_path.read_text())
        (out_dir / "latest.md").write_text(md_path.read_text())
    return json_path, md_path


def _fmt(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def markdown(
    results: list[Result], info: dict[str, Any], smoke: bool, *, quick: bool = False
) -> str:
    """The results as markdown tables, one per scenario, then issue 26's targets beside them."""
    kind = (
        " (smoke run: sizes too small to quote)"
        if smoke
        else " (quick run: small sizes, read the ratios to the floors)"
        if quick
        else ""
    )
    lines = [
        f"# outbox benchmarks{kind}",
        "",
        f"{info['date']}: {info['cpus']} cores, {info['memory_gib']} GiB, {info['platform']}; "
        f"PostgreSQL {info['postgresql']} ({', '.join(f'{k}={v}' for k, v in sorted(info['postgresql_settings'].items()))}); "
        f"broker {info['broker']}; Python {info['python']}.",
        "",
    ]
    by_scenario: dict[str, list[Result]] = {}
    for r in results:
        by_scenario.setdefault(r.scenario, []).append(r)
    for scenario, rows in by_scenario.items():
        columns: list[str] = []
        for r in rows:
            columns += [c for c in r.metrics if c not in columns]
        lines += [f"## {scenario}", ""]
        lines.append("| variant | " + " | ".join(columns) + " | notes |")
        lines.append("|---|" + "---:|" * len(columns) + "---|")
        for r in rows:
            cells = [_fmt(r.metrics[c]) if c in r.metrics else "" for c in columns]
            lines.append(f"| {r.variant} | " + " | ".join(cells) + f" | {r.notes} |")
        lines.append("")
    if any("ratio" in r.metrics for r in results):
        lines += [
            "`figure`: the row's headline number; `floor`: the same work done by the bare loop "
            "of `benchmarks/floors.py` in this run; `ratio`: the share of the floor reached "
            "(figure / floor for rates, floor / figure for latencies; 1 = as good as the bare "
            "loop).",
            "",
        ]
    lines += targets.markdown(results)
    return "\n".join(lines)
