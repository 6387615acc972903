"""The log's subscriptions under many clients at once, straight on the log (no HTTP): clients
that take partitions in different orders never deadlock, and each record goes to one client."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import psycopg

from outbox.pglog import PgLog, PgLogPublisher
from outbox.pglog.subscriptions import Subscriptions

from .test_pglog import message
from .test_pglog_topics import log_url  # noqa: F401  (the fixture)

PARTITIONS = 8
RECORDS = 400


def test_clients_taking_partitions_in_any_order_never_deadlock_and_share_the_records(
    log_url: str,  # noqa: F811
) -> None:
    PgLog(log_url).create_topic("many", PARTITIONS)
    subs = Subscriptions("outbox_log")
    with psycopg.connect(log_url) as conn:
        assert subs.subscribe(conn, "many", "all", earliest=True)
    publisher = PgLogPublisher(log_url, partitions=PARTITIONS)
    try:
        outcome = publisher.publish(
            [message("many", n, f"k{n % 32}".encode()) for n in range(RECORDS)]
        )
        assert outcome == [None] * RECORDS
    finally:
        publisher.close()

    got: dict[int, list[int]] = defaultdict(list)  # partition: offsets, in the order handed
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client() -> None:
        try:
            with psycopg.connect(log_url) as conn:
                while sum(len(v) for v in got.values()) < RECORDS:
                    with conn.transaction():
                        leased = subs.next(conn, "many", "all", limit=3, lease=30)
                        # Hold the transaction a while with partitions taken, as a slow
                        # server would: the clients' takes overlap in every order.
                        time.sleep(0.002)
                    if leased.cursor is None:
                        continue
                    with lock:
                        for record in leased.records:
                            got[record.partition].append(record.offset)
                    with conn.transaction():
                        assert subs.ack(conn, "many", "all", leased.cursor)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert sum(len(v) for v in got.values()) == RECORDS
    for partition, offsets in got.items():
        assert offsets == sorted(set(offsets)), partition  # once each, in order
    with psycopg.connect(log_url) as conn:
        assert sum(lag.lag for lag in subs.lag(conn, "many", "all")) == 0
        # Every lease ended: none leased, and a new take finds nothing.
        assert not any(lag.leased for lag in subs.lag(conn, "many", "all"))
        assert subs.next(conn, "many", "all", limit=10, lease=30).records == ()
