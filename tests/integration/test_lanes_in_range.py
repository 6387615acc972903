"""A row's lane is one of the relays' lanes: a row written by hand (or by another language
without `send()`) with a lane outside 0..63 was read by no relay, for ever. The migration
gives rows already there the lane `send()` gives, and a check refuses any other from then on."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import psycopg
import pytest

from outbox import Broker
from outbox.core.lanes import lane_for
from outbox.postgres import migrate

from .relay_helpers import count, spawn_producer, wait_for

MIGRATION = next(Path(__file__).parents[2].glob("migrations/versions/*_lanes_in_range.py"))


def _before() -> str:
    spec = importlib.util.spec_from_file_location("outbox_migration_lanes", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.down_revision)


INSERT = (
    "INSERT INTO outbox.{table} (message_id, topic, key, payload, headers, content_type, lane"
    "{extra}) VALUES (%s, 'stray', %s, '1', '{{}}', 'application/json', %s{value})"
)


def _insert(conn: psycopg.Connection, table: str, key: bytes | None, lane: int) -> uuid.UUID:
    mid = uuid.uuid4()
    later = table == "producer_scheduled"
    conn.execute(
        INSERT.format(
            table=table,
            extra=", deliver_at" if later else "",
            value=", now() + interval '1 hour'" if later else "",
        ),
        (mid, key, lane),
    )
    return mid


def test_rows_of_an_older_schema_with_stray_lanes_get_their_keys_lanes_and_are_relayed(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    url = outbox_database_url
    migrate.downgrade(url, "outbox", _before())
    with psycopg.connect(url) as conn:
        stray = [
            _insert(conn, "producer_queue", b"k1", 999),
            _insert(conn, "producer_queue", None, -5),
            _insert(conn, "consumer_queue", bytes(range(256)), 64),
            _insert(conn, "producer_scheduled", b"zz", 100),
        ]
    migrate.upgrade(url, "outbox")
    with psycopg.connect(url) as conn:
        lanes = {
            mid: (lane, lane_for(None if key is None else bytes(key), mid))
            for table in ("producer_queue", "consumer_queue", "producer_scheduled")
            for mid, key, lane in conn.execute(f"SELECT message_id, key, lane FROM outbox.{table}")
        }
        assert set(lanes) == set(stray)
        assert all(lane == wanted for lane, wanted in lanes.values()), lanes
        for table in ("producer_queue", "consumer_queue", "producer_scheduled"):
            with pytest.raises(psycopg.errors.CheckViolation) as refused:
                conn.execute(f"UPDATE outbox.{table} SET lane = 64")
            assert refused.value.diag.constraint_name == f"{table}_lane_in_range"
            conn.rollback()
        Broker().send(conn, "stray", {"n": 1}, key="k1")
        conn.commit()
    with spawn_producer(url, outbox_log_url):  # the stray rows now go out with the rest
        wait_for(lambda: count(url) == 0, 60, "producer_queue relayed")
