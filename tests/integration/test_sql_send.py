"""`outbox.send(...)`, the SQL function of migration 0008: what `Broker.send` does, from SQL.

The same refusals with the same messages (the table of tests/integration/send_cases.py runs
through both), the same row for the same arguments, the same wake-up, only in the caller's
transaction, and a message a Python handler receives as it would one sent from Python. psql
(the server's own client) sends in a schema migrated with `outbox migrate --schema`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from outbox import Broker, DuplicateMessageId, Handlers, InboxMessage
from outbox.postgres.queries import channel
from outbox.testing.plugin import Drain
from outbox.testing.servers import find_postgres_bindir

from .send_cases import BAD_SENDS, LIMIT, BadSend

broker = Broker(max_message_bytes=LIMIT)
big_broker = Broker()

COLUMNS = "topic, key, payload, headers, content_type, lane, attempts, dead_at"


#: A payload bound as SQL's NULL (not JSON's null) by `sql_send`.
SQL_NULL = object()


def sql_send(conn: psycopg.Connection[Any], schema: str = "outbox", **arguments: Any) -> uuid.UUID:
    """`schema.send(...)` with `arguments` (topic and payload required), in `conn`'s
    transaction; JSON arguments are bound as jsonb."""
    args = dict(arguments)
    names = ["topic", "payload", "key", "headers", "message_id", "tenant"]
    params = {name: args.pop(name, None) for name in names}
    assert not args, args
    # The payload as jsonb (None is JSON's null), unless SQL_NULL; headers None is SQL's NULL.
    params["payload"] = None if params["payload"] is SQL_NULL else Jsonb(params["payload"])
    if params["headers"] is not None:
        params["headers"] = Jsonb(params["headers"])
    row = conn.execute(
        f"SELECT {schema}.send(%(topic)s, %(payload)s, key => %(key)s, headers => %(headers)s, "
        "message_id => %(message_id)s, tenant => %(tenant)s)",
        params,
    ).fetchone()
    assert row is not None
    result: uuid.UUID = row[0]
    return result


def python_send(conn: psycopg.Connection[Any], sender: Broker = broker, **arguments: Any) -> Any:
    args = dict(arguments)
    return sender.send(conn, args.pop("topic"), args.pop("payload"), **args)


def rows(url: str, schema: str = "outbox") -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            f"SELECT message_id, {COLUMNS} FROM {schema}.producer_queue ORDER BY id"
        ).fetchall()


@pytest.fixture
def seeded(outbox_database_url: str) -> str:
    """A database holding one message, which no refused send may disturb."""
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        big_broker.send(conn, "seed", {"keep": True}, key="seed")
    return outbox_database_url


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD_SENDS, ids=[case.name for case in BAD_SENDS])
def test_a_bad_send_is_refused_alike_by_python_and_sql(seeded: str, case: BadSend) -> None:
    before = rows(seeded)
    arguments = {"topic": "ok.topic", "payload": {"a": 1}, **case.arguments}
    with psycopg.connect(seeded) as conn:
        with conn.transaction():
            with pytest.raises(case.error) as python:
                python_send(conn, **arguments)
            assert case.fragment in str(python.value)
        with pytest.raises(psycopg.Error) as sql, conn.transaction():
            conn.execute(f"SET LOCAL outbox.max_message_bytes = {LIMIT}")
            sql_send(conn, **arguments)
    error = sql.value
    assert error.sqlstate == "22023", error
    assert error.diag.message_detail == case.error.__name__
    assert case.fragment in str(error.diag.message_primary)
    if case.error.__name__ != "PayloadTooLarge":  # SQL names its setting, not the Broker's
        if case.same_text:
            assert str(error.diag.message_primary) == str(python.value)
    else:
        assert (
            str(error.diag.message_primary).split("; the limit")[0]
            == str(python.value).split("; the limit")[0]
        ), "the same record size, counted alike"
    assert rows(seeded) == before


@pytest.mark.parametrize(
    ("arguments", "detail", "fragment"),
    [
        ({"topic": None, "payload": {}}, "InvalidTopic", "topic must be text, got NULL"),
        ({"topic": "t", "payload": SQL_NULL}, "SerializationError", "SQL NULL: give 'null'::jsonb"),
    ],
    ids=["null topic", "null payload"],
)
def test_sql_nulls_are_refused_by_name(
    seeded: str, arguments: dict[str, Any], detail: str, fragment: str
) -> None:
    before = rows(seeded)
    with psycopg.connect(seeded) as conn:
        with pytest.raises(psycopg.Error) as info, conn.transaction():
            sql_send(conn, **arguments)
    assert info.value.sqlstate == "22023"
    assert info.value.diag.message_detail == detail
    assert fragment in str(info.value.diag.message_primary)
    assert rows(seeded) == before


def test_a_message_id_that_is_not_a_uuid_is_refused_by_postgresql_before_the_call(
    seeded: str,
) -> None:
    """Python's "message_id ... is not a UUID" is PostgreSQL's own check in SQL (22P02)."""
    before = rows(seeded)
    with psycopg.connect(seeded) as conn:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="uuid"):
            conn.execute("SELECT outbox.send('t', '{}', message_id => 'not-a-uuid')")
    assert rows(seeded) == before


def test_a_bad_limit_setting_is_refused(seeded: str) -> None:
    with psycopg.connect(seeded) as conn:
        with pytest.raises(psycopg.Error, match="whole number of bytes"), conn.transaction():
            conn.execute("SET LOCAL outbox.max_message_bytes = 'lots'")
            sql_send(conn, topic="t", payload=1)
        with conn.transaction():  # the limit is the setting's: a larger one lets more through
            conn.execute("SET LOCAL outbox.max_message_bytes = 5000000")
            sql_send(conn, topic="t", payload="x" * 2_000_000)
        with pytest.raises(psycopg.Error, match="the limit is 999872 bytes"), conn.transaction():
            sql_send(conn, topic="t", payload="x" * 1_000_000)


def test_a_message_id_still_waiting_in_the_queue_is_refused_as_python_refuses_it(
    seeded: str,
) -> None:
    """As `DuplicateMessageId`: the message already waiting is kept, nothing more is written;
    SQL cannot refuse without failing the statement, so the error is 23505 (unique_violation)."""
    taken = uuid.uuid4()
    with psycopg.connect(seeded) as conn:
        with conn.transaction():
            sql_send(conn, topic="t", payload={"first": True}, message_id=taken)
        before = rows(seeded)
        with conn.transaction():
            with pytest.raises(DuplicateMessageId) as python:
                python_send(conn, topic="t", payload={"second": True}, message_id=taken)
        with pytest.raises(psycopg.errors.UniqueViolation) as sql, conn.transaction():
            sql_send(conn, topic="t", payload={"second": True}, message_id=taken)
    assert sql.value.diag.message_primary == str(python.value)
    assert sql.value.diag.message_detail == "DuplicateMessageId"
    assert rows(seeded) == before


def test_a_message_id_sent_by_a_concurrent_transaction_waits_for_its_outcome(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    taken = uuid.uuid4()
    outcome: list[object] = []
    with psycopg.connect(url) as first:
        first.execute("BEGIN")
        sql_send(first, topic="t", payload=1, message_id=taken)

        def second() -> None:
            with psycopg.connect(url) as conn:
                try:
                    with conn.transaction():
                        outcome.append(sql_send(conn, topic="t", payload=2, message_id=taken))
                except psycopg.errors.UniqueViolation as exc:
                    outcome.append(exc)

        waiting = threading.Thread(target=second)
        waiting.start()
        time.sleep(0.5)
        assert outcome == [], "the second send waits for the first transaction"
        first.execute("ROLLBACK")
        waiting.join(10)
    assert outcome == [taken], "the first rolled back: the second is the message"
    assert [r[0] for r in rows(url)] == [taken]
    with psycopg.connect(url) as conn:
        conn.execute("BEGIN")
        conn.execute("DELETE FROM outbox.producer_queue")
        sql_send(conn, topic="t", payload=1, message_id=taken)
        outcome.clear()
        waiting = threading.Thread(target=second)
        waiting.start()
        time.sleep(0.5)
        conn.execute("COMMIT")
        waiting.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.UniqueViolation)
    assert [r[3] for r in rows(url)] == [b"1"]


# -- the row -------------------------------------------------------------------------------------


def _both_rows(url: str, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The rows Python's send and SQL's write for `arguments` (the payload given to Python as
    jsonb gives it back, its keys in jsonb's order; the same message id for both, so that a
    message without a key gets the same lane)."""
    arguments = {"message_id": uuid.uuid4(), **arguments}
    with psycopg.connect(url, autocommit=True) as conn:
        text = conn.execute("SELECT %s::text", (Jsonb(arguments["payload"]),)).fetchone()
        assert text is not None
        with conn.transaction():
            conn.execute("DELETE FROM outbox.producer_queue")
            python_send(conn, big_broker, **{**arguments, "payload": json.loads(text[0])})
        (python,) = rows(url)
        with conn.transaction():
            conn.execute("DELETE FROM outbox.producer_queue")
            returned = sql_send(conn, **arguments)
        (sql,) = rows(url)
        assert returned == sql[0] == arguments["message_id"]
    return python, sql


