"""PostgreSQL's own ceilings on this machine, measured in the same run as outbox.

pgbench with 16 clients: BEGIN; INSERT; COMMIT and the same with NOTIFY; batched multi-row
INSERT rows/s and COPY rows/s from one connection.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks.harness import Context, Result

SCRIPTS = {
    "pgbench 16 clients: BEGIN; INSERT; COMMIT": "BEGIN;\nINSERT INTO t (v) VALUES ('x');\nCOMMIT;\n",
    "pgbench 16 clients: BEGIN; INSERT; NOTIFY; COMMIT": (
        "BEGIN;\nINSERT INTO t (v) VALUES ('x');\nNOTIFY t;\nCOMMIT;\n"
    ),
}


def _pgbench(ctx: Context, url: str, script: str, seconds: int) -> float:
    bindir = getattr(ctx.servers.postgres, "bindir", None)
    pgbench = str(Path(bindir) / "pgbench") if bindir else "pgbench"
    folder = Path(tempfile.mkdtemp(prefix="outbox-pgbench-"))
    path = folder / "script.sql"
    path.write_text(script)
    os.chmod(folder, 0o755)
    os.chmod(path, 0o644)
    conninfo = psycopg.conninfo.conninfo_to_dict(url)
    result = subprocess.run(
        [
            pgbench,
            "-n",
            "-h",
            str(conninfo["host"]),
            "-p",
            str(conninfo["port"]),
            "-U",
            str(conninfo["user"]),
            "-c",
            "16",
            "-j",
            "2",
            "-T",
            str(seconds),
            "-f",
            str(path),
            str(conninfo["dbname"]),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if not match:
        raise RuntimeError(f"pgbench failed: {result.stderr[-500:]}")
    return float(match.group(1))


def run(ctx: Context) -> list[Result]:
    url = ctx.new_database(migrated=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigserial PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE b (id bigserial PRIMARY KEY, payload bytea)")
    seconds = 2 if ctx.smoke else 5
    results = [
        Result("ceilings", label, {"commits/s": _pgbench(ctx, url, script, seconds)})
        for label, script in SCRIPTS.items()
    ]
    rows = ctx.scale(200_000, 20_000)
    payload = b"x" * 100
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for offset in range(0, rows, 1000):
            n = min(1000, rows - offset)
            conn.execute("INSERT INTO b (payload) SELECT unnest(%s::bytea[])", ([payload] * n,))
        results.append(
            Result(
                "ceilings",
                "batched INSERT, 1,000 rows a statement",
                {"rows/s": rows / (time.perf_counter() - start)},
            )
        )
        start = time.perf_counter()
        with conn.cursor().copy("COPY b (payload) FROM STDIN") as copy:
            for _ in range(rows):
                copy.write_row((payload,))
        results.append(Result("ceilings", "COPY", {"rows/s": rows / (time.perf_counter() - start)}))
    return results
