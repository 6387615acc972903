"""The Alembic chain: a fresh upgrade yields the declared schema; down and up round-trip."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from outbox import Broker, Handlers, InboxMessage, SchemaNotMigrated, SchemaTooNew
from outbox.core.batches import InboxBatch
from outbox.core.lanes import lane_for
from outbox.kafka.subscriber import InboxRow
from outbox.postgres import migrate
from outbox.postgres.inbox import insert_params
from outbox.postgres.queries import channel, queries, quote_ident
from outbox.postgres.schema import metadata
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import handler_thread, wait_for


def _tables(url: str, schema: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def _diff(url: str, schema: str) -> list[object]:
    engine = create_engine(migrate.sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "version_table_schema": schema,
                    "include_name": lambda name, type_, _parent: (
                        type_ != "schema" or name == schema
                    ),
                    "include_object": lambda _o, name, type_, *_: name != "alembic_version",
                },
            )
            return list(compare_metadata(context, metadata(schema)))
    finally:
        engine.dispose()


def _indexes(url: str, table: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'outbox' AND tablename = %s",
            (table,),
        ).fetchall()
    return {r[0] for r in rows}


def test_0003_drops_the_producer_lane_index_and_its_downgrade_restores_it(
    outbox_empty_database_url: str,
) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url, revision="0002")
    assert "producer_queue_lane_id" in _indexes(url, "producer_queue")
    with psycopg.connect(url) as conn, conn.transaction():
        Broker().send(conn, "before.0003", b"x")
    migrate.upgrade(url)
    assert "producer_queue_lane_id" not in _indexes(url, "producer_queue")
    migrate.downgrade(url, revision="0002")
    assert "producer_queue_lane_id" in _indexes(url, "producer_queue")
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone() == (1,)


@pytest.mark.parametrize("schema", ["outbox", "billing_outbox"])
def test_fresh_upgrade_matches_the_declared_schema(
    outbox_empty_database_url: str, schema: str
) -> None:
    migrate.upgrade(outbox_empty_database_url, schema)
    assert _tables(outbox_empty_database_url, schema) == {
        "alembic_version",
        "producer_queue",
        "producer_dead",
        "consumer_queue",
        "consumer_processed",
        "relay_state",
        "http_published",
    }
    assert _diff(outbox_empty_database_url, schema) == []


def test_downgrade_and_upgrade_round_trip(outbox_empty_database_url: str) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url)
    migrate.downgrade(url)
    assert _tables(url, "outbox") == {"alembic_version"}
    migrate.upgrade(url)
    assert _diff(url, "outbox") == []
    with psycopg.connect(url) as conn:
        with conn.transaction():
            Broker().send(conn, "after.roundtrip", b"x")
        assert conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone() == (1,)


def test_two_schemas_live_side_by_side(outbox_empty_database_url: str) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url, "svc_a")
    migrate.upgrade(url, "svc_b")
    with psycopg.connect(url) as conn, conn.transaction():
        Broker(schema="svc_a").send(conn, "t", b"a")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM svc_a.producer_queue").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM svc_b.producer_queue").fetchone() == (0,)


def test_migrate_sql_prints_the_ddl_and_touches_nothing(outbox_empty_database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "migrate", "--sql", "--schema", "ops_outbox"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert 'CREATE SCHEMA IF NOT EXISTS "ops_outbox"' in result.stdout
    assert "CREATE TABLE ops_outbox.producer_queue" in result.stdout
    assert "CREATE TABLE ops_outbox.consumer_queue" in result.stdout
    assert "COMMIT" in result.stdout
    # The printed SQL is what a DBA would apply: it must produce the declared schema.
    with psycopg.connect(outbox_empty_database_url, autocommit=True) as conn:
        conn.execute(result.stdout.encode())
    assert _diff(outbox_empty_database_url, "ops_outbox") == []


def test_migrate_command_migrates_and_says_what_it_did(outbox_empty_database_url: str) -> None:
    url = outbox_empty_database_url

    def outbox_migrate() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "outbox.cli", "migrate", "--database-url", url],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    head = migrate.head_revision()
    (previous,) = migrate._revisions()[head]
    assert outbox_migrate() == f"outbox schema 'outbox' created at revision {head}\n"
    assert "producer_queue" in _tables(url, "outbox")
    assert outbox_migrate() == (
        f"outbox schema 'outbox' is already at revision {head} (nothing to do)\n"
    )
    migrate.downgrade(url, revision=previous)
    assert outbox_migrate() == (
        f"outbox schema 'outbox' migrated from revision {previous} to {head}\n"
    )


def test_schema_check_tells_to_migrate_or_to_upgrade_outbox(
    outbox_empty_database_url: str,
) -> None:
    url = outbox_empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        with pytest.raises(SchemaNotMigrated, match="run `outbox migrate"):
            migrate.check_schema(conn, "outbox")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate.check_schema(conn, "outbox")
        conn.execute("UPDATE outbox.alembic_version SET version_num = '9999_from_the_future'")
        with pytest.raises(SchemaTooNew, match="newer outbox"):
            migrate.check_schema(conn, "outbox")


def test_0004_moves_dead_producer_rows_out_and_its_downgrade_moves_them_back(
    outbox_empty_database_url: str,
) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url, revision="0003")
    with psycopg.connect(url) as conn, conn.transaction():
        Broker().send(conn, "before.0004", b"live")
        Broker().send(conn, "before.0004", b"dead")
        conn.execute(
            "UPDATE outbox.producer_queue SET dead_at = now(), last_error = 'too large' "
            "WHERE payload = 'dead'"
        )
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT payload FROM outbox.producer_queue").fetchall() == [(b"live",)]
        assert conn.execute("SELECT payload, last_error FROM outbox.producer_dead").fetchall() == [
            (b"dead", "too large")
        ]
    migrate.downgrade(url, revision="0003")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT payload, dead_at IS NOT NULL FROM outbox.producer_queue ORDER BY id"
        ).fetchall()
        assert rows == [(b"live", False), (b"dead", True)]
    migrate.upgrade(url)
    assert _diff(url, "outbox") == []


def _pending_index(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'outbox' "
            "AND indexname = 'consumer_queue_pending'"
        ).fetchone()
    assert row is not None
    return str(row[0])


def _reloptions(url: str, table: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (f"outbox.{table}",)
        ).fetchone()
    assert row is not None
    return dict(option.split("=", 1) for option in row[0] or [])


def test_0005_puts_the_pending_index_in_id_order_and_its_downgrade_restores_it(
    outbox_empty_database_url: str,
) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url, revision="0004")
    assert "(lane, id)" in _pending_index(url)
    migrate.upgrade(url, revision="0005")
    assert "(id)" in _pending_index(url) and "processed_at IS NULL" in _pending_index(url)
    migrate.downgrade(url, revision="0004")
    assert "(lane, id)" in _pending_index(url)
    migrate.upgrade(url)
    assert _diff(url, "outbox") == []


def test_0006_sets_the_queue_tables_autovacuum_by_rows_and_its_downgrade_resets_it(
    outbox_empty_database_url: str,
) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url)
    for table in ("producer_queue", "consumer_queue"):
        options = _reloptions(url, table)
        assert options["autovacuum_vacuum_scale_factor"] == "0", options
        assert options["autovacuum_vacuum_threshold"] == "5000", options
        assert options["autovacuum_vacuum_cost_delay"] == "0", options
    migrate.downgrade(url, revision="0005")
    assert _reloptions(url, "consumer_queue") == {}
    assert _reloptions(url, "producer_queue") == {}


def test_migrations_run_at_once_on_one_database_all_succeed(
    outbox_database_factory: DatabaseFactory,
) -> None:
    """Several `outbox migrate` at the same moment (the init containers of a Deployment): one
    migrates, the others wait for it and find nothing left to do; the log's too. Without the
    lock one of them failed on CREATE SCHEMA's unique name in two rounds of three."""
    for _round in range(3):
        url = outbox_database_factory(migrated=False)
        commands = [["--database-url", url]] * 3 + [["--database-url", url, "--schema", "billing"]]
        commands += [["--log-url", url]] * 2
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "outbox.cli", "migrate", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for args in commands
        ]
        results = [(p.wait(120), p.communicate()[1]) for p in processes]
        assert [code for code, _ in results] == [0] * len(commands), results
        with psycopg.connect(url) as conn:
            migrate.check_schema(conn, "outbox")
            migrate.check_schema(conn, "billing")