EXAMPLES: list[dict[str, Any]] = [
    {"topic": "orders.placed", "payload": {"id": 7, "total": "12.50", "lines": [1, 2]}},
    {"topic": "t", "payload": {"b": 1, "a": {"z": [True, None, 1.5]}}, "key": "order-7"},
    {"topic": "t", "payload": {"s": "text, with: separators"}, "key": "é€𝄞"},
    {"topic": "t", "payload": [1, -2.5e-3, 1e20, 'a"b\\c\n\t\u0001'], "headers": {"h": "v"}},
    {"topic": "T_1-2.3", "payload": None, "headers": {"x-trace": "a: b, c", "É": "ü"}},
    {"topic": "t", "payload": {"k": "v"}, "tenant": "tenant-1.a_b"},
    {"topic": "t", "payload": 0, "key": "", "headers": {}},
]


@pytest.mark.parametrize("arguments", EXAMPLES)
def test_sql_send_writes_the_row_python_send_writes(
    outbox_database_url: str, arguments: dict[str, Any]
) -> None:
    python, sql = _both_rows(outbox_database_url, arguments)
    assert sql == python


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",))),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=5).filter(lambda s: "\x00" not in s), children, max_size=4
        )
    ),
    max_leaves=12,
)
storable = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)))


def test_a_json_string_payload_is_json_not_text(outbox_database_url: str) -> None:
    """Python sends a str payload as text/plain; SQL's payload is jsonb, so a JSON string is
    sent as JSON (quoted), as Python sends it only when asked for JSON."""
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        sql_send(conn, topic="t", payload="a: b")
    ((payload, content_type),) = [(r[3], r[5]) for r in rows(outbox_database_url)]
    assert (payload, content_type) == (b'"a: b"', "application/json")


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    payload=json_values,
    key=st.none() | storable,
    headers=st.none()
    | st.dictionaries(
        storable.filter(lambda s: s and not s.lower().startswith("outbox-")).filter(
            lambda s: s.lower() != "content-type"
        ),
        storable,
        max_size=3,
    ),
    tenant=st.none() | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True),
)
def test_sql_send_and_python_send_write_equal_rows_for_any_arguments(
    outbox_database_url: str, payload: Any, key: Any, headers: Any, tenant: Any
) -> None:
    assume(not isinstance(payload, str))  # Python sends a str as text: see the test above
    arguments = {"topic": "prop", "payload": payload, "key": key, "headers": headers}
    if tenant is not None:
        arguments["tenant"] = tenant
    python, sql = _both_rows(outbox_database_url, arguments)
    assert sql == python


