"""Tenants: one `outbox producer` and one `outbox handler` over many databases.

Two questions, each with the real daemons as separate processes:

1. Fairness. A quiet tenant sends one message every 50 ms while the same producer process
   drains another tenant's backlog; its delay (sender's commit -> the record's Kafka
   CreateTime) is compared with the same quiet tenant alone (its neighbour empty), for
   `--database-turns` 2 (the default) and 1.
2. Idle cost. N idle databases (default 50) served by one producer and one handler: the
   connections they hold (pg_stat_activity), the connections opened per second (the sum of
   pg_stat_database.sessions) and the CPU of both processes, with the databases kept connected
   (`--idle-disconnect 0`) and parked (`--idle-disconnect 2`, after they parked; the activity
   watch looking every second, and every 5 seconds); parked, the wake-up: one message to a
   tenant parked for a while, every 2 s, from its commit to its relay (producer_queue empty).
3. Scale (`--only scale`, `--scale 10,100`). One producer, one consumer and one handler over N
   tenant databases (each tenant's outbox and inbox in its own database, a quarantine database
   of its own), each daemon with `--max-connections` (`--budget`): the start-up (launch to
   every tenant's first message handled), each daemon's peak connections, RSS and threads,
   the commit-to-handled latency at 0.5 msg/s per tenant (p50, p99 over all, and the worst
   tenant's p99), the same while one tenant floods `--flood` messages, and the wake-up of
   tenants parked for a while (commit to handled, 10 of them, 2 s apart). Issue 36's targets
   beside them, in the Targets section (`benchmarks/targets.py`). Its floor, measured first in
   the same run: what a connect costs the machine (`connect_cost`: client and server CPU), and
   the connects each second that N tenants at 0.5 msg/s need at least under the budget
   (`connect_floor`), in cores.

`python -m benchmarks.tenants [--backlog N] [--databases N] [--seconds S] [--only scale
--scale 10,100 --budget 80 --flood 50000]` starts its own PostgreSQL and broker (the test
harness) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from benchmarks.harness import Context, Result, markdown, percentiles
from benchmarks.latency_handlers import SCHEMA as LATENCY_SCHEMA
from outbox import Broker, Message, settings
from outbox.core.lanes import lane_for
from outbox.testing.plugin import TANSU_CONSUMER_SETTINGS

#: Seconds the parked relays are left before their cost is measured: their own looks grow
#: apart (1.5 times each) for about this long before they reach their slowest.
SETTLE = 60.0
#: Seconds between two messages of the quiet tenant.
QUIET_EVERY = 0.05
#: Messages a second each tenant sends in the scale run's steady phases.
STEADY_RATE = 0.5


def _template(ctx: Context) -> str:
    """A migrated database to copy (CREATE DATABASE ... TEMPLATE): its name."""
    url = ctx.new_database()
    return url.rsplit("/", 1)[1]


def _copy(ctx: Context, template: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ctx.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return ctx.servers.postgres.url_for(name)


def _daemon(*args: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", *args],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _backlog(url: str, topic: str, n: int) -> None:
    """`n` rows in `producer_queue` over 64 keys, inserted in bulk (as `send` would store
    them: a key's lane is the crc32 of the key)."""
    lanes = [lane_for(f"k{i}".encode(), uuid.uuid4()) for i in range(64)]
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO outbox.producer_queue (message_id, topic, key, payload, content_type, lane) "
            "SELECT gen_random_uuid(), %(topic)s, convert_to('k' || (i %% 64), 'UTF8'), "
            "convert_to('{\"n\": ' || i || '}', 'UTF8'), 'application/json', "
            "(%(lanes)s::smallint[])[i %% 64 + 1] FROM generate_series(0, %(n)s - 1) AS i",
            {"topic": topic, "lanes": lanes, "n": n},
        )