def test_migrate_on_a_schema_a_newer_outbox_migrated_says_so(
    outbox_database_url: str,
) -> None:
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute("UPDATE outbox.alembic_version SET version_num = '0099'")
    with pytest.raises(SchemaTooNew, match=r"outbox schema 'outbox' is at revision '0099'"):
        migrate.upgrade(outbox_database_url)
    result = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "migrate", "--database-url", outbox_database_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "migrated by a newer outbox" in result.stderr and "unexpected" not in result.stderr


def _store_with_the_consumers_statement(url: str, schema: str, ids: list[uuid.UUID]) -> int:
    """Deliver messages `ids` (again) with the Consumer's statement; the rows stored."""
    rows = [
        InboxRow(
            message_id=mid,
            topic="migrated",
            key=f"k{n % 3}".encode(),
            payload=json.dumps({"n": n}).encode(),
            headers={},
            content_type="application/json",
            lane=lane_for(f"k{n % 3}".encode(), mid),
            created_at=datetime.now(UTC),
            partition=0,
            offset=n,
        )
        for n, mid in enumerate(ids)
    ]
    with psycopg.connect(url) as conn, conn.transaction():
        found = conn.execute(
            queries(schema)["inbox_insert"],
            insert_params(InboxBatch.of(rows), channel(schema, "consumer_queue")),
        ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize("schema", ["outbox", "billing_outbox"])
def test_0007_moves_processed_ids_out_and_keeps_the_dedup_of_messages_in_flight(
    outbox_empty_database_url: str, schema: str
) -> None:
    """Messages handled before the upgrade and delivered again after it are refused; messages
    pending before it are handled once after it; the downgrade puts the ids back."""
    url, q = outbox_empty_database_url, quote_ident(schema)
    migrate.upgrade(url, schema, revision="0006")
    handled_before = [uuid.uuid4() for _ in range(5)]
    pending_before = [uuid.uuid4() for _ in range(4)]
    with psycopg.connect(url) as conn, conn.transaction():
        # as the previous release left them: processed in place (payload cleared), or pending
        for n, mid in enumerate(handled_before + pending_before):
            processed = mid in handled_before
            conn.execute(
                f"INSERT INTO {q}.consumer_queue (message_id, topic, key, payload, content_type,"
                " lane, processed_at, handled_count, attempts) VALUES (%s, 'migrated', %s, %s,"
                " 'application/json', %s, CASE WHEN %s THEN now() - interval '1 minute' END,"
                " %s, %s)",
                (
                    mid,
                    f"k{n % 3}".encode(),
                    b"" if processed else json.dumps({"n": n}).encode(),
                    lane_for(f"k{n % 3}".encode(), mid),
                    processed,
                    int(processed),
                    int(processed),
                ),
            )
        conn.execute("CREATE TABLE public.effects (message_id uuid)")
    migrate.upgrade(url, schema)
    assert _diff(url, schema) == []
    with psycopg.connect(url) as conn:
        moved = conn.execute(
            f"SELECT message_id, handled_count, processed_at < now() - interval '30 seconds'"
            f" FROM {q}.consumer_processed"
        ).fetchall()
        left = conn.execute(f"SELECT message_id FROM {q}.consumer_queue").fetchall()
    assert sorted(moved) == sorted((mid, 1, True) for mid in handled_before)
    assert sorted(r[0] for r in left) == sorted(pending_before)

    # In flight: every message is delivered again after the upgrade; none is stored twice.
    assert _store_with_the_consumers_statement(url, schema, handled_before + pending_before) == 0

    handlers = Handlers()

    @handlers.handler("migrated")
    def effect(message: InboxMessage, conn: Any) -> None:
        conn.execute("INSERT INTO public.effects VALUES (%s)", (message.id,))

    def effects() -> list[uuid.UUID]:
        with psycopg.connect(url) as conn:
            return [r[0] for r in conn.execute("SELECT message_id FROM public.effects")]

    with handler_thread(url, handlers, schema=schema):
        wait_for(lambda: len(effects()) >= len(pending_before), 30, "the pending messages")
        assert _store_with_the_consumers_statement(url, schema, handled_before) == 0
        assert _store_with_the_consumers_statement(url, schema, pending_before) == 0
    assert sorted(effects()) == sorted(pending_before)
    with psycopg.connect(url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {q}.consumer_queue").fetchone() == (0,)
        assert conn.execute(f"SELECT count(*) FROM {q}.consumer_processed").fetchone() == (9,)

    migrate.downgrade(url, schema, revision="0006")
    with psycopg.connect(url) as conn:
        back = conn.execute(
            f"SELECT message_id, handled_count FROM {q}.consumer_queue"
            " WHERE processed_at IS NOT NULL"
        ).fetchall()
    assert sorted(back) == sorted((mid, 1) for mid in handled_before + pending_before)
    migrate.upgrade(url, schema)
    assert _diff(url, schema) == []
    assert _store_with_the_consumers_statement(url, schema, handled_before + pending_before) == 0


# -- the log's migrations (outbox/pglog/migrations) ---------------------------------------------


def _relfilenodes(url: str, schema: str) -> dict[str, int]:
    """The files of the log's tables: a migration that rewrites a table gives it a new one."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.relfilenode FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchall()
    return {str(name): int(node) for name, node in rows}


def test_the_logs_upgrade_from_log0002_keeps_the_records_and_offsets_in_flight(
    outbox_empty_database_url: str,
) -> None:
    """Records appended and offsets committed before the upgrade stay as they are (no table
    is rewritten); the records without an append id are read after it, and the group resumes
    where it was."""
    from outbox.pglog import PgLog, PgLogPublisher, PgLogSubscriber
    from outbox.pglog.log import downgrade as downgrade_log
    from outbox.pglog.log import upgrade as upgrade_log

    url, topic = outbox_empty_database_url, "in.flight"
    upgrade_log(url, revision="log0002")
    PgLog(url).create_topic(topic, 1)
    with psycopg.connect(url) as conn, conn.transaction():
        # as log0002's publisher appended them, and its subscriber committed
        [(pid,)] = conn.execute("SELECT id FROM outbox_log.log_partitions").fetchall()
        for n in range(20):
            conn.execute(
                "INSERT INTO outbox_log.log_records (partition_id, log_offset, key, value) "
                "VALUES (%s, %s, %s, %s)",
                (pid, n, b"k", str(n).encode()),
            )
        conn.execute("UPDATE outbox_log.log_partitions SET next_offset = 20")
        [(group_id,)] = conn.execute(
            "INSERT INTO outbox_log.log_groups (name) VALUES ('g') RETURNING id"
        ).fetchall()
        conn.execute(
            "INSERT INTO outbox_log.log_group_offsets (group_id, partition_id, next_offset) "
            "VALUES (%s, %s, 10)",
            (group_id, pid),
        )
    files = _relfilenodes(url, "outbox_log")

    upgrade_log(url)
    after = _relfilenodes(url, "outbox_log")
    assert {t: after[t] for t in files} == files  # nothing rewritten
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT count(*), count(append_id) FROM outbox_log.log_records"
        ).fetchone() == (20, 0)
        assert conn.execute(
            "SELECT next_offset, last_offset, last_append_id, went_back "
            "FROM outbox_log.log_group_offsets"
        ).fetchone() == (10, None, None, 0)

    publisher = PgLogPublisher(url, partitions=1)
    member = PgLogSubscriber(url, [topic], "g", rebalance_interval=0.1)
    try:
        publisher.publish([_log_record(topic, n) for n in range(20, 30)])
        rows: list[Any] = []
        deadline = time.monotonic() + 20
        while len(rows) < 20:
            assert time.monotonic() < deadline, rows
            batch = member.poll(100, 0.1)
            rows.extend(batch.rows())
            member.commit(batch)
    finally:
        member.close()
        publisher.close()
    assert [(r.offset, int(r.payload)) for r in rows] == [(n, n) for n in range(10, 30)]
    assert PgLog(url).committed("g", topic) == {0: 30}
    with psycopg.connect(url) as conn:
        ids = conn.execute(
            "SELECT count(DISTINCT append_id) FROM outbox_log.log_records WHERE log_offset >= 20"
        ).fetchone()
    assert ids == (1,)  # one append, one id

    downgrade_log(url, "outbox_log", "log0002")
    upgrade_log(url)
    assert PgLog(url).count(topic) == 30
    assert PgLog(url).committed("g", topic) == {0: 30}


def _log_record(topic: str, n: int) -> Any:
    from outbox.core.batches import outgoing
    from outbox.core.envelope import StoredMessage
    from outbox.core.ids import uuid7

    return outgoing(
        StoredMessage(
            id=n,
            message_id=uuid7(),
            topic=topic,
            key=b"k",
            payload=str(n).encode(),
            content_type="application/json",
            headers={},
            created_at=datetime.now(UTC),
            attempts=0,
        )
    )