# -- the transaction and the wake-up -------------------------------------------------------------


def test_sql_send_writes_in_the_callers_transaction_only(outbox_database_url: str) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            sql_send(conn, topic="t", payload={"n": 1})
            raise RuntimeError("the caller's work fails")
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            kept = sql_send(conn, topic="t", payload={"n": 2})
            assert rows(url) == [], "not visible before the commit"
        assert [r[0] for r in rows(url)] == [kept]


def _notified_by_sql_send(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel("outbox", "producer_queue")}"')
        with psycopg.connect(url) as conn, conn.transaction():
            sql_send(conn, topic="t.wake", payload=1)
        return any(True for _ in listener.notifies(timeout=0.5, stop_after=1))


def test_sql_send_notifies_only_while_a_relay_sleeps(outbox_database_url: str) -> None:
    url = outbox_database_url
    assert not _notified_by_sql_send(url), "no relay: nobody to wake"
    with psycopg.connect(url, autocommit=True) as keeper:
        keeper.execute(
            "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping) "
            "VALUES ('r1', 'producer', pg_backend_pid(), false)"
        )
        assert not _notified_by_sql_send(url), "a busy relay needs no NOTIFY"
        keeper.execute("UPDATE outbox.relay_state SET sleeping = true")
        assert _notified_by_sql_send(url), "a sleeping relay is woken"