def _quiet(url: str, topic: str, seconds: float) -> dict[int, float]:
    """Send one message every QUIET_EVERY seconds; the commit time of each, by its number."""
    broker = Broker()
    committed: dict[int, float] = {}
    deadline = time.monotonic() + seconds
    n = 0
    with psycopg.connect(url) as conn:
        while time.monotonic() < deadline:
            with conn.transaction():
                broker.send(conn, topic, {"n": n}, key=f"q{n % 4}")
            committed[n] = time.time()
            n += 1
            time.sleep(QUIET_EVERY)
    return committed


def _create_times(
    bootstrap: str, topic: str, expected: int, timeout: float = 60
) -> dict[int, float]:
    """The Kafka CreateTime (seconds) of each record of `topic`, by its payload's number."""
    import json

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    times: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(times) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        times[json.loads(message.value())["n"]] = message.timestamp()[1] / 1000.0
    consumer.close()
    return times


def fairness(ctx: Context, backlog: int, seconds: float) -> list[Result]:
    """The quiet tenant's delay alone and beside a backlog, for turns 2 and 1."""
    template = _template(ctx)
    results: list[Result] = []
    for variant, load, turns in (
        ("alone", 0, 2),
        ("beside a backlog, --database-turns 2", backlog, 2),
        ("beside a backlog, --database-turns 1", backlog, 1),
    ):
        quiet_url, busy_url = _copy(ctx, template), _copy(ctx, template)
        quiet_topic, busy_topic = ctx.new_topic("quiet"), ctx.new_topic("busy", 8)
        if load:
            _backlog(busy_url, busy_topic, load)
        log = ctx.out_dir / "tenants-producer.log"
        producer = _daemon(
            "producer",
            "--database-url", f"quiet={quiet_url}",
            "--database-url", f"busy={busy_url}",
            "--kafka-bootstrap", ctx.bootstrap,
            "--kafka-config", "linger.ms=0",
            "--database-turns", str(turns),
            log=log,
        )  # fmt: skip
        launched = time.time()
        drained: list[float] = []
        try:
            time.sleep(1.5)  # started: the busy relay is draining, the quiet one sleeping
            watcher = threading.Thread(target=_watch, args=(busy_url, drained), daemon=True)
            if load:
                watcher.start()
            committed = _quiet(quiet_url, quiet_topic, seconds)
            if load:
                watcher.join(600)
        finally:
            _stop(producer)
        created = _create_times(ctx.bootstrap, quiet_topic, len(committed))
        # Beside a backlog, only the messages committed while it was being drained count.
        until = drained[0] if drained else float("inf")
        delays = [
            (created[n] - committed[n]) * 1000
            for n in committed
            if n in created and committed[n] < until
        ]
        metrics = {f"{k} ms": v for k, v in percentiles(delays).items()}
        metrics["quiet messages"] = len(delays)
        if drained:
            metrics["busy backlog"] = load
            metrics["busy drained /s"] = load / (drained[0] - launched)
        results.append(Result("tenants fairness", variant, metrics, samples=delays))
    return results


def _watch(url: str, drained: list[float]) -> None:
    """Append the time (time.time()) at which `producer_queue` of `url` was first empty."""
    while _pending(url):
        time.sleep(0.05)
    drained.append(time.time())


def _pending(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
    return int(row[0]) if row else 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _connections(admin_url: str) -> int:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outbox-%'"
        ).fetchone()
    return int(row[0]) if row else 0


def _sessions(admin_url: str) -> int:
    """Sessions established so far on the server (every database's)."""
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SELECT sum(sessions) FROM pg_stat_database").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _wake_ups(urls: list[str], topic: str, count: int) -> list[float]:
    """Seconds from the commit of one message to a parked database to its relay, `count`
    times, a database each, 2 s apart."""
    took = []
    broker = Broker()
    for n in range(count):
        url = urls[(n * 7) % len(urls)]
        with psycopg.connect(url) as conn, conn.transaction():
            broker.send(conn, topic, {"n": n})
        sent = time.monotonic()
        while _pending(url):
            time.sleep(0.01)
        took.append(time.monotonic() - sent)
        time.sleep(2.0)
    return took


