"""The operator commands: `outbox status` and `outbox dead-letters list|show|requeue|purge`.

Rows are inserted with SQL in exactly the states each test needs; the commands run as the real
CLI in a subprocess, except for the checks of the Python API in `outbox.postgres.operations`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox.core.errors import ConfigurationError
from outbox.postgres import migrate
from outbox.postgres import operations as ops
from outbox.postgres.queries import channel, quote_ident

CLI = [sys.executable, "-m", "outbox.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def _ok(*args: str) -> str:
    result = _cli(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _json(*args: str) -> Any:
    return json.loads(_ok(*args, "--json"))


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment in lines[0], lines[0]


def _traceback() -> str:
    try:
        raise ValueError("price must be positive")
    except ValueError as exc:
        return "".join(traceback.format_exception(exc))


def insert(
    url: str,
    queue: ops.Queue,
    state: str,
    *,
    topic: str = "orders",
    age: float = 0.0,
    key: bytes | None = b"k-1",
    payload: bytes = b'{"n": 1}',
    error: str | None = None,
    schema: str = "outbox",
) -> tuple[int, uuid.UUID]:
    """Insert one row in `state`, `age` seconds old (created_at / received_at); (id, uuid)."""
    attempts = {"pending": 0, "retrying": 2, "dead": 5, "processed": 1}[state]
    if state in ("retrying", "dead") and error is None:
        error = _traceback()
    columns = {
        "message_id": uuid.uuid4(),
        "topic": topic,
        "key": key,
        "payload": b"" if state == "processed" else payload,
        "content_type": "application/json",
        "lane": 7,
        "attempts": attempts,
        "last_error": error,
    }
    age_column = "created_at" if queue == "producer" else "received_at"
    extra = ", processed_at" if queue == "consumer" else ""
    extra_value = ", CASE WHEN %(processed)s THEN now() END" if queue == "consumer" else ""
    sql = (
        f"INSERT INTO {quote_ident(schema)}.{queue}_queue ({', '.join(columns)}, {age_column}, "
        f"dead_at{extra}) VALUES ({', '.join(f'%({c})s' for c in columns)}, "
        f"now() - make_interval(secs => %(age)s), CASE WHEN %(dead)s THEN now() END"
        f"{extra_value}) RETURNING id"
    )
    params = {**columns, "age": age, "dead": state == "dead", "processed": state == "processed"}
    with psycopg.connect(url) as conn:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        if queue == "producer" and state == "dead":
            # Where the relay keeps a dead producer row.
            conn.execute(MOVE_TO_DEAD.format(schema=quote_ident(schema)), (row[0],))
    return int(row[0]), columns["message_id"]


MOVE_TO_DEAD = (
    "WITH moved AS (DELETE FROM {schema}.producer_queue WHERE id = %s RETURNING *) "
    "INSERT INTO {schema}.producer_dead (id, message_id, topic, key, payload, headers, "
    "content_type, lane, created_at, attempts, next_attempt_at, last_error, dead_at) "
    "SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at, "
    "attempts, next_attempt_at, last_error, dead_at FROM moved"
)


def _tables(queue: str) -> list[str]:
    """The tables a queue's rows live in: a dead producer row is in producer_dead."""
    return ["producer_queue", "producer_dead"] if queue == "producer" else [f"{queue}_queue"]


def row_of(url: str, queue: str, id_: int) -> dict[str, Any]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        for table in _tables(queue):
            row = cur.execute(f"SELECT * FROM outbox.{table} WHERE id = %s", (id_,)).fetchone()
            if row is not None:
                return row
    raise AssertionError(f"{queue}_queue has no row {id_}")