# -- received as Python's ------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["log", "kafka"])
def test_a_python_handler_receives_an_sql_send_as_a_python_send(
    request: pytest.FixtureRequest, outbox_database_url: str, outbox_drain: Drain, transport: str
) -> None:
    """Over the log kept in PostgreSQL and over the session's Kafka-protocol broker."""
    url = outbox_database_url
    if transport == "kafka":
        topic = request.getfixturevalue("outbox_topic")
        endpoint = request.getfixturevalue("outbox_kafka_bootstrap")
    else:
        topic, endpoint = "sql.orders", request.getfixturevalue("outbox_log_url")
    received: list[InboxMessage[Any]] = []
    handlers = Handlers()

    @handlers.handler(topic)
    def record(message: InboxMessage[Any], conn: Any) -> None:
        received.append(message)

    arguments = {
        "topic": topic,
        "payload": {"id": 1, "items": ["a"]},
        "key": "order-1",
        "headers": {"x-source": "sql"},
        "tenant": "shop",
    }
    with psycopg.connect(url) as conn:
        with conn.transaction():
            from_sql = sql_send(conn, **arguments)
            from_python = python_send(conn, big_broker, **arguments)
        with pytest.raises(RuntimeError), conn.transaction():
            sql_send(conn, topic=topic, payload={"id": 2})
            raise RuntimeError("rolled back")
    outbox_drain(handlers, transport=endpoint, timeout=90)
    assert sorted(m.id for m in received) == sorted([from_sql, from_python])
    by_id = {m.id: m for m in received}
    sql, python = by_id[from_sql], by_id[from_python]
    for name in ("topic", "key", "payload", "raw_payload", "content_type"):
        assert getattr(sql, name) == getattr(python, name), name
    assert sql.headers == python.headers
    assert sql.headers["outbox-tenant"] == "shop"
    assert sql.headers["x-source"] == "sql"
    assert abs((sql.created_at - python.created_at).total_seconds()) < 1


# -- psql, in a schema of its own ----------------------------------------------------------------