def idle_cost(ctx: Context, databases: int, seconds: float) -> list[Result]:
    """Connections and CPU of one producer + one handler over `databases` idle databases."""
    template = _template(ctx)
    urls = [_copy(ctx, template) for _ in range(databases)]
    file = ctx.out_dir / "tenants.txt"
    file.write_text("".join(f"t{i}={url}\n" for i, url in enumerate(urls)))
    results = []
    for variant, idle, poll in (
        ("connected (--idle-disconnect 0)", "0", "1"),
        ("parked (--idle-disconnect 2)", "2", "1"),
        ("parked, --poll-interval 5", "2", "5"),
    ):
        common = ("--databases-file", str(file), "--idle-disconnect", idle, "--poll-interval", poll)
        log = ctx.out_dir / "tenants-idle.log"
        processes = [
            _daemon("producer", *common, "--kafka-bootstrap", ctx.bootstrap, log=log),
            _daemon("handler", "benchmarks.latency_handlers:handlers", *common, log=log),
        ]
        try:
            # Every database joined (and, parked, left again: a relay notices that it has
            # been idle long enough at its next look, up to a poll interval later; then its
            # own looks grow apart for about a minute: the steady state is measured).
            time.sleep(8.0 + (2 * float(poll) + SETTLE if idle != "0" else 12.0))
            before = [_cpu_seconds(p.pid) for p in processes]
            sessions = _sessions(ctx.admin_url)
            peak = 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                peak = max(peak, _connections(ctx.admin_url))
                time.sleep(0.25)
            after = [_cpu_seconds(p.pid) for p in processes]
            # The measurement's own queries: about one session per 0.25 s, and two.
            opened = _sessions(ctx.admin_url) - sessions - seconds / 0.25 - 2
            woken = _wake_ups(urls, ctx.new_topic("tenants-wake"), 10) if idle != "0" else []
        finally:
            for process in processes:
                _stop(process)
        cpu = [(a - b) / seconds * 100 for a, b in zip(after, before, strict=True)]
        results.append(
            Result(
                "tenants idle cost",
                f"{databases} databases, {variant}",
                {
                    "connections (peak)": peak,
                    "connects/s (both)": max(0.0, opened) / seconds,
                    "producer CPU %": cpu[0],
                    "handler CPU %": cpu[1],
                    **(
                        {f"wake-up {k} ms": v * 1000 for k, v in percentiles(woken).items()}
                        if woken
                        else {}
                    ),
                },
            )
        )
    return results


