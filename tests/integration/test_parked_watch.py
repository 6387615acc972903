"""Parked relays woken by the activity watch (outbox/postgres/activity.py): one connection per
server looks at every parked database's statistics, so a quiet database's first message is
relayed within about a poll interval although its relay's own looks have grown far apart."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from outbox import Broker
from outbox.core.databases import Database
from outbox.daemons import relay as relay_module
from outbox.daemons.producer import Producer
from outbox.postgres.activity import PostgresActivity
from outbox.runtime import App, Settings
from outbox.runtime.app import Supervised, postgres_stores
from outbox.runtime.settings import Databases, ProducerConfig
from outbox.testing.memory import InMemoryTransport
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import count, wait_for

POLL = 0.3


def _activity_connections(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-activity'"
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _producers(urls: dict[str, str], idle: float = 0.5) -> Iterator[Supervised[Producer]]:
    transport = InMemoryTransport()
    settings = Settings(
        databases=dataclasses.replace(
            Databases.of(*(f"{name}={url}" for name, url in urls.items())), idle_disconnect=idle
        ),
        producer=ProducerConfig(poll_interval=POLL, connect_timeout=5),
    )
    app = App(settings, stores=postgres_stores(), publishers=transport.publisher)
    part = app.part("producer")
    assert isinstance(part, Supervised)
    thread = threading.Thread(target=part.run, daemon=True)
    thread.start()
    try:
        yield part
    finally:
        part.stop()
        thread.join(30)
        assert not thread.is_alive()


def test_a_parked_database_is_woken_by_its_servers_statistics_not_by_looking_into_each(
    outbox_database_factory: DatabaseFactory, outbox_topic: str
) -> None:
    urls = {f"t{i}": outbox_database_factory() for i in range(3)}
    with _producers(urls) as part:
        wait_for(
            lambda: len(part.relays()) == 3 and all(r.parked and r.watched for r in part.relays()),
            30,
            "every relay parked and watched",
        )
        for relay in part.relays():
            relay.parked_interval = 60.0  # parked long ago: its own looks at the most apart
        time.sleep(3 * POLL)  # each relay's wait now started after that: at least 7.2 s long
        assert _activity_connections(urls["t0"]) == 1  # one for the server, not per database
        url = urls["t1"]
        with psycopg.connect(url) as conn, conn.transaction():
            Broker().send(conn, outbox_topic, {"n": 1}, key="k")
        sent = time.monotonic()
        wait_for(lambda: count(url) == 0, 30, "the send to a parked database relayed", 0.02)
        took = time.monotonic() - sent
    longest = POLL * relay_module.PARKED_WATCHED_SLOWDOWN * (1 - relay_module.PARKED_JITTER)
    assert took < 2.0 < longest - 3 * POLL, f"woken after {took:.2f} s"


def test_the_watch_reports_the_databases_whose_rows_grew_and_not_the_others(
    outbox_database_factory: DatabaseFactory, outbox_topic: str
) -> None:
    urls = {f"t{i}": outbox_database_factory() for i in range(2)}
    databases = [Database(name, url, "outbox") for name, url in urls.items()]
    watch = PostgresActivity(5)
    try:
        assert watch.changed(databases) == {"t0": False, "t1": False}  # a first count
        with psycopg.connect(urls["t1"]) as conn, conn.transaction():
            Broker().send(conn, outbox_topic, {"n": 1})
        seen: dict[str, bool] = {}

        def grew() -> bool:
            seen.update(watch.changed(databases))
            return seen.get("t1", False)

        wait_for(grew, 15, "t1's insert counted")
        assert seen["t0"] is False
        unreachable = Database("gone", "postgresql://u@127.0.0.1:1/gone", "outbox")
        answer = watch.changed([*databases, unreachable])
        assert "gone" not in answer and set(answer) == {"t0", "t1"}  # not watched, no error
    finally:
        watch.close()


def test_a_relay_woken_by_writes_to_other_tables_parks_again_at_once_and_by_a_send_relays(
    outbox_database_factory: DatabaseFactory, outbox_topic: str
) -> None:
    """The watch's word is enough to take the lanes back (no look on a connection of its own
    first: one connect, not two); writes that were not sends leave it parked again at once,
    not after --idle-disconnect."""
    urls = {f"t{i}": outbox_database_factory() for i in range(2)}
    url = urls["t1"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE business (n int)")
    with _producers(urls) as part:
        wait_for(
            lambda: len(part.relays()) == 2 and all(r.parked and r.watched for r in part.relays()),
            30,
            "every relay parked and watched",
        )
        relay = part.supervisor._served["t1"].relay
        served: list[float] = []
        looks: list[float] = []
        serve, rows_waiting = relay._serve, relay._rows_waiting

        def counted_serve(conn: object) -> None:
            served.append(time.monotonic())
            serve(conn)  # type: ignore[arg-type]

        def counted_look() -> bool:
            looks.append(time.monotonic())
            return rows_waiting()

        relay._serve = counted_serve  # type: ignore[method-assign]
        relay._rows_waiting = counted_look  # type: ignore[method-assign]
        relay.idle_disconnect = 60.0  # an idle relay would hold its connection for a minute
        relay.parked_interval = 60.0
        # After its next look of its own, the one after is at least 7.2 s away.
        wait_for(lambda: looks, 15, "a look of its own", 0.02)
        looks.clear()
        with psycopg.connect(url) as conn, conn.transaction():
            conn.execute("INSERT INTO business VALUES (1)")
        wait_for(lambda: len(served) == 1, 10, "the nudged relay to take its lanes back", 0.02)
        wait_for(lambda: relay.parked, 10, "the relay parked again", 0.02)
        assert time.monotonic() - served[0] < 5.0  # at once, not after --idle-disconnect
        assert looks == []  # no look of its own first
        with psycopg.connect(url) as conn, conn.transaction():
            Broker().send(conn, outbox_topic, {"n": 1}, key="k")
        wait_for(lambda: count(url) == 0, 30, "the send relayed", 0.02)
        assert len(served) == 2 and looks == []
