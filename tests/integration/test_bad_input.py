"""Every bad input gets its own clear error before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine

from outbox import (
    Broker,
    DuplicateMessageId,
    InvalidHeaders,
    InvalidKey,
    InvalidTopic,
    Message,
    NotInTransaction,
    OutboxError,
    PayloadTooLarge,
    SerializationError,
    UnsupportedTransaction,
)
from outbox.postgres.migrate import sqlalchemy_url
from outbox.testing.servers import free_port

broker = Broker(max_payload_bytes=1024)


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT id, message_id, topic, key, payload, headers FROM outbox.producer_queue "
            "ORDER BY id"
        ).fetchall()


@pytest.fixture
def seeded(outbox_database_url: str) -> str:
    """A database that already holds one message, which no failed send may disturb."""
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        broker.send(conn, "seed", {"keep": True}, key="seed")
    return outbox_database_url


BAD_SENDS: list[tuple[str, dict[str, Any], type[OutboxError], str]] = [
    ("empty topic", {"topic": ""}, InvalidTopic, "must not be empty"),
    ("long topic", {"topic": "t" * 250}, InvalidTopic, "at most 249"),
    ("space in topic", {"topic": "a b"}, InvalidTopic, "' '"),
    ("sql in topic", {"topic": "x'); DROP TABLE outbox.producer_queue; --"}, InvalidTopic, "';'"),
    ("oversized payload", {"payload": b"x" * 1025}, PayloadTooLarge, "1025 bytes"),
    ("unserializable payload", {"payload": {"when": object()}}, SerializationError, "JSON"),
    ("int header", {"headers": {"n": 1}}, InvalidHeaders, "'n' must be str or bytes"),
    ("list headers", {"headers": [("a", "b")]}, InvalidHeaders, "mapping"),
    ("reserved header", {"headers": {"outbox-message-id": "x"}}, InvalidHeaders, "reserved"),
    ("float key", {"key": 1.5}, InvalidKey, "got float"),
    ("bad message id", {"message_id": "not-a-uuid"}, OutboxError, "not a UUID"),
]


@pytest.mark.parametrize(
    ("override", "error", "fragment"),
    [case[1:] for case in BAD_SENDS],
    ids=[case[0] for case in BAD_SENDS],
)
def test_bad_send_raises_and_leaves_the_table_and_transaction_intact(
    seeded: str, override: dict[str, Any], error: type[OutboxError], fragment: str
) -> None:
    before = _rows(seeded)
    args: dict[str, Any] = {"topic": "ok.topic", "payload": {"a": 1}, **override}
    with psycopg.connect(seeded) as conn:
        with conn.transaction():
            with pytest.raises(error) as info:
                broker.send(
                    conn,
                    args.pop("topic"),
                    args.pop("payload"),
                    **args,
                )
            assert fragment in str(info.value)
            # Nothing reached the server, so the caller's transaction is still usable.
            conn.execute("SELECT 1")
    assert _rows(seeded) == before


def test_send_many_with_one_bad_item_writes_none(seeded: str) -> None:
    before = _rows(seeded)
    with psycopg.connect(seeded) as conn, conn.transaction():
        with pytest.raises(PayloadTooLarge, match="item 2"):
            broker.send_many(
                conn,
                [Message("ok", 1), Message("ok", 2), Message("ok", b"x" * 5000)],
            )
    assert _rows(seeded) == before


def test_unsupported_transaction_handles(seeded: str) -> None:
    before = _rows(seeded)
    engine = create_engine(sqlalchemy_url(seeded))
    try:
        for handle in ["postgresql://x", None, 42, engine]:
            with pytest.raises(UnsupportedTransaction, match="cannot send with"):
                broker.send(handle, "t", b"x")
        with psycopg.connect(seeded) as conn, conn.cursor() as cursor:
            with pytest.raises(UnsupportedTransaction, match=r"psycopg\.Connection"):
                broker.send(cursor, "t", b"x")
    finally:
        engine.dispose()
    assert _rows(seeded) == before


async def test_sync_and_async_handles_are_not_mixed_up(seeded: str) -> None:
    async with await psycopg.AsyncConnection.connect(seeded) as aconn:
        with pytest.raises(UnsupportedTransaction, match="send_async"):
            broker.send(aconn, "t", b"x")
    with psycopg.connect(seeded) as conn:
        with pytest.raises(UnsupportedTransaction, match=r"broker\.send\("):
            await broker.send_async(conn, "t", b"x")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(sqlalchemy_url(seeded))
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(UnsupportedTransaction, match="AsyncSession is asynchronous"):
                broker.send(session, "t", b"x")
    finally:
        await engine.dispose()


def test_autocommit_outside_a_transaction_is_refused(seeded: str) -> None:
    before = _rows(seeded)
    with psycopg.connect(seeded, autocommit=True) as conn:
        with pytest.raises(NotInTransaction, match="autocommit"):
            broker.send(conn, "t", b"x")
        with conn.transaction():  # the supported way with an autocommit connection
            broker.send(conn, "t", b"inside")
    assert len(_rows(seeded)) == len(before) + 1

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(seeded, autocommit=True) as conn:
            with pytest.raises(NotInTransaction, match=r"`async with conn\.transaction\(\):`"):
                await broker.send_async(conn, "t", b"x")

    import asyncio

    asyncio.run(main())


def test_a_failed_transaction_is_refused_with_a_clear_error(seeded: str) -> None:
    with psycopg.connect(seeded) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(NotInTransaction, match="roll it back"):
            broker.send(conn, "t", b"x")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    """Exit non-zero with one error line; the daemons' INFO start-up line may come before it."""
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if " INFO " not in line]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment in lines[0], lines[0]