def _psql(url: str, script: str) -> subprocess.CompletedProcess[str]:
    psql = find_postgres_bindir() / "psql"
    return subprocess.run(
        [
            str(psql),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
            url,
        ],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_psql_sends_in_a_migrated_schema_of_its_own(
    outbox_empty_database_url: str, outbox_log_url: str, outbox_drain: Drain
) -> None:
    url = outbox_empty_database_url
    subprocess.run(
        [
            sys.executable,
            "-m",
            "outbox.cli",
            "migrate",
            "--database-url",
            url,
            "--schema",
            "billing",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    committed = _psql(
        url,
        "CREATE TABLE invoices (id int);\n"
        "BEGIN;\n"
        "INSERT INTO invoices VALUES (1);\n"
        "SELECT billing.send('billing.invoiced', '{\"invoice\": 1}', key => 'customer-9',\n"
        '                    headers => \'{"x-origin": "psql"}\');\n'
        "COMMIT;\n"
        "BEGIN;\n"
        "INSERT INTO invoices VALUES (2);\n"
        "SELECT billing.send('billing.invoiced', '{\"invoice\": 2}', key => 'customer-9');\n"
        "ROLLBACK;\n",
    )
    assert committed.returncode == 0, committed.stderr
    sent, rolled_back = committed.stdout.split()
    refused = _psql(url, "SELECT billing.send('no spaces', '{}');\n")
    assert refused.returncode != 0
    assert "ERROR:  22023: topic 'no spaces' contains ' '" in refused.stderr, refused.stderr
    assert "DETAIL:  InvalidTopic" in refused.stderr
    assert [str(r[0]) for r in rows(url, "billing")] == [sent], rolled_back

    received: list[InboxMessage[Any]] = []
    handlers = Handlers()

    @handlers.handler("billing.invoiced")
    def record(message: InboxMessage[Any], conn: Any) -> None:
        received.append(message)

    from outbox.testing.draining import drain

    drain(handlers, url, outbox_log_url, schema="billing")
    assert [(str(m.id), m.payload, m.key, m.headers.get("x-origin")) for m in received] == [
        (sent, {"invoice": 1}, b"customer-9", "psql")
    ]


# -- due later (migration 0012): as Broker.send(..., deliver_at=...) -------------------------

SCHEDULED = "message_id, topic, key, payload, headers, content_type, lane, deliver_at"


def test_a_send_due_later_waits_in_producer_scheduled_as_python_writes_it(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        due = conn.execute("SELECT now() + interval '1 hour'").fetchone()[0]  # type: ignore[index]
        by_sql = conn.execute(
            "SELECT outbox.send('later', %s, 'k', NULL, NULL, NULL, %s)",
            (Jsonb({"n": 1}), due),
        ).fetchone()[0]  # type: ignore[index]
        by_python = broker.send(conn, "later", {"n": 1}, key="k", deliver_at=due)
        past = conn.execute(
            "SELECT outbox.send('later', %s, deliver_at => now() - interval '1 minute')",
            (Jsonb({"n": 2}),),
        ).fetchone()[0]  # type: ignore[index]
    with psycopg.connect(url) as conn:
        scheduled = {
            r[0]: r[1:]
            for r in conn.execute(f"SELECT {SCHEDULED} FROM outbox.producer_scheduled").fetchall()
        }
        queued = [r[0] for r in conn.execute("SELECT message_id FROM outbox.producer_queue")]
    assert set(scheduled) == {by_sql, by_python}
    assert scheduled[by_sql] == scheduled[by_python]  # the same row, the same due time
    assert queued == [past]  # a due time already past means now
    with psycopg.connect(url) as conn, conn.transaction():
        assert broker.cancel(conn, by_sql) is True  # Python takes back what SQL scheduled
    with psycopg.connect(url) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation) as refused:
            conn.execute(
                "SELECT outbox.send('later', '1', message_id => %s, deliver_at => %s)",
                (by_python, due),
            )
    assert refused.value.diag.message_detail == "DuplicateMessageId"
    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT message_id FROM outbox.producer_scheduled").fetchall()
    assert left == [(by_python,)]  # the cancel committed; the duplicate wrote nothing


def test_a_message_id_waiting_in_either_queue_is_refused_due_now_or_later(
    outbox_database_url: str,
) -> None:
    """Migration 0014: a send due now whose id a message due later has, and one due later
    whose id a message due now has, are refused as Python refuses them (each branch looked
    only in the table it writes, so a retry whose due time had passed meanwhile wrote the
    message twice)."""
    url = outbox_database_url
    later, now = uuid.uuid4(), uuid.uuid4()
    send = "SELECT outbox.send('t', '1', message_id => %s, deliver_at => {})"
    with psycopg.connect(url) as conn:
        with conn.transaction():
            conn.execute(send.format("now() + interval '1 hour'"), (later,))
            conn.execute(send.format("NULL"), (now,))
        before = rows(url)
        for taken, due in [
            (later, "NULL"),
            (later, "now() - interval '1 hour'"),
            (now, "now() + interval '1 hour'"),
        ]:
            with pytest.raises(psycopg.errors.UniqueViolation) as refused, conn.transaction():
                conn.execute(send.format(due), (taken,))
            assert refused.value.diag.message_detail == "DuplicateMessageId"
            assert f"message id {taken} is already in producer_queue or producer_scheduled" in str(
                refused.value
            )
        with conn.transaction(), pytest.raises(DuplicateMessageId):
            broker.send(conn, "t", 1, message_id=now, delay=timedelta(hours=1))
    assert rows(url) == before
    with psycopg.connect(url) as conn:
        scheduled = conn.execute("SELECT message_id FROM outbox.producer_scheduled").fetchall()
    assert scheduled == [(later,)]


def test_an_infinite_due_time_is_refused_and_an_old_one_harms_nothing(
    outbox_database_url: str,
) -> None:
    """`infinity` is a timestamp to PostgreSQL: the SQL send took it, and every statement that
    measures the time to the next due row failed on it ("cannot subtract infinite
    timestamps"): the Producer's move of due rows for its lanes, and `outbox status`. Now the
    table refuses one (migration 0013); one left from before (a restored backup) is read as
    due in year 9999 (or, -infinity, year 1: due now)."""
    from outbox.core.databases import Database
    from outbox.postgres import operations as ops
    from outbox.postgres.outbox_store import OutboxStore
    from outbox.postgres.probes import PostgresProbe

    url = outbox_database_url
    with psycopg.connect(url) as conn:
        for value in ("infinity", "-infinity"):
            if value == "-infinity":  # due now: it goes to producer_queue, a finite row
                conn.execute("SELECT outbox.send('later', '1', deliver_at => %s)", (value,))
                continue
            with pytest.raises(psycopg.errors.CheckViolation) as refused:
                conn.execute("SELECT outbox.send('later', '1', deliver_at => %s)", (value,))
            assert refused.value.diag.constraint_name == "producer_scheduled_deliver_at_finite"
            conn.rollback()
        conn.commit()
        assert conn.execute("SELECT count(*) FROM outbox.producer_scheduled").fetchone() == (0,)
        # Rows from before the constraint: it is dropped, the rows written, and it is added
        # again as the migration adds it (NOT VALID: old rows stay).
        conn.execute(
            "ALTER TABLE outbox.producer_scheduled DROP CONSTRAINT "
            "producer_scheduled_deliver_at_finite"
        )
        never = conn.execute(
            "SELECT outbox.send('later', '1', key => 'a', deliver_at => 'infinity')"
        ).fetchone()[0]  # type: ignore[index]
        soon = conn.execute(
            "SELECT outbox.send('later', '2', key => 'b', deliver_at => now() + interval '1 h')"
        ).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "UPDATE outbox.producer_scheduled SET deliver_at = '-infinity' WHERE message_id = %s",
            (soon,),
        )
        conn.execute(
            "ALTER TABLE outbox.producer_scheduled ADD CONSTRAINT "
            "producer_scheduled_deliver_at_finite CHECK (isfinite(deliver_at)) NOT VALID"
        )
        conn.commit()
        status = ops.status(conn, "outbox")
        (scheduled,) = status.scheduled
        assert scheduled.rows == 2 and scheduled.overdue == 1
        assert scheduled.next_due_at.year == 1 and scheduled.next_due_in < 0
        probe = PostgresProbe(Database("d", url, "outbox"))
        try:
            stats = probe.queue_stats("producer_queue", 10)
        finally:
            probe.close()
        assert stats is not None
        lanes = [r[0] for r in conn.execute("SELECT DISTINCT lane FROM outbox.producer_scheduled")]
        moved, next_due = OutboxStore("outbox").promote(conn, lanes, 10)
        conn.commit()
        assert moved == 1 and next_due is not None and next_due > 200 * 365 * 86400
        queued = conn.execute("SELECT message_id FROM outbox.producer_queue").fetchall()
        assert (soon,) in queued and (never,) not in queued


def test_migration_0013_makes_infinite_due_times_of_an_older_schema_finite(
    outbox_database_url: str,
) -> None:
    """A database at 0012 (an older outbox, a restored backup) with infinite due times: the
    upgrade makes them finite (infinity: year 9999, -infinity: now) and adds the check."""
    from outbox.postgres import migrate

    url = outbox_database_url
    migrate.downgrade(url, "outbox", "0012")
    with psycopg.connect(url) as conn:
        never = conn.execute(
            "SELECT outbox.send('later', '1', deliver_at => 'infinity')"
        ).fetchone()[0]  # type: ignore[index]
        was = conn.execute(
            "SELECT outbox.send('later', '2', deliver_at => now() + interval '1 h')"
        ).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "UPDATE outbox.producer_scheduled SET deliver_at = '-infinity' WHERE message_id = %s",
            (was,),
        )
    migrate.upgrade(url, "outbox")
    with psycopg.connect(url) as conn:
        rows = {
            r[0]: (int(r[1]), r[2])
            for r in conn.execute(
                "SELECT message_id, extract(year FROM deliver_at), deliver_at <= now() "
                "FROM outbox.producer_scheduled"
            )
        }
        valid = conn.execute(
            "SELECT convalidated FROM pg_constraint "
            "WHERE conname = 'producer_scheduled_deliver_at_finite'"
        ).fetchone()
    assert rows == {never: (9999, False), was: (rows[was][0], True)}, rows
    assert valid == (True,)
