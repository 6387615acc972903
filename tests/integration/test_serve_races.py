"""`outbox serve` under plain concurrency: clients of one subscription or one inbox at once
with the requests that change it, answered without a 5xx (docs/http.md)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from outbox.pglog import PgLog, PgLogPublisher

from .serve_support import Server, serving
from .test_pglog import message


@pytest.fixture
def server(outbox_database_url: str, outbox_log_url: str) -> Iterator[Server]:
    with serving(outbox_database_url, outbox_log_url) as running:
        yield running


def test_an_unsubscribe_while_clients_pull_and_ack_is_never_a_5xx(
    server: Server, outbox_log_url: str
) -> None:
    """An unsubscribe (and a subscribe again) while clients take, auto-acknowledge and
    acknowledge: the delete held the subscription's group row and waited for a lease a client
    held, which waited for the group row to write a position; PostgreSQL broke the deadlock
    and the loser was answered 503. Now each request is answered as if alone (404 once the
    subscription is gone)."""
    PgLog(outbox_log_url).create_topic("churned", 4)
    base = "/v1/topics/churned/subscriptions/all"
    assert server.call("PUT", base, {"start": "earliest"})[0] == 201
    publisher = PgLogPublisher(outbox_log_url, partitions=4)
    try:
        publisher.publish([message("churned", n, f"k{n % 32}".encode()) for n in range(3000)])
    finally:
        publisher.close()
    statuses: Counter[tuple[str, int]] = Counter()
    stop = threading.Event()

    def client(mode: str) -> None:
        while not stop.is_set():
            status, got = server.call("GET", f"{base}/next?max=3&ack={mode}")
            statuses["next", status] += 1
            if status == 200 and got["cursor"] is not None:
                status, _ = server.call("POST", f"{base}/ack", {"cursor": got["cursor"]})
                statuses["ack", status] += 1

    def churn() -> None:
        try:
            for _ in range(60):
                statuses["delete", server.call("DELETE", base)[0]] += 1
                statuses["put", server.call("PUT", base, {"start": "earliest"})[0]] += 1
        finally:
            stop.set()

    threads = [threading.Thread(target=client, args=(m,)) for m in ["auto", "manual"] * 3]
    threads.append(threading.Thread(target=churn))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert statuses["delete", 204] == statuses["put", 201] == 60, statuses
    assert not [k for k in statuses if k[1] >= 500], (statuses, server.daemon.output()[-3000:])