def all_rows(url: str, queue: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return sorted(
            row
            for table in _tables(queue)
            for row in conn.execute(
                f"SELECT id, attempts, dead_at, last_error FROM outbox.{table} ORDER BY id"
            ).fetchall()
        )


# -- status ---------------------------------------------------------------------------------


def _assert_age(count: dict[str, Any], rows: int, age: float | None) -> None:
    assert count["count"] == rows, count
    if age is None:
        assert count["oldest_age_seconds"] is None
    else:
        # The command runs a moment after the insert: allow that, never less than inserted.
        assert age <= count["oldest_age_seconds"] < age + 30, count


def test_status_json_counts_and_oldest_ages_per_topic_and_state(outbox_database_url: str) -> None:
    url = outbox_database_url
    insert(url, "producer", "pending", topic="orders", age=100)
    insert(url, "producer", "pending", topic="orders", age=10)
    insert(url, "producer", "retrying", topic="orders", age=50)
    insert(url, "producer", "dead", topic="orders", age=3600)
    insert(url, "producer", "pending", topic="payments", age=5)
    insert(url, "consumer", "pending", topic="orders", age=20)
    insert(url, "consumer", "dead", topic="orders", age=200)
    insert(url, "consumer", "processed", topic="orders", age=1000)
    insert(url, "consumer", "processed", topic="orders", age=30)
    insert(url, "consumer", "retrying", topic="refunds", age=7)

    with psycopg.connect(url, autocommit=True) as live:
        live.execute(
            "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping) "
            "VALUES ('host:1:live', 'producer', pg_backend_pid(), true), "
            "('host:2:gone', 'handler', 2147483000, false)"
        )
        doc = _json("status", "--database-url", url)

    assert doc["format_version"] == 1
    assert doc["schema"] == "outbox"
    producer = doc["queues"]["producer"]
    assert producer["table"] == "producer_queue"
    assert producer["age_column"] == "created_at"
    assert producer["states"] == ["pending", "retrying", "dead"]
    assert set(producer["topics"]) == {"orders", "payments"}
    orders = producer["topics"]["orders"]
    _assert_age(orders["pending"], 2, 100)
    _assert_age(orders["retrying"], 1, 50)
    _assert_age(orders["dead"], 1, 3600)
    _assert_age(orders["total"], 4, 3600)
    payments = producer["topics"]["payments"]
    _assert_age(payments["pending"], 1, 5)
    _assert_age(payments["retrying"], 0, None)
    _assert_age(payments["dead"], 0, None)
    _assert_age(producer["totals"]["pending"], 3, 100)
    _assert_age(producer["totals"]["total"], 5, 3600)

    consumer = doc["queues"]["consumer"]
    assert consumer["age_column"] == "received_at"
    assert consumer["states"] == ["pending", "retrying", "dead", "processed"]
    orders = consumer["topics"]["orders"]
    _assert_age(orders["pending"], 1, 20)
    _assert_age(orders["retrying"], 0, None)
    _assert_age(orders["dead"], 1, 200)
    _assert_age(orders["processed"], 2, 1000)
    _assert_age(consumer["topics"]["refunds"]["retrying"], 1, 7)
    _assert_age(consumer["totals"]["dead"], 1, 200)
    _assert_age(consumer["totals"]["total"], 5, 1000)

    processes = {p["relay_id"]: p for p in doc["processes"]}
    assert set(processes) == {"host:1:live", "host:2:gone"}
    assert processes["host:1:live"]["queue"] == "producer"
    assert processes["host:1:live"]["sleeping"] is True
    assert processes["host:1:live"]["alive"] is True
    assert 0 <= processes["host:1:live"]["seconds_since_update"] < 30
    assert processes["host:2:gone"]["alive"] is False


def test_status_text_is_an_aligned_table_per_queue(outbox_database_url: str) -> None:
    url = outbox_database_url
    insert(url, "producer", "pending", topic="orders", age=100)
    insert(url, "producer", "dead", topic="a.much.longer.topic.name", age=7300)
    insert(url, "consumer", "dead", topic="orders", age=65)

    lines = _ok("status", "--database-url", url).splitlines()

    assert lines[0].startswith("outbox schema 'outbox' at ")
    start = lines.index(next(line for line in lines if line.startswith("producer_queue:")))
    assert lines[start].startswith("producer_queue: 2 rows, oldest 2h01m")
    header, *body = lines[start + 1 : start + 5]
    assert header.split() == ["TOPIC", "PENDING", "RETRYING", "DEAD"]
    assert [row.split()[0] for row in body] == ["a.much.longer.topic.name", "orders", "TOTAL"]
    dead_column = header.index("DEAD")
    assert body[0][dead_column:].startswith("1 (2h01m)")
    assert body[1][dead_column:].rstrip() == "-"
    assert body[2][dead_column:].startswith("1 (2h01m)")
    assert body[1][header.index("PENDING") :].startswith("1 (1m4")  # 1m40s and a moment
    consumer = lines.index(next(line for line in lines if line.startswith("consumer_queue:")))
    assert lines[consumer].startswith("consumer_queue: 1 row, oldest 1m0")
    assert lines[consumer + 1].split() == ["TOPIC", "PENDING", "RETRYING", "DEAD", "PROCESSED"]
    assert lines[-1] == "processes: none registered in relay_state"


def test_status_of_an_empty_queue_and_another_schema(outbox_empty_database_url: str) -> None:
    url = outbox_empty_database_url
    migrate.upgrade(url, "billing")
    insert(url, "consumer", "dead", topic="invoices", schema="billing")
    doc = _json("status", "--database-url", url, "--schema", "billing")
    assert doc["schema"] == "billing"
    assert doc["queues"]["producer"]["topics"] == {}
    _assert_age(doc["queues"]["producer"]["totals"]["total"], 0, None)
    _assert_age(doc["queues"]["consumer"]["topics"]["invoices"]["dead"], 1, 0)
    text = _ok("status", "--database-url", url, "--schema", "billing")
    assert "producer_queue: empty" in text.splitlines()
    listed = _json("dead-letters", "list", "--database-url", url, "--schema", "billing")
    assert [r["topic"] for r in listed["rows"]] == ["invoices"]


# -- list / show ----------------------------------------------------------------------------


def test_list_shows_dead_rows_only_and_filters_by_topic(outbox_database_url: str) -> None:
    url = outbox_database_url
    a1, a1_uuid = insert(url, "consumer", "dead", topic="orders", key=b"order-1")
    insert(url, "consumer", "retrying", topic="orders")
    insert(url, "consumer", "processed", topic="orders")
    b1, _ = insert(url, "consumer", "dead", topic="payments", key=b"\x00\xff", error="no handler")
    a2, _ = insert(url, "consumer", "dead", topic="orders", key=None)
    p1, _ = insert(url, "producer", "dead", topic="orders")

    everything = _json("dead-letters", "list", "--database-url", url)
    assert [r["id"] for r in everything["rows"]] == [a1, b1, a2]
    assert everything["queue"] == "consumer"
    assert everything["total"] == 3

    orders = _json("dead-letters", "list", "--database-url", url, "--topic", "orders")
    assert orders["topic"] == "orders"
    assert [r["id"] for r in orders["rows"]] == [a1, a2]
    first = orders["rows"][0]
    assert first["message_id"] == str(a1_uuid)
    assert (first["key"], first["key_encoding"]) == ("order-1", "utf-8")
    assert first["attempts"] == 5
    assert first["dead_at"] is not None
    # The telling line of a traceback is its last: the exception.
    assert first["error"] == "ValueError: price must be positive"
    assert orders["rows"][1]["key"] is None

    payments = _json("dead-letters", "list", "--database-url", url, "--topic", "payments")
    assert (payments["rows"][0]["key"], payments["rows"][0]["key_encoding"]) == ("00ff", "hex")
    assert payments["rows"][0]["error"] == "no handler"

    limited = _json("dead-letters", "list", "--database-url", url, "--limit", "1")
    assert [r["id"] for r in limited["rows"]] == [a1]
    assert limited["total"] == 3

    producer = _json("dead-letters", "list", "--database-url", url, "--queue", "producer")
    assert [r["id"] for r in producer["rows"]] == [p1]

    none = _json("dead-letters", "list", "--database-url", url, "--topic", "nothing.here")
    assert none == {"queue": "consumer", "table": "consumer_queue", "topic": "nothing.here",
                    "total": 0, "rows": []}  # fmt: skip

    lines = _ok("dead-letters", "list", "--database-url", url, "--limit", "2").splitlines()
    assert lines[0] == "consumer_queue: 3 dead rows, showing the first 2"
    assert lines[1].split() == [
        "ID", "MESSAGE_ID", "TOPIC", "KEY", "ATTEMPTS", "DEAD_AT", "ERROR"
    ]  # fmt: skip
    assert lines[2].split()[:5] == [str(a1), str(a1_uuid), "orders", "order-1", "5"]
    assert lines[2].endswith("ValueError: price must be positive")
    assert "hex:00ff" in lines[3]
    assert len(lines) == 4
    empty = _ok("dead-letters", "list", "--database-url", url, "--topic", "nothing.here")
    assert empty.strip() == "consumer_queue: no dead rows of topic nothing.here"


def _deep_traceback(depth: int) -> str:
    """A traceback of `depth` frames, several MB for a large depth, ending with its exception."""
    frames = "".join(
        f'  File "/srv/app/handlers_{n}.py", line {n}, in handle_{n}\n    step_{n}(message)\n'
        for n in range(depth)
    )
    return f"Traceback (most recent call last):\n{frames}KeyError: 'via'\n"


@pytest.mark.parametrize("queue", ["consumer", "producer"])
def test_list_reads_a_long_error_as_its_head_and_tail_only(
    outbox_database_url: str, queue: ops.Queue
) -> None:
    url = outbox_database_url
    error = _deep_traceback(60_000)  # about 5 MB
    assert len(error) > 4_000_000
    ids = [insert(url, queue, "dead", error=error)[0] for _ in range(3)]
    with psycopg.connect(url) as conn:
        page = ops.list_dead_letters(conn, "outbox", queue)
    assert [r.id for r in page.rows] == ids
    for row in page.rows:
        assert row.last_error is not None
        assert len(row.last_error) <= 8_192 + 1  # not the whole 5 MB
        assert row.last_error.startswith("Traceback (most recent call last):")
        assert row.error_summary == "KeyError: 'via'"
    listed = _json("dead-letters", "list", "--database-url", url, "--queue", queue)
    assert [r["error"] for r in listed["rows"]] == ["KeyError: 'via'"] * 3
    # `show` still prints the whole error.
    shown = _json("dead-letters", "show", "--database-url", url, "--queue", queue, str(ids[0]))
    assert shown["last_error"] == error


def test_show_prints_the_whole_traceback_and_the_payload(outbox_database_url: str) -> None:
    url = outbox_database_url
    error = _traceback()
    id_, message_id = insert(url, "consumer", "dead", error=error, payload=b'{"price": -3}')

    text = _ok("dead-letters", "show", str(id_), "--database-url", url)
    assert text.splitlines()[0] == f"consumer_queue row {id_}"
    for line in error.strip().splitlines():
        assert line.strip() in text
    assert "state" in text and "dead" in text
    assert '{"price": -3}' in text
    assert "payload (13 bytes, UTF-8):" in text

    by_uuid = _json("dead-letters", "show", str(message_id), "--database-url", url)
    assert by_uuid["id"] == id_
    assert by_uuid["last_error"] == error
    assert by_uuid["state"] == "dead"
    assert by_uuid["payload"] == '{"price": -3}'
    assert by_uuid["payload_encoding"] == "utf-8"
    assert by_uuid["payload_truncated"] is False
    assert by_uuid["lane"] == 7
    assert "received_at" in by_uuid


def test_show_truncates_large_payloads_and_hexes_binary_ones(outbox_database_url: str) -> None:
    url = outbox_database_url
    big, _ = insert(url, "producer", "dead", payload=b"x" * 10_000)
    binary, _ = insert(url, "producer", "dead", payload=bytes(range(256)) * 20)

    doc = _json("dead-letters", "show", str(big), "--queue", "producer", "--database-url", url)
    assert doc["payload"] == "x" * 4096
    assert (doc["payload_bytes"], doc["payload_truncated"]) == (10_000, True)
    assert "received_at" not in doc
    text = _ok("dead-letters", "show", str(big), "--queue", "producer", "--database-url", url)
    assert "payload (10000 bytes, UTF-8, showing the first 4096):" in text
    assert "(5904 more bytes not shown)" in text

    doc = _json("dead-letters", "show", str(binary), "--queue", "producer", "--database-url", url)
    assert doc["payload_encoding"] == "hex"
    assert doc["payload"] == (bytes(range(256)) * 16).hex()
    text = _ok("dead-letters", "show", str(binary), "--queue", "producer", "--database-url", url)
    assert "payload (5120 bytes, not UTF-8 text: hex, showing the first 4096):" in text
    assert "\x00" not in text


def test_show_of_an_unknown_row_is_one_line(outbox_database_url: str) -> None:
    result = _cli("dead-letters", "show", "424242", "--database-url", outbox_database_url)
    _one_line_error(result, 1, "consumer_queue has no row 424242")


# -- requeue --------------------------------------------------------------------------------


def _listen(url: str, queue: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"LISTEN {quote_ident(channel('outbox', queue))}")
    return conn


def _notified(conn: psycopg.Connection[Any], queue: str) -> bool:
    return any(
        n.channel == channel("outbox", queue) for n in conn.notifies(timeout=5, stop_after=1)
    )


def test_requeue_by_id_and_by_uuid_resets_the_rows_and_wakes_the_handler(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    by_id, _ = insert(url, "consumer", "dead")
    by_uuid, by_uuid_mid = insert(url, "consumer", "dead")
    untouched, _ = insert(url, "consumer", "dead")

    with _listen(url, "consumer_queue") as listener:
        out = _ok("dead-letters", "requeue", str(by_id), str(by_uuid_mid), "--database-url", url)
        assert out.strip() == "requeued 2 rows of consumer_queue"
        assert _notified(listener, "consumer_queue")

    for id_ in (by_id, by_uuid):
        row = row_of(url, "consumer", id_)
        assert (row["dead_at"], row["attempts"], row["last_error"]) == (None, 0, None)
        with psycopg.connect(url) as conn:
            due = conn.execute("SELECT %s <= now()", (row["next_attempt_at"],)).fetchone()
        assert due == (True,)
    assert row_of(url, "consumer", untouched)["dead_at"] is not None


def test_requeue_by_topic_and_all_on_the_producer_queue(outbox_database_url: str) -> None:
    url = outbox_database_url
    orders, _ = insert(url, "producer", "dead", topic="orders")
    retrying, _ = insert(url, "producer", "retrying", topic="orders")
    payments, _ = insert(url, "producer", "dead", topic="payments")
    consumer_dead, _ = insert(url, "consumer", "dead", topic="orders")

    with _listen(url, "producer_queue") as listener:
        out = _ok(
            "dead-letters", "requeue", "--topic", "orders", "--queue", "producer",
            "--database-url", url,
        )  # fmt: skip
        assert out.strip() == "requeued 1 row of producer_queue (topic orders)"
        assert _notified(listener, "producer_queue")
    assert row_of(url, "producer", orders)["dead_at"] is None
    assert row_of(url, "producer", retrying)["attempts"] == 2
    assert row_of(url, "producer", payments)["dead_at"] is not None

    out = _ok("dead-letters", "requeue", "--all", "--queue", "producer", "--database-url", url)
    assert out.strip() == "requeued 1 row of producer_queue"
    assert row_of(url, "producer", payments)["dead_at"] is None
    assert row_of(url, "consumer", consumer_dead)["dead_at"] is not None

    # Nothing left to requeue: a count of 0, no error, and no wake-up.
    with _listen(url, "producer_queue") as listener:
        out = _ok("dead-letters", "requeue", "--all", "--queue", "producer", "--database-url", url)
        assert out.strip() == "requeued 0 rows of producer_queue"
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_an_unknown_or_live_id_changes_nothing(outbox_database_url: str, action: str) -> None:
    url = outbox_database_url
    dead, _ = insert(url, "consumer", "dead")
    pending, _ = insert(url, "consumer", "pending")
    processed, _ = insert(url, "consumer", "processed")
    before = all_rows(url, "consumer")
    unknown = str(uuid.uuid4())

    cases = [
        ([str(dead), str(pending)], f"row {pending} is pending, not dead"),
        ([str(dead), str(processed)], f"row {processed} is processed, not dead"),
        ([str(dead), "424242"], "no row 424242"),
        ([unknown], f"no row {unknown}"),
    ]
    for ids, fragment in cases:
        result = _cli("dead-letters", action, *ids, "--database-url", url)
        _one_line_error(result, 1, fragment)
        assert f"nothing was {action}d" in result.stderr
        assert all_rows(url, "consumer") == before

    # The same dead row is fine by id and by uuid at once.
    dead_uuid = row_of(url, "consumer", dead)["message_id"]
    out = _ok("dead-letters", action, str(dead), str(dead_uuid), "--database-url", url)
    # (requeue may add a warning line: a later message of the key was handled meanwhile)
    assert out.strip().splitlines()[0] == f"{action}d 1 row of consumer_queue"


# -- purge ----------------------------------------------------------------------------------


def test_purge_deletes_dead_rows_only(outbox_database_url: str) -> None:
    url = outbox_database_url
    keep = [
        insert(url, "consumer", "pending", topic="orders")[0],
        insert(url, "consumer", "retrying", topic="orders")[0],
        insert(url, "consumer", "processed", topic="orders")[0],
    ]
    for _ in range(2):
        insert(url, "consumer", "dead", topic="orders")
    dead_other, dead_other_uuid = insert(url, "consumer", "dead", topic="payments")
    producer_keep = insert(url, "producer", "pending", topic="orders")[0]
    insert(url, "producer", "dead", topic="orders")

    out = _ok("dead-letters", "purge", "--topic", "orders", "--database-url", url)
    assert out.strip() == "purged 2 rows of consumer_queue (topic orders)"
    ids = [r[0] for r in all_rows(url, "consumer")]
    assert ids == [*keep, dead_other]

    out = _ok("dead-letters", "purge", str(dead_other_uuid), "--database-url", url)
    assert out.strip() == "purged 1 row of consumer_queue"
    out = _ok("dead-letters", "purge", "--all", "--database-url", url)
    assert out.strip() == "purged 0 rows of consumer_queue"
    assert [r[0] for r in all_rows(url, "consumer")] == keep

    out = _ok("dead-letters", "purge", "--all", "--queue", "producer", "--database-url", url)
    assert out.strip() == "purged 1 row of producer_queue"
    assert [r[0] for r in all_rows(url, "producer")] == [producer_keep]


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["dead-letters", "requeue"], "give row IDs, --topic T or --all"),
        (["dead-letters", "purge"], "give row IDs, --topic T or --all"),
        (["dead-letters", "requeue", "1", "--all"], "cannot be combined"),
        (["dead-letters", "purge", "--topic", "orders", "--all"], "cannot be combined"),
        (["dead-letters", "purge", "1", "--topic", "orders"], "cannot be combined"),
        (["dead-letters", "requeue", "abc"], "neither a row id"),
        (["dead-letters", "purge", "0"], "row id 0 is out of range"),
        (["dead-letters", "show", "99999999999999999999"], "out of range"),
        (["dead-letters", "list", "--limit", "0"], "must be >= 1"),
        (["dead-letters", "list", "--topic", "x'; DROP TABLE t; --"], "only ASCII letters"),
        (["dead-letters", "list", "--queue", "sideways"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    outbox_database_url: str, args: list[str], fragment: str
) -> None:
    result = _cli(*args, "--database-url", outbox_database_url)
    _one_line_error(result, 2, fragment)


def test_an_unmigrated_database_says_to_migrate(outbox_empty_database_url: str) -> None:
    for args in (["status"], ["dead-letters", "list"], ["dead-letters", "purge", "--all"]):
        result = _cli(*args, "--database-url", outbox_empty_database_url)
        _one_line_error(result, 1, "run `outbox migrate")


def test_missing_database_url_and_bad_schema_are_one_line(outbox_database_url: str) -> None:
    result = subprocess.run(
        [*CLI, "status"], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    _one_line_error(
        result, 1, "--database-url is required (or --databases-file, or set OUTBOX_DATABASE_URL)"
    )
    result = _cli("status", "--database-url", outbox_database_url, "--schema", "x; DROP")
    _one_line_error(result, 1, "schema 'x; DROP' is not valid")


# -- the Python API -------------------------------------------------------------------------


def test_requeue_inside_a_callers_transaction_commits_with_it(outbox_database_url: str) -> None:
    url = outbox_database_url
    dead, _ = insert(url, "consumer", "dead")
    with _listen(url, "consumer_queue") as listener, psycopg.connect(url) as conn:
        with conn.transaction():
            assert ops.requeue(conn, "outbox", "consumer", ops.Selection(ids=(dead,))) == 1
            raise psycopg.Rollback()  # the caller changes its mind: no requeue, no wake-up
        assert row_of(url, "consumer", dead)["dead_at"] is not None
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        with conn.transaction():
            assert ops.requeue(conn, "outbox", "consumer", ops.Selection(everything=True)) == 1
        assert _notified(listener, "consumer_queue")
    assert row_of(url, "consumer", dead)["dead_at"] is None


def test_a_row_locked_by_a_handler_is_waited_for_a_while_then_left_alone(
    outbox_database_url: str,
) -> None:
    # The operator tools' session waits LOCK_TIMEOUT_SECONDS for a row lock, not as long as
    # the handler holding it runs; then one line, and the row is as it was.
    url = outbox_database_url
    dead, _ = insert(url, "consumer", "dead")
    with psycopg.connect(url) as handler:
        handler.execute(
            "SELECT 1 FROM outbox.consumer_queue WHERE id = %s FOR UPDATE", (dead,)
        ).fetchone()
        result = _cli("dead-letters", "requeue", str(dead), "--database-url", url)
    _one_line_error(result, 1, f"waited {ops.LOCK_TIMEOUT_SECONDS} s")
    assert row_of(url, "consumer", dead)["dead_at"] is not None
    with psycopg.connect(url, autocommit=True) as conn:
        ops.limit_lock_wait(conn, "outbox")
        shown = conn.execute("SHOW lock_timeout").fetchone()
    assert shown == (f"{ops.LOCK_TIMEOUT_SECONDS}s",)


def test_a_statement_time_limit_cancels_a_slow_statement(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        ops.limit_statement_time(conn, "outbox", 0.2)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("200ms",)
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(30)")
        ops.limit_statement_time(conn, "outbox", 0.0001)  # at least a millisecond, not "none"
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1ms",)


def test_selection_and_error_summary() -> None:
    with pytest.raises(ConfigurationError):
        ops.Selection()
    with pytest.raises(ConfigurationError):
        ops.Selection(ids=(1,), everything=True)
    assert ops.error_summary(None) == ""
    assert ops.error_summary("\nno handler for 'x'\n(registered: a)") == "no handler for 'x'"
    assert ops.error_summary(_traceback()) == "ValueError: price must be positive"
    # A carriage return inside the exception's text is not a line of its own: the summary
    # keeps the exception's name (the caller escapes the "\r").
    try:
        raise ValueError("price\rFAKE LINE")
    except ValueError as exc:
        forged = "".join(traceback.format_exception(exc))
    assert ops.error_summary(forged) == "ValueError: price\rFAKE LINE"
    # The exception's line, not the traceback's last: PostgreSQL's message ends with a caret
    # under the statement, SQLAlchemy's with a link, a chained one with the cause's text.
    for raised, summary in [
        (ValueError('relation "t" does not exist\nLINE 1: SELECT\n  ^'), 'relation "t" does'),
        (RuntimeError("(psycopg.errors.UniqueViolation) dup\n(Background on this error)"), "dup"),
        (ValueError("nope\nsecond line"), "ValueError: nope"),
    ]:
        try:
            try:
                raise KeyError("the cause")
            except KeyError as cause:
                raise raised from cause
        except Exception as exc:
            text = "".join(traceback.format_exception(exc))
        assert ops.error_summary(text).startswith(type(raised).__name__ + ": "), text
        assert summary in ops.error_summary(text) and "\n" not in ops.error_summary(text)
    assert ops.parse_row_id(" 12 ") == 12
    mid = uuid.uuid4()
    assert ops.parse_row_id(str(mid)) == mid


def test_requeue_of_a_dead_producer_row_whose_message_id_is_queued_again_is_refused(
    outbox_database_url: str,
) -> None:
    """A requeued producer row goes back to producer_queue with its id; if its message id was
    sent again meanwhile, the unique message_id would refuse it: a clear error, no change."""
    url = outbox_database_url
    dead, message_id = insert(url, "producer", "dead", topic="orders")
    other, _ = insert(url, "producer", "dead", topic="orders")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "INSERT INTO outbox.producer_queue (message_id, topic, payload, content_type, lane) "
            "VALUES (%s, 'orders', 'x', 'text/plain', 0) RETURNING id",
            (message_id,),
        ).fetchone()
    assert row is not None
    result = _cli("dead-letters", "requeue", "--all", "--queue", "producer", "--database-url", url)
    _one_line_error(result, 1, f"dead row {dead} (message {message_id}) clashes with queued row")
    assert row_of(url, "producer", dead)["dead_at"] is not None
    assert row_of(url, "producer", other)["dead_at"] is not None  # nothing was requeued
    assert (
        _ok(
            "dead-letters", "requeue", str(other), "--queue", "producer", "--database-url", url
        ).strip()
        == "requeued 1 row of producer_queue"
    )
    assert row_of(url, "producer", other)["dead_at"] is None


def test_a_handled_message_is_counted_shown_and_never_requeued_or_purged(
    outbox_database_url: str,
) -> None:
    """A handled message has left consumer_queue (migration 0007): status counts it processed,
    show finds it in consumer_processed by message id and by row id, and requeue or purge by
    its id refuse it and change nothing."""
    from outbox.postgres.inbox import InboxStore

    from .test_inbox import put

    url = outbox_database_url
    (mid,) = put(url, "ops.handled", [{"n": 1}], ["k"])
    with psycopg.connect(url) as conn, conn.transaction():
        found = conn.execute(
            "SELECT id FROM outbox.consumer_queue WHERE message_id = %s", (mid,)
        ).fetchone()
        assert found is not None
        row_id = int(found[0])
        InboxStore("outbox").done_many(conn.execute, [row_id])
    with psycopg.connect(url) as conn:
        (consumer,) = [q for q in ops.status(conn, "outbox").queues if q.queue == "consumer"]
        assert consumer.totals["processed"].rows == 1
        assert consumer.topics["ops.handled"]["processed"].rows == 1
        for ref in (mid, row_id):
            shown = ops.show_row(conn, "outbox", "consumer", ref)
            assert (shown.state, shown.table, shown.message_id, shown.id) == (
                "processed",
                "consumer_processed",
                mid,
                row_id,
            )
            assert shown.attempts == 1 and shown.processed_at is not None
        for ref in (mid, row_id):
            for change in (ops.requeue, ops.purge):
                with pytest.raises(ops.NoSuchDeadLetter, match="is processed, not dead"):
                    change(conn, "outbox", "consumer", ops.Selection(ids=(ref,)))
    assert count_rows(url, "consumer_processed") == 1


def count_rows(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM outbox.{table}").fetchone()
    assert row is not None
    return int(row[0])


def test_status_says_who_holds_the_databases_connections(outbox_database_url: str) -> None:
    """Operators of many tenants read here what each database's connections are used by:
    outbox's sessions by application name, the database's and the server's client sessions,
    and max_connections."""
    url = outbox_database_url
    held = [psycopg.connect(url, application_name="outbox-handler") for _ in range(3)]
    held.append(psycopg.connect(url, application_name="someone-else"))
    try:
        doc = json.loads(_ok("status", "--database-url", url, "--json"))
        connections = doc["connections"]
        assert connections["outbox"] == {"outbox-handler": 3, "outbox-cli": 1}
        assert connections["database"] == 5  # the four above and the status's own
        assert connections["server"] >= 5 and connections["max_connections"] >= 5
        text = _ok("status", "--database-url", url)
        line = next(line for line in text.splitlines() if line.startswith("connections:"))
        assert line.startswith("connections: 4 of outbox here (outbox-cli 1, outbox-handler 3)")
        assert "; 5 to this database, " in line and "of max_connections " in line
    finally:
        for conn in held:
            conn.close()


def test_status_text_counts_handled_messages_apart_from_the_queue(
    outbox_database_url: str,
) -> None:
    # A handled message has left consumer_queue (only its id is kept, for the dedup window):
    # the queue's line counted them as its rows, "consumer_queue: 3 rows" over an empty queue.
    url = outbox_database_url
    insert(url, "consumer", "processed", topic="orders", age=30)
    insert(url, "consumer", "processed", topic="orders", age=90)

    lines = _ok("status", "--database-url", url).splitlines()
    consumer = next(line for line in lines if line.startswith("consumer_queue:"))
    assert consumer.startswith(
        "consumer_queue: empty; 2 handled, their ids kept in consumer_processed; each cell: "
    )

    insert(url, "consumer", "dead", topic="orders", age=65)
    lines = _ok("status", "--database-url", url).splitlines()
    consumer = next(line for line in lines if line.startswith("consumer_queue:"))
    assert consumer.startswith("consumer_queue: 1 row, oldest 1m0"), (
        consumer
    )  # the dead row's age, not the older handled one's (1m30s)
    assert "; 2 handled, their ids kept in consumer_processed; each cell: " in consumer
