"""Lane ownership and relay liveness when a cluster or a database holds several outboxes."""

from __future__ import annotations

import random
import string
import uuid
import zlib
from typing import Any

import psycopg
import pytest
from psycopg import sql

from outbox.core.errors import ConfigurationError
from outbox.core.lanes import LANES
from outbox.daemons.producer import Producer
from outbox.postgres import migrate
from outbox.postgres.queries import queries
from outbox.testing.memory import InMemoryTransport

from .relay_helpers import app_of, count, producer_thread, wait_for

_memory = InMemoryTransport().publisher


def _owns_every_lane(relay: Producer) -> bool:
    return len(relay.lanes) == LANES


def test_relays_of_two_databases_on_one_cluster_each_own_every_lane(
    outbox_database_factory: Any, outbox_kafka_bootstrap: str
) -> None:
    """Advisory locks belong to a database: a relay of another database takes none of ours."""
    first, second = outbox_database_factory(), outbox_database_factory()
    with producer_thread(first, outbox_kafka_bootstrap, rebalance_interval=0.2) as one:
        wait_for(lambda: _owns_every_lane(one), 10, "the first relay to own every lane")
        with producer_thread(second, outbox_kafka_bootstrap, rebalance_interval=0.2) as two:
            wait_for(lambda: _owns_every_lane(two), 10, "the second relay to own every lane")
            assert _owns_every_lane(one)


def test_relays_of_two_schemas_in_one_database_each_own_every_lane(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    url = outbox_database_url
    migrate.upgrade(url, "billing")
    with (
        producer_thread(url, outbox_kafka_bootstrap, rebalance_interval=0.2) as one,
        producer_thread(
            url, outbox_kafka_bootstrap, rebalance_interval=0.2, schema="billing"
        ) as two,
    ):
        wait_for(
            lambda: _owns_every_lane(one) and _owns_every_lane(two), 10, "both to own every lane"
        )


def _colliding_schemas() -> tuple[str, str]:
    """Two schema names whose producer_queue lanes would share a lock class (crc32)."""
    seen: dict[int, str] = {}
    rng = random.Random(0)  # names of sequential numbers differ in too few bits to collide
    for _ in range(2_000_000):
        name = "s" + "".join(rng.choices(string.ascii_lowercase, k=12))
        crc = zlib.crc32(f"{name}.producer_queue".encode()) & 0x7FFFFFFF
        if crc in seen:
            return seen[crc], name
        seen[crc] = name
    raise AssertionError("no collision found")  # pragma: no cover


def test_a_relay_refuses_a_lock_class_another_queue_of_its_database_has(
    outbox_database_url: str,
) -> None:
    ours, theirs = _colliding_schemas()
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        for name in (ours, theirs):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            conn.execute(
                sql.SQL("CREATE TABLE {}.producer_queue (id bigint)").format(sql.Identifier(name))
            )
        relay = app_of(outbox_database_url, schema=ours, publishers=_memory).producer()
        with relay.connect() as session, pytest.raises(ConfigurationError, match="crc32 collision"):
            relay.check_lock_class(session)
        other = app_of(outbox_database_url, publishers=_memory).producer()
        with other.connect() as session:
            other.check_lock_class(session)


def _backend(url: str) -> tuple[psycopg.Connection[Any], int]:
    conn = psycopg.connect(url, autocommit=True)
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return conn, int(row[0])


def _stale_row(url: str, relay_id: str, pid: int, backend_start: str | None) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping, "
            "backend_start) VALUES (%s, 'producer', %s, true, %s)",
            (relay_id, pid, backend_start),
        )


def test_a_dead_relays_row_is_forgotten_even_if_its_pid_is_alive_elsewhere(
    outbox_database_factory: Any, outbox_kafka_bootstrap: str
) -> None:
    """A row whose pid now belongs to a session of another database, or to another session of
    this one (a reused pid: another backend_start), is a dead relay's: it keeps no share of the
    lanes, and no writer NOTIFYs for it."""
    url, elsewhere = outbox_database_factory(), outbox_database_factory()
    other_db, other_pid = _backend(elsewhere)
    reused, reused_pid = _backend(url)
    with other_db, reused:
        _stale_row(url, "other-database", other_pid, None)
        _stale_row(url, "reused-pid", reused_pid, "2000-01-01T00:00:00Z")
        with producer_thread(url, outbox_kafka_bootstrap, rebalance_interval=0.2) as relay:
            wait_for(lambda: _owns_every_lane(relay), 10, "the relay to own every lane")
            with psycopg.connect(url) as conn:
                ids = [r[0] for r in conn.execute("SELECT relay_id FROM outbox.relay_state")]
            assert ids == [relay.relay_id]


def test_a_live_relay_of_a_role_that_cannot_see_its_backend_start_is_kept(
    outbox_database_url: str, outbox_admin_url: str
) -> None:
    """pg_stat_activity hides backend_start of other roles' sessions (without
    pg_read_all_stats): a relay must not take that for a dead one."""
    url = outbox_database_url
    role = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA outbox TO {}").format(sql.Identifier(role)))
        admin.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.relay_state TO {}").format(
                sql.Identifier(role)
            )
        )
    statements = queries("outbox")
    try:
        with psycopg.connect(url, autocommit=True) as live:  # a relay of the superuser
            live.execute(statements["relay_register"], {"relay_id": "live", "queue": "producer"})
            unprivileged = psycopg.conninfo.make_conninfo(url, user=role)
            with psycopg.connect(unprivileged, autocommit=True) as other:
                hidden = other.execute(
                    "SELECT backend_start FROM pg_stat_activity WHERE pid = %s",
                    (live.info.backend_pid,),
                ).fetchone()
                assert hidden == (None,), "the test needs a backend_start it cannot see"
                other.execute(statements["relay_forget_dead"])
            assert count(url, "relay_state", "relay_id = 'live'") == 1
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statements["relay_forget_dead"])
        assert count(url, "relay_state") == 0, "gone with its session"
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
