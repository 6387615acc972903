"""The benchmark suite still runs: every scenario but Spark's, at smoke sizes.

Two scenarios had stopped working after a refactor and nothing noticed until the next complete
benchmark run. This runs `python -m benchmarks --smoke` (it starts its own servers) and checks
that each scenario produced rows; the numbers of a smoke run mean nothing and are not checked.
Spark's scenario is left out for its minute of JVM start-up (tests/spark covers its code).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = {
    "ceilings": "ceilings",
    "a": "a. send overhead",
    "b": "b. relay throughput",
    "c": "c. inbox throughput",
    "d": "d. handler throughput",
    "e": "e. end-to-end latency",
    "f": "f. backlog and retention",
    "w": "w. whole path, three daemons at once",
    "transports": "transports: Kafka (Tansu) and the PostgreSQL log side by side",
    "http": "http. outbox serve",
}


@pytest.mark.slow
def test_every_benchmark_scenario_runs_at_smoke_size(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--smoke",
            "--only",
            ",".join(SCENARIOS),
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (written,) = tmp_path.glob("*-smoke.json")
    rows = json.loads(written.read_text())["results"]
    produced = {row["scenario"] for row in rows}
    missing = [key for key, name in SCENARIOS.items() if name not in produced]
    assert not missing, f"scenarios without rows: {missing}\n{result.stderr[-4000:]}"
