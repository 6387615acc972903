"""(http) `outbox serve`, each figure beside a floor measured in the same run.

- publish: messages/s published over HTTP by 8 client threads on keep-alive connections, one
  message and batches of 100 per request, against the same stack with a bare INSERT in place of
  `send_many` (`benchmarks.http_floor_app`: FastAPI on uvicorn, the same connection pool, the
  same body model; one INSERT of the request's rows);
- pull: records/s one client reads from a subscription over HTTP (`next` then `ack`), 100 and
  1,000 records a request, against the log's bare subscriber (`transports.log_read`: one
  `PgLogSubscriber` member, poll(1000) + commit);
- latency: publish -> pull at 100 messages/s (one publish a request, the Producer relaying into
  the log, one client long-polling `next?ack=auto`), p50 and p99, against the log's bare round
  trip at the same rate (`transports.log_floor`).

`python -m benchmarks --quick --only http`.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.floors import against_floor
from benchmarks.harness import Context, Result, percentiles
from benchmarks.transports import log_floor, log_read, log_write

SCENARIO = "http. outbox serve"
CLIENTS = 8
PAYLOAD = {"order_id": "o-1", "note": "x" * 60}


def _wait_up(port: int, process: subprocess.Popen[bytes], path: str = "/livez") -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", path)
            if connection.getresponse().status in (200, 404, 405):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the server did not start")


@contextmanager
def _process(args: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[None]:
    process = subprocess.Popen(
        args,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_up(port, process)
        yield
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _free_port() -> int:
    from outbox.testing.servers import free_port

    return free_port()


@contextmanager
def serve(url: str, log_url: str) -> Iterator[int]:
    """`outbox serve` over `url` and the log at `log_url`; its port."""
    port = _free_port()
    args = [sys.executable, "-m", "outbox", "serve", "--database-url", url]
    args += ["--transport", "postgres", "--log-url", log_url, "--port", str(port)]
    with _process(args, port):
        yield port


@contextmanager
def floor_server(url: str) -> Iterator[int]:
    """The same stack with a bare INSERT (benchmarks.http_floor_app); its port."""
    port = _free_port()
    args = [sys.executable, "-m", "uvicorn", "benchmarks.http_floor_app:app"]
    args += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    with _process(args, port, {"BENCH_HTTP_FLOOR_URL": url}):
        yield port


@contextmanager
def producer(url: str, log_url: str) -> Iterator[None]:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "outbox", "producer", "--database-url", url),
            *("--transport", "postgres", "--log-url", log_url, "--poll-interval", "0.05"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(2.0)
        yield
    finally:
        process.terminate()
        process.wait(30)


def _post_all(port: int, path: str, bodies: list[Any]) -> float:
    """Requests/s of POSTing `bodies` from CLIENTS threads on keep-alive connections."""
    chunks = [bodies[k::CLIENTS] for k in range(CLIENTS)]
    failures: list[str] = []

    def client(mine: list[Any]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for body in mine:
            connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            if answer.status >= 300:
                failures.append(f"{answer.status}")
        connection.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in chunks]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, e.g. {failures[0]}")
    return len(bodies) / elapsed


def publish(ctx: Context, url: str, log_url: str) -> list[Result]:
    singles = ctx.scale(20_000, 200, 2_000)
    batches = ctx.scale(1_000, 10, 100)
    one = [{"payload": PAYLOAD, "key": f"k{i % 64}"} for i in range(singles)]
    hundred = [
        [{"payload": PAYLOAD, "key": f"k{(b * 100 + i) % 64}"} for i in range(100)]
        for b in range(batches)
    ]
    with serve(url, log_url) as port:
        single_rate = _post_all(port, "/v1/topics/bench.http/messages", one)
        batch_rate = _post_all(port, "/v1/topics/bench.http/messages", hundred) * 100
    with floor_server(url) as port:
        floor_single = _post_all(port, "/bare", one)
        floor_batch = _post_all(port, "/bare", hundred) * 100
    note = f"{CLIENTS} client threads, keep-alive; floor: the same stack, a bare INSERT"
    return [
        Result(
            SCENARIO,
            "publish, 1 message a request",
            against_floor({"messages": singles, "msg/s": single_rate}, single_rate, floor_single),
            notes=note,
        ),
        Result(
            SCENARIO,
            "publish, 100 messages a request",
            against_floor(
                {"messages": batches * 100, "msg/s": batch_rate}, batch_rate, floor_batch
            ),
            notes=note,
        ),
    ]


def _pull_rate(port: int, topic: str, name: str, expected: int, size: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    base = f"/v1/topics/{topic}/subscriptions/{name}"
    connection.request("PUT", base, '{"start": "earliest"}', {"Content-Type": "application/json"})
    connection.getresponse().read()
    got = 0
    started = time.perf_counter()
    while got < expected:
        connection.request("GET", f"{base}/next?max={size}&wait_ms=1000")
        answer = connection.getresponse()
        body = answer.read()
        if answer.status == 204:
            raise RuntimeError(f"pull stalled at {got} of {expected}")
        found = json.loads(body)
        got += len(found["records"])
        connection.request(
            "POST",
            f"{base}/ack",
            json.dumps({"cursor": found["cursor"]}),
            {"Content-Type": "application/json"},
        )
        connection.getresponse().read()
    return got / (time.perf_counter() - started)


def pull(ctx: Context, url: str, log_url: str) -> list[Result]:
    records = ctx.scale(100_000, 2_000, 20_000)
    topic = f"bench.pull.{uuid.uuid4().hex[:8]}"
    log_write(log_url, topic, records)
    floor = log_read(log_url, topic, records)
    results = []
    with serve(url, log_url) as port:
        for size in (100, 1000):
            rate = _pull_rate(port, topic, f"s{size}", records, size)
            results.append(
                Result(
                    SCENARIO,
                    f"pull, {size} records a request",
                    against_floor({"records": records, "records/s": rate}, rate, floor),
                    notes="one client, next then ack; floor: one PgLogSubscriber member, "
                    "poll(1000) + commit",
                )
            )
    return results


def latency(ctx: Context, url: str, log_url: str) -> list[Result]:
    rate = 100
    seconds = 2.0 if ctx.smoke else 10.0 if ctx.quick else 30.0
    count = int(rate * seconds)
    topic = f"bench.latency.{uuid.uuid4().hex[:8]}"
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}
    with serve(url, log_url) as port, producer(url, log_url):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Content-Type": "application/json"}
        connection.request(
            "POST", "/v1/topics", json.dumps({"name": topic, "partitions": 8}), headers
        )
        connection.getresponse().read()
        connection.request("PUT", f"/v1/topics/{topic}/subscriptions/lat", "{}", headers)
        connection.getresponse().read()
        done = threading.Event()

        def puller() -> None:
            reader = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            path = f"/v1/topics/{topic}/subscriptions/lat/next?ack=auto&max=100&wait_ms=500"
            while not done.is_set():
                reader.request("GET", path)
                answer = reader.getresponse()
                body = answer.read()
                now = time.time()
                if answer.status == 200:
                    for record in json.loads(body)["records"]:
                        arrived[record["message_id"]] = now

        thread = threading.Thread(target=puller)
        thread.start()
        start = time.time() + 0.2
        for n in range(count):
            pause = start + n / rate - time.time()
            if pause > 0:
                time.sleep(pause)
            message_id = str(uuid.uuid4())
            sent[message_id] = time.time()
            body = json.dumps({"payload": PAYLOAD, "key": f"k{n}", "message_id": message_id})
            connection.request("POST", f"/v1/topics/{topic}/messages", body, headers)
            connection.getresponse().read()
        deadline = time.monotonic() + 30
        while len(arrived) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        thread.join(30)
    samples = [(arrived[m] - t) * 1000 for m, t in sent.items() if m in arrived]
    p = percentiles(samples)
    floor = log_floor(log_url, rate, seconds, 1)
    metrics = against_floor(
        {
            "messages": count,
            "received": len(samples),
            "p50 ms": p["p50"],
            "p99 ms": p["p99"],
            "floor p99 ms": floor.metrics["p99 ms"],
        },
        p["p50"],
        floor.metrics["p50 ms"],
        lower_is_better=True,
    )
    return [
        Result(
            SCENARIO,
            f"publish -> pull latency, {rate}/s",
            metrics,
            notes="HTTP publish -> Producer -> log -> next?ack=auto (woken by the appends); floor: the "
            "log's bare round trip at the same rate",
            samples=samples,
        ),
        floor,
    ]


def run(ctx: Context) -> list[Result]:
    from outbox.pglog import log as pglog

    url = ctx.new_database()
    log_url = ctx.new_database(migrated=False)
    pglog.upgrade(log_url)
    return [*publish(ctx, url, log_url), *pull(ctx, url, log_url), *latency(ctx, url, log_url)]
