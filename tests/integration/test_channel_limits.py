"""Every NOTIFY channel fits PostgreSQL's 63-byte identifiers, whatever schema passes validation.

A channel longer than 63 bytes is refused by `pg_notify` ("channel name too long": inside the
caller's business transaction, for `send`) and truncated by `LISTEN`, so before channels were
derived to fit, a schema of 49 characters broke `send` whenever a relay slept, 50 broke the
inbox's wake-up, and a log schema of 62 broke every append while a consumer napped.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from outbox import Broker
from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.lanes import lane_for
from outbox.pglog.log import upgrade as upgrade_log
from outbox.pglog.log import wake_channel
from outbox.pglog.publisher import PgLogPublisher
from outbox.pglog.subscriber import PROTOCOL
from outbox.postgres.inbox import insert_params
from outbox.postgres.migrate import upgrade
from outbox.postgres.queries import MAX_IDENTIFIER_BYTES, channel, queries, validate_schema
from outbox.testing.plugin import DatabaseFactory

from .test_pglog import message

LENGTHS = range(48, MAX_IDENTIFIER_BYTES + 1)
QUEUES = ("producer_queue", "consumer_queue", "log")


def schema_of(length: int, head: str = "s") -> str:
    return validate_schema((head + "_" + "x" * length)[:length])


def test_every_channel_fits_and_no_two_schemas_share_one() -> None:
    seen: dict[str, tuple[str, str]] = {}
    for length, head, queue in itertools.product(range(1, 64), "abc", QUEUES):
        schema = schema_of(length, head)
        name = channel(schema, queue)
        assert len(name.encode()) <= MAX_IDENTIFIER_BYTES, (schema, queue, name)
        assert seen.setdefault(name, (schema, queue)) == (schema, queue), name
    # A short name keeps the form it has always had, so running relays still meet new senders.
    assert channel("outbox", "producer_queue") == "outbox.producer_queue"
    # Two long schemas that differ only past the kept head still get channels of their own.
    a, b = "a" * 60 + "one", "a" * 60 + "two"
    assert channel(a, "consumer_queue") != channel(b, "consumer_queue")


def _listen(conn: psycopg.Connection[tuple[object, ...]], name: str) -> None:
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(name)))


def _woken(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    return any(True for _ in conn.notifies(timeout=2, stop_after=1))


def _sleeping_relay(conn: psycopg.Connection[tuple[object, ...]], schema: str, queue: str) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.relay_state (relay_id, queue, backend_pid, sleeping) "
            "VALUES (%s, %s, pg_backend_pid(), true)"
        ).format(sql.Identifier(schema)),
        (f"r-{queue}", queue),
    )


@pytest.mark.parametrize("length", LENGTHS)
def test_send_and_the_inbox_wake_their_relays_at_every_schema_length(
    outbox_database_factory: DatabaseFactory, length: int
) -> None:
    url = outbox_database_factory(migrated=False)
    schema = schema_of(length)
    upgrade(url, schema)
    with psycopg.connect(url, autocommit=True) as relay:
        _sleeping_relay(relay, schema, "producer")
        _sleeping_relay(relay, schema, "handler")
        _listen(relay, channel(schema, "producer_queue"))
        _listen(relay, channel(schema, "consumer_queue"))

        with psycopg.connect(url) as conn, conn.transaction():
            conn.execute("CREATE TABLE business (id int)")
            conn.execute("INSERT INTO business VALUES (1)")
            Broker(schema=schema).send(conn, "t.limits", {"n": length})
        assert _woken(relay), "the sleeping Producer is woken by the send"
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM business").fetchone() == (1,)

        mid = uuid.uuid4()
        fields = (mid, "t.limits", b"k", b"{}", {}, "application/json", lane_for(b"k", mid))
        row = InboxRow(*fields, datetime.now(UTC), 0, 0)
        with psycopg.connect(url) as conn:
            conn.execute(
                queries(schema)["inbox_insert"],
                insert_params(InboxBatch.of([row]), channel(schema, "consumer_queue")),
            )
        assert _woken(relay), "the sleeping Handler is woken by the inbox insert"


@pytest.mark.parametrize("length", LENGTHS)
def test_the_log_wakes_a_napping_member_at_every_schema_length(
    outbox_database_factory: DatabaseFactory, length: int
) -> None:
    url = outbox_database_factory(migrated=False)
    schema = schema_of(length)
    upgrade_log(url, schema)
    publisher = PgLogPublisher(url, schema)
    try:
        assert publisher.publish([message("t.limits", 0)]) == [None]  # creates the topic
        with psycopg.connect(url, autocommit=True) as member:
            row = member.execute(
                sql.SQL("INSERT INTO {}.log_groups (name) VALUES ('g') RETURNING id").format(
                    sql.Identifier(schema)
                )
            ).fetchone()
            assert row is not None
            member.execute(
                sql.SQL(
                    "INSERT INTO {}.log_members (member_id, group_id, topics, backend_pid, "
                    "sleeping, protocol) VALUES ('m', %s, ARRAY['t.limits'], pg_backend_pid(), "
                    "true, %s)"
                ).format(sql.Identifier(schema)),
                (row[0], PROTOCOL),
            )
            _listen(member, wake_channel(schema))
            assert publisher.publish([message("t.limits", 1)]) == [None]
            assert _woken(member), "the napping member is woken by the append"
    finally:
        publisher.close()