def test_cli_unreachable_database_is_one_line(outbox_kafka_bootstrap: str) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nope"
    for command in (["migrate"], ["producer", "--kafka-bootstrap", outbox_kafka_bootstrap]):
        result = _cli(*command, "--database-url", url)
        _one_line_error(result, "cannot connect to PostgreSQL")


def test_cli_malformed_database_url_is_one_line() -> None:
    result = _cli("migrate", "--database-url", "postgresql://host:notaport/db")
    _one_line_error(result, "cannot connect to PostgreSQL")


def test_cli_missing_settings_name_the_flag_and_env_var() -> None:
    env = {"PATH": "/usr/bin:/bin"}
    result = _cli("producer", "--kafka-bootstrap", "127.0.0.1:1", env=env)
    _one_line_error(
        result, "--database-url is required (or --databases-file, or set OUTBOX_DATABASE_URL)"
    )
    result = _cli("producer", "--database-url", "postgresql://x/y", env=env)
    _one_line_error(result, "--kafka-bootstrap is required (or set OUTBOX_KAFKA_BOOTSTRAP)")


def test_cli_unmigrated_database_says_to_migrate(
    outbox_empty_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    result = _cli(
        "producer",
        "--database-url",
        outbox_empty_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
    )
    _one_line_error(result, "run `outbox migrate")


def test_cli_unreachable_kafka_is_one_line(outbox_database_url: str) -> None:
    result = _cli(
        "producer",
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        f"127.0.0.1:{free_port()}",
        "--kafka-config",
        "socket.connection.setup.timeout.ms=1000",
    )
    _one_line_error(result, "no Kafka broker answered")


def test_cli_refuses_weakened_delivery_settings(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    result = _cli(
        "producer",
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--kafka-config",
        "acks=1",
    )
    _one_line_error(result, "acks=1 would weaken delivery")


@pytest.mark.parametrize(
    ("command", "setting", "fragment"),
    [
        ("producer", "no.such.key=1", 'No such configuration property: "no.such.key"'),
        ("producer", "linger.ms=abc", "Invalid value"),
        ("consumer", "fetch.wait.max.ms=soon", "Invalid value"),
    ],
)
def test_cli_settings_librdkafka_refuses_are_one_line(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    command: str,
    setting: str,
    fragment: str,
) -> None:
    consumer_args = ["--topic", "t", "--group", "g"] if command == "consumer" else []
    result = _cli(
        command,
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--kafka-config",
        setting,
        *consumer_args,
    )
    _one_line_error(result, "librdkafka refused a Kafka setting (--kafka-config, an")
    assert fragment in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["producer", "--kafka-config", "no-equals-sign"], "expected key=value"),
        (["producer", "--batch-size", "many"], "invalid int value"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_cli_usage_errors_exit_2(args: list[str], fragment: str) -> None:
    result = _cli(*args)
    assert result.returncode == 2
    assert fragment in result.stderr


def test_a_setting_librdkafka_refuses_from_a_variable_is_one_line(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    """A misspelt OUTBOX_KAFKA_CONFIG_<NAME> is refused by librdkafka under its key."""
    env = {**os.environ, "OUTBOX_KAFKA_CONFIG_NO_SUCH_KEY": "1"}
    result = _cli(
        "producer",
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        env=env,
    )
    _one_line_error(result, "OUTBOX_KAFKA_CONFIG_<NAME> variable")
    assert 'No such configuration property: "no.such.key"' in result.stderr


def test_cli_bad_schema_name(outbox_database_url: str, outbox_kafka_bootstrap: str) -> None:
    result = _cli(
        "producer",
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--schema",
        "x; DROP SCHEMA outbox",
    )
    _one_line_error(result, "schema 'x; DROP SCHEMA outbox' is not valid")


def test_a_message_id_still_in_the_queue_is_refused_without_aborting_the_transaction(
    seeded: str,
) -> None:
    """A second send of an id that waits in producer_queue raises DuplicateMessageId naming
    it and writes nothing; the caller's transaction goes on and commits its own writes."""
    mid, other = uuid.uuid4(), uuid.uuid4()
    before = _rows(seeded)
    with psycopg.connect(seeded) as conn:
        with conn.transaction():
            broker.send(conn, "t", b"1", message_id=mid)
        with conn.transaction():
            with pytest.raises(DuplicateMessageId, match=f"message id {mid} is already in"):
                broker.send(conn, "t", b"2", message_id=mid)
            with pytest.raises(DuplicateMessageId, match=str(mid)):
                broker.send_many(
                    conn, [Message("t", b"3", message_id=other), Message("t", b"4", message_id=mid)]
                )
            conn.execute("CREATE TABLE after_refusal (x int)")  # the transaction still works
    rows = _rows(seeded)
    assert rows[: len(before)] == before
    assert [(r[1], r[4]) for r in rows[len(before) :]] == [(mid, b"1")]
    with psycopg.connect(seeded) as conn:
        assert conn.execute("SELECT count(*) FROM after_refusal").fetchone() == (0,)


def test_a_duplicate_message_id_is_refused_the_same_way_on_every_handle(seeded: str) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    mid = uuid.uuid4()
    with psycopg.connect(seeded) as conn, conn.transaction():
        broker.send(conn, "t", b"1", message_id=mid)
    engine = create_engine(sqlalchemy_url(seeded))
    try:
        with Session(engine) as session, session.begin():
            with pytest.raises(DuplicateMessageId, match=str(mid)):
                broker.send(session, "t", b"2", message_id=mid)
    finally:
        engine.dispose()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(seeded) as conn:
            async with conn.transaction():
                with pytest.raises(DuplicateMessageId, match=str(mid)):
                    await broker.send_async(conn, "t", b"3", message_id=mid)
                with pytest.raises(DuplicateMessageId, match=str(mid)):
                    await broker.send_many_async(
                        conn, [Message("t", b"4"), Message("t", b"5", message_id=mid)]
                    )
        async_engine = create_async_engine(sqlalchemy_url(seeded))
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                with pytest.raises(DuplicateMessageId, match=str(mid)):
                    await broker.send_async(session, "t", b"6", message_id=mid)
        finally:
            await async_engine.dispose()

    asyncio.run(main())
    assert [r[4] for r in _rows(seeded) if r[1] == mid] == [b"1"]


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("not_a_path", "module:attribute"),
        ("no_such_module_xyz:handlers", "cannot import 'no_such_module_xyz'"),
        ("tests.integration.inbox_app:nothing", "has no attribute 'nothing'"),
        ("tests.integration.inbox_app:TOPIC", "not an outbox.Handlers registry"),
    ],
)
def test_cli_handler_path_errors_are_one_line(
    outbox_database_url: str, target: str, fragment: str
) -> None:
    result = _cli("handler", target, "--database-url", outbox_database_url)
    _one_line_error(result, fragment)


def test_cli_schema_from_a_newer_outbox_is_refused(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        conn.execute("UPDATE outbox.alembic_version SET version_num = '0999_future'")
    for command in (
        ["producer", "--kafka-bootstrap", outbox_kafka_bootstrap],
        ["handler", "tests.integration.inbox_app:handlers"],
        ["status"],
    ):
        result = _cli(*command, "--database-url", outbox_database_url)
        _one_line_error(result, "migrated by a newer outbox")


def test_cli_consumer_requires_topic_and_group_and_refuses_auto_commit(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    result = _cli("consumer", "--database-url", outbox_database_url, "--group", "g")
    assert result.returncode == 2
    assert "--topic" in result.stderr
    result = _cli(
        "consumer",
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--topic",
        "t",
        "--group",
        "g",
        "--kafka-config",
        "enable.auto.commit=true",
    )
    _one_line_error(result, "enable.auto.commit=true would commit offsets")
    result = _cli(
        "consumer",
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--topic",
        "bad topic",
        "--group",
        "g",
    )
    _one_line_error(result, "contains ' '")


def test_cli_conflicting_dead_letter_selections_exit_2(outbox_database_url: str) -> None:
    result = _cli(
        "dead-letters", "requeue", "--all", "--topic", "t", "--database-url", outbox_database_url
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


# -- text PostgreSQL cannot store: refused before the INSERT, the transaction stays usable ------

UNSTORABLE_SENDS: list[tuple[str, dict[str, Any], type[OutboxError], str]] = [
    ("NUL in header name", {"headers": {"a\x00b": "v"}}, InvalidHeaders, "header name"),
    ("surrogate in header name", {"headers": {"a\udc80": "v"}}, InvalidHeaders, "header name"),
    ("NUL in header value", {"headers": {"h": "a\x00b"}}, InvalidHeaders, "use bytes"),
    ("surrogate in header value", {"headers": {"h": "\ud800"}}, InvalidHeaders, "use bytes"),
    ("surrogate in str key", {"key": "k\udc80"}, InvalidKey, "lone surrogate"),
    ("surrogate in str payload", {"payload": "p\udc80"}, SerializationError, "'ok.topic'"),
    (
        "surrogate in JSON payload",
        {"payload": {"s": "\udc80"}},
        SerializationError,
        "'ok.topic'",
    ),
    ("NaN in JSON payload", {"payload": {"x": float("nan")}}, SerializationError, "'ok.topic'"),
]


def _send_in(tx: object, override: dict[str, Any]) -> None:
    args: dict[str, Any] = {"topic": "ok.topic", "payload": {"a": 1}, **override}
    broker.send(tx, args.pop("topic"), args.pop("payload"), **args)


@pytest.mark.parametrize(
    ("override", "error", "fragment"),
    [case[1:] for case in UNSTORABLE_SENDS],
    ids=[case[0] for case in UNSTORABLE_SENDS],
)
@pytest.mark.parametrize("handle", ["psycopg", "sqlalchemy-session"])
def test_unstorable_text_is_refused_and_the_same_transaction_commits_a_good_send(
    seeded: str,
    handle: str,
    override: dict[str, Any],
    error: type[OutboxError],
    fragment: str,
) -> None:
    before = _rows(seeded)
    good = {"headers": {"h": "fine", "blob": b"\x00\xff"}, "key": "k"}
    if handle == "psycopg":
        with psycopg.connect(seeded) as conn:
            with conn.transaction():
                with pytest.raises(error) as info:
                    _send_in(conn, override)
                good_id = broker.send(conn, "ok.topic", {"good": True}, **good)
    else:
        from sqlalchemy.orm import Session

        engine = create_engine(sqlalchemy_url(seeded))
        try:
            with Session(engine) as session:
                with pytest.raises(error) as info:
                    _send_in(session, override)
                good_id = broker.send(session, "ok.topic", {"good": True}, **good)
                session.commit()
        finally:
            engine.dispose()
    assert fragment in str(info.value)
    assert not isinstance(info.value, UnicodeError)
    after = _rows(seeded)
    assert after[: len(before)] == before
    assert [row[1] for row in after[len(before) :]] == [good_id]


def test_send_to_a_database_without_the_schema_names_the_fix(
    outbox_empty_database_url: str, outbox_database_url: str
) -> None:
    """Not migrated, or a misspelt Broker(schema=...): an OutboxError that says to migrate
    (psycopg's UndefinedTable before), on psycopg and SQLAlchemy handles alike."""
    from sqlalchemy.orm import Session

    from outbox import SchemaNotMigrated

    cases = [(outbox_empty_database_url, Broker()), (outbox_database_url, Broker(schema="outbx"))]
    for url, sender in cases:
        with psycopg.connect(url) as conn:
            with pytest.raises(SchemaNotMigrated, match=r"run `outbox migrate --schema"):
                with conn.transaction():
                    sender.send(conn, "t", b"x")
        engine = create_engine(sqlalchemy_url(url))
        try:
            with Session(engine) as session:
                with pytest.raises(SchemaNotMigrated, match=f"{sender.schema}.producer_queue"):
                    sender.send_many(session, [Message("t", b"1"), Message("t", b"2")])
        finally:
            engine.dispose()


def test_a_role_without_privileges_gets_one_line_saying_so(outbox_database_url: str) -> None:
    """A daemon run as a role that cannot use the schema: not 'unexpected
    InsufficientPrivilege', but what the role lacks."""
    role = f"r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        url = psycopg.conninfo.make_conninfo(outbox_database_url, user=role)
        result = _cli("producer", "--database-url", url, "--kafka-bootstrap", "127.0.0.1:1")
        _one_line_error(result, "PostgreSQL refused: permission denied for schema outbox")
        assert "the database role lacks a privilege" in result.stderr
        assert "unexpected" not in result.stderr
    finally:
        with psycopg.connect(outbox_database_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


def test_a_log_url_with_the_kafka_transport_is_named_as_unused(outbox_database_url: str) -> None:
    result = _cli(
        "producer",
        "--database-url",
        outbox_database_url,
        "--log-url",
        outbox_database_url,
        "--kafka-bootstrap",
        f"127.0.0.1:{free_port()}",
        "--kafka-config",
        "socket.connection.setup.timeout.ms=1000",
    )
    assert result.returncode == 1
    assert "--log-url (or OUTBOX_LOG_URL) is set but the transport is kafka" in result.stderr


def test_send_works_whatever_rows_the_callers_connection_makes(seeded: str) -> None:
    """`send` reads its statement's result: a connection with `row_factory=dict_row` (or a
    class of the caller's) must not break it, nor its duplicate-id check."""
    import asyncio
    from dataclasses import dataclass

    from psycopg.rows import class_row, dict_row

    @dataclass
    class Anything:
        inserted: int
        notified: bool

    mid = uuid.uuid4()
    with psycopg.connect(seeded, row_factory=dict_row) as conn, conn.transaction():
        broker.send(conn, "t", b"1", message_id=mid)
        with pytest.raises(DuplicateMessageId, match=str(mid)):
            broker.send(conn, "t", b"2", message_id=mid)
    with psycopg.connect(seeded) as conn:
        conn.row_factory = class_row(Anything)  # type: ignore[assignment]
        with conn.transaction():
            broker.send_many(conn, [Message("t", b"3"), Message("t", b"4")])

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(seeded, row_factory=dict_row) as conn:
            async with conn.transaction():
                await broker.send_async(conn, "t", b"5")

    asyncio.run(main())
    assert [r[4] for r in _rows(seeded)][-4:] == [b"1", b"3", b"4", b"5"]


@pytest.mark.parametrize("many", [False, True])
def test_an_id_sent_meanwhile_by_another_transaction_is_refused_the_same_way(
    seeded: str, many: bool
) -> None:
    """Another transaction sent the id and has not committed yet: this send waits for it and,
    once it commits, is refused as DuplicateMessageId, its transaction still usable, nothing
    of it written (a batch's other rows are taken back)."""
    import threading

    mid, other = uuid.uuid4(), uuid.uuid4()
    outcome: list[BaseException | None] = []
    with psycopg.connect(seeded) as first, psycopg.connect(seeded) as second:
        first.execute("BEGIN")
        broker.send(first, "t", b"first", message_id=mid)

        def send_too() -> None:
            try:
                with second.transaction():
                    if many:
                        messages = [
                            Message("t", b"o", message_id=other),
                            Message("t", b"2", message_id=mid),
                        ]
                        broker.send_many(second, messages)
                    else:
                        broker.send(second, "t", b"2", message_id=mid)
            except BaseException as exc:
                outcome.append(exc)
            else:
                outcome.append(None)
            second.execute("SELECT 1")  # the connection is not in a failed transaction

        thread = threading.Thread(target=send_too)
        thread.start()
        time.sleep(0.5)  # the second send waits for the first transaction
        first.execute("COMMIT")
        thread.join(30)
    [error] = outcome
    assert isinstance(error, DuplicateMessageId) and str(mid) in str(error), error
    rows = [(r[1], r[4]) for r in _rows(seeded) if r[1] in (mid, other)]
    assert rows == [(mid, b"first")], "nothing of the refused send was written"