def _proc(pid: int) -> tuple[float, int]:
    """RSS (MiB) and threads of process `pid`."""
    rss, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    """The CPU time every process of the machine has used since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def connect_cost(url: str, count: int = 200) -> tuple[float, float]:
    """A connect and close to `url` on this machine, `count` times in a row: its wall time
    and the CPU it costs the client and the server together (the machine's CPU time over the
    loop, so the machine should be otherwise quiet), in ms each."""
    busy, start = _busy_seconds(), time.perf_counter()
    for _ in range(count):
        psycopg.connect(url, application_name="outbox-bench-connect").close()
    wall = time.perf_counter() - start
    return wall * 1000 / count, (_busy_seconds() - busy) * 1000 / count


#: The daemons that each need a connection to a tenant's database for each of its messages.
DAEMONS = 3


def connect_floor(n: int, budget: int, rate: float, cpu_ms: float) -> tuple[float, float]:
    """The connects a second a set of daemons needs at least, and the cores they take: with
    `n` tenants each sending `rate` messages a second in turn and each daemon holding at most
    `budget` connections, at most `budget` tenants can stay connected, so a message of any
    other tenant needs a connect in each of the `DAEMONS` daemons (its relay or its writer)."""
    per_second = DAEMONS * n * rate * max(0.0, 1 - budget / n)
    return per_second, per_second * cpu_ms / 1000


def _by_daemon(admin_url: str) -> dict[str, int]:
    with psycopg.connect(admin_url) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE application_name LIKE 'outbox-%' GROUP BY 1"
        ).fetchall()
    return {str(name): int(n) for name, n in rows}


#: The sender's connection per tenant database, kept open: opening one per message held the
#: sender well under its schedule at 100 tenants (24 of 50 msg/s), not the daemons.
_SENDERS: dict[str, psycopg.Connection] = {}


def _sender(url: str) -> psycopg.Connection[Any]:
    """The benchmark's own connection to a tenant's database, kept open: it sends and reads
    arrivals on it. (A connect per look, 500 tenants every 0.5 s, was a connect storm of the
    benchmark's own beside the daemons it measures.)"""
    conn = _SENDERS.get(url)
    if conn is None or conn.closed:
        conn = _SENDERS[url] = psycopg.connect(url, application_name="bench-sender")
    return conn


def _send_one(url: str, tenant: str, topic: str) -> tuple[str, float]:
    conn = _sender(url)
    with conn.transaction():
        mid = Broker(tenant=tenant).send(conn, topic, {"t": tenant}, key=f"{tenant}-k")
    committed = time.time()
    return str(mid), committed


def _close_senders() -> None:
    for conn in _SENDERS.values():
        conn.close()
    _SENDERS.clear()


def _handled(url: str, mid: str) -> float | None:
    """When message `mid` was handled in the tenant's database (None: not yet)."""
    conn = _sender(url)
    with conn.transaction():
        row = conn.execute("SELECT started FROM arrivals WHERE message_id = %s", (mid,)).fetchone()
    return float(row[0]) if row else None


def _stages(urls: dict[str, str]) -> dict[str, tuple[float, float]]:
    """message id -> (handled, stored): the callback's clock and the start of the consumer's
    insert (`received_at`), over every tenant."""
    seen: dict[str, tuple[float, float]] = {}
    for url in urls.values():
        conn = _sender(url)
        with conn.transaction():
            for mid, started, received in conn.execute(
                "SELECT message_id, started, received FROM arrivals"
            ):
                seen[str(mid)] = (float(started), float(received))
    return seen


def _steady(
    urls: dict[str, str], topic: str, seconds: float, rate: float = 0.5
) -> dict[str, tuple[str, float]]:
    """Every tenant sends `rate` messages a second for `seconds`, spread evenly: message id ->
    (tenant, commit time)."""
    sent: dict[str, tuple[str, float]] = {}
    names = list(urls)
    gap = 1.0 / (rate * len(names))
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        name = names[n % len(names)]
        mid, committed = _send_one(urls[name], name, topic)
        sent[mid] = (name, committed)
        n += 1
        delay = start + n * gap - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return sent


def _latencies(
    urls: dict[str, str], sent: dict[str, tuple[str, float]], timeout: float = 120
) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
    """Commit-to-handled ms of `sent`, overall and per tenant (waiting up to `timeout`), and
    each hop's ms: commit -> stored (producer, transport, consumer) and stored -> handled."""
    deadline = time.monotonic() + timeout
    seen = _stages(urls)
    while any(mid not in seen for mid in sent) and time.monotonic() < deadline:
        time.sleep(1.0)
        seen = _stages(urls)
    per: dict[str, list[float]] = {}
    hops: dict[str, list[float]] = {"commit->stored": [], "stored->handled": []}
    for mid, (name, committed) in sent.items():
        if mid in seen:
            handled, stored = seen[mid]
            per.setdefault(name, []).append((handled - committed) * 1000)
            hops["commit->stored"].append((stored - committed) * 1000)
            hops["stored->handled"].append((handled - stored) * 1000)
    return [v for values in per.values() for v in values], per, hops


def _summary(
    prefix: str,
    everything: list[float],
    per: dict[str, list[float]],
    sent: int,
    hops: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    overall = percentiles(everything)
    worst = max((percentiles(v)["p99"] for v in per.values()), default=float("nan"))
    split = {
        f"{prefix} {hop} {q} ms": percentiles(values)[q]
        for hop, values in (hops or {}).items()
        for q in ("p50", "p99")
    }
    return {
        **split,
        f"{prefix} p50 ms": overall["p50"],
        f"{prefix} p99 ms": overall["p99"],
        f"{prefix} worst tenant p99 ms": worst,
        f"{prefix} handled": len(everything),
        f"{prefix} sent": sent,
    }


def scale(ctx: Context, n: int, seconds: float, budget: int, flood: int) -> Result:
    """One producer, consumer and handler over `n` tenant databases (see the module)."""
    topic = ctx.new_topic("tenants-scale", 8)
    template_url = ctx.new_database()
    with psycopg.connect(template_url) as conn:
        conn.execute(LATENCY_SCHEMA)
    template = template_url.rsplit("/", 1)[1]
    urls = {f"t{i}": _copy(ctx, template) for i in range(n)}
    quarantine = _copy(ctx, template)
    # The floor of what connects cost at this scale, measured before anything else runs.
    wall_ms, cpu_ms = connect_cost(urls["t0"])
    needed, cores = connect_floor(n, budget, STEADY_RATE, cpu_ms)
    file = ctx.out_dir / f"scale-{n}.txt"
    file.write_text("".join(f"{name}={url}\n" for name, url in urls.items()))
    common = ("--databases-file", str(file), "--max-connections", str(budget))
    relays = ("--idle-disconnect", "10")
    log = ctx.out_dir / f"tenants-scale-{n}.log"
    env_topic = {"LATENCY_TOPIC": topic}
    os.environ.update(env_topic)
    launched = time.time()
    processes = {
        "producer": _daemon("producer", *common, *relays, "--kafka-bootstrap", ctx.bootstrap, log=log),
        "consumer": _daemon(
            "consumer", *common, "--kafka-bootstrap", ctx.bootstrap, "--topic", topic,
            "--group", f"g-{topic}", "--quarantine-database", f"q={quarantine}",
            "--kafka-config", "fetch.wait.max.ms=50",
            *(f"--kafka-config={k}={v}" for k, v in TANSU_CONSUMER_SETTINGS.items()), log=log,
        ),
        "handler": _daemon(
            "handler", "benchmarks.latency_handlers:handlers", *common, *relays, "--concurrency", "4",
            log=log,
        ),
    }  # fmt: skip
    peaks: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            for name, count in _by_daemon(ctx.admin_url).items():
                peaks[name] = max(peaks.get(name, 0), count)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    metrics: dict[str, float] = {
        "tenants": n,
        "budget per daemon": budget,
        "connect wall ms": wall_ms,
        "connect CPU ms": cpu_ms,
        "connect floor connects/s": needed,
        "connect floor cores": cores,
        "cores": float(os.cpu_count() or 1),
    }
    try:
        first = {name: _send_one(url, name, topic) for name, url in urls.items()}
        deadline = time.monotonic() + 300
        seen: dict[str, float] = {}
        while time.monotonic() < deadline and len(seen) < len(first):
            for name, (mid, _) in first.items():
                if name not in seen:
                    handled = _handled(urls[name], mid)
                    if handled is not None:
                        seen[name] = handled
            time.sleep(0.5)
        metrics["start-up s (all handled)"] = (
            max(seen.values()) - launched if len(seen) == len(first) else float("nan")
        )
        metrics["start-up first messages handled"] = len(seen)
        cpu = {daemon: _cpu(process.pid) for daemon, process in processes.items()}
        sent = _steady(urls, topic, seconds, STEADY_RATE)
        for daemon, process in processes.items():
            used = _cpu(process.pid) - cpu[daemon]
            metrics[f"{daemon} CPU ms per message"] = used * 1000 / max(1, len(sent))
        everything, per, hops = _latencies(urls, sent)
        metrics.update(_summary("0.5 msg/s", everything, per, len(sent), hops))
        for daemon, process in processes.items():
            rss, threads = _proc(process.pid)
            metrics[f"{daemon} RSS MiB"] = rss
            metrics[f"{daemon} threads"] = threads
        # A noisy neighbour: t0 floods while the others keep sending.
        noisy = urls["t0"]
        quiet = {name: url for name, url in urls.items() if name != "t0"}
        with psycopg.connect(noisy) as conn:
            broker = Broker(tenant="t0")
            for start in range(0, flood, 5000):
                with conn.transaction():
                    broker.send_many(
                        conn,
                        [
                            Message(topic, {"n": i}, key=f"f{i % 64}")
                            for i in range(start, min(flood, start + 5000))
                        ],
                    )
        sent = _steady(quiet, topic, seconds, STEADY_RATE)
        everything, per, hops = _latencies(quiet, sent)
        metrics.update(_summary("beside a flood", everything, per, len(sent), hops))
        # Parked tenants: every relay idle for its --idle-disconnect (10 s) and more.
        time.sleep(25.0)
        woken = []
        for i in range(10):
            name = list(quiet)[(i * 7) % len(quiet)]
            mid, committed = _send_one(urls[name], name, topic)
            handled = None
            until = time.monotonic() + 60
            while handled is None and time.monotonic() < until:
                handled = _handled(urls[name], mid)
                time.sleep(0.02)
            if handled is not None:
                woken.append((handled - committed) * 1000)
            time.sleep(2.0)
        metrics.update({f"parked wake-up {k} ms": v for k, v in percentiles(woken).items()})
    finally:
        stop.set()
        sampler.join(5)
        for process in processes.values():
            _stop(process)
        _close_senders()
    for daemon in processes:
        metrics[f"{daemon} connections (peak)"] = peaks.get(f"outbox-{daemon}", 0)
    return Result("tenants scale", f"{n} tenants, --max-connections {budget}", metrics)


def main(argv: list[str] | None = None) -> int:
    """Fairness and idle cost of one producer and one handler over many databases."""
    from benchmarks.harness import machine, write_results
    from outbox.testing.servers import start_servers

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tenants", description=main.__doc__)
    parser.add_argument("--out", type=Path, help="also write <stamp>-tenants-*.json and .md here")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="the busy tenant's rows")
    parser.add_argument("--databases", type=int, default=50, help="idle databases")
    parser.add_argument("--seconds", type=float, default=10.0, help="each measurement's length")
    parser.add_argument("--only", choices=("fairness", "idle", "scale"), default=None)
    parser.add_argument("--scale", default="10,100", help="the scale run's tenant counts")
    parser.add_argument("--budget", type=int, default=150, help="scale: --max-connections")
    parser.add_argument(
        "--flood", type=int, default=50_000, help="scale: the noisy tenant's messages"
    )
    args = parser.parse_args(argv)
    if args.only in (None, "scale"):
        # Three daemons' budgets beside the sender's connection per tenant and the measurement's.
        largest = max(int(part) for part in args.scale.split(","))
        needed = 3 * args.budget + largest + 60
        os.environ.setdefault(settings.TEST_PG_MAX_CONNECTIONS, str(max(300, needed)))
    base = Path(tempfile.mkdtemp(prefix="outbox-tenants-"))
    with start_servers(base) as servers:
        ctx = Context(servers=servers, smoke=False, out_dir=base)
        results: list[Result] = []
        if args.only in (None, "fairness"):
            results += fairness(ctx, args.backlog, args.seconds)
        if args.only in (None, "idle"):
            results += idle_cost(ctx, args.databases, args.seconds)
        if args.only in (None, "scale"):
            for n in (int(part) for part in args.scale.split(",")):
                results.append(scale(ctx, n, args.seconds, args.budget, args.flood))
        info = machine(servers)
        print(markdown(results, info, False))
        if args.out is not None:
            name = "tenants" + (f"-{args.only}" if args.only else "")
            if args.only == "scale":
                name += "-" + args.scale.replace(",", "-")
            for path in write_results(results, info, args.out, False, complete=False, name=name):
                print(f"results: {path}")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "tenants"
    sys.exit(main())
