"""The delivery audit (`outbox spark audit`): its expressions and aggregation on hand-made
DataFrames, its bad-input errors, its outputs, and the whole job on real PostgreSQL and the real
broker, with one message removed from an inbox and one handled twice."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer as KafkaProducer

from outbox import Broker, Handlers, InboxMessage
from outbox.cli import main
from outbox.kafka.subscriber import foreign_id as python_foreign_id
from outbox.postgres import migrate
from outbox.spark.audit_output import (
    AuditReport,
    AuditRow,
    format_table,
    write_chart,
    write_json,
    write_parquet,
)
from tests.integration.relay_helpers import (
    consume,
    consumer_thread,
    handler_thread,
    relay_until_empty,
    wait_for,
)

pytestmark = pytest.mark.spark


NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _keep_logging() -> Any:
    """`outbox.cli.main` configures the root logger to this test's (captured) stderr: undo it."""
    handlers, level = list(logging.root.handlers), logging.root.level
    yield
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def _audit() -> Any:
    """The job module (imports pyspark)."""
    from outbox.spark import audit

    return audit


# -- Spark expressions ----------------------------------------------------------------------


def test_ids_and_times_are_derived_as_the_consumer_derives_them(spark: Any) -> None:
    from pyspark.sql import functions as F

    audit = _audit()
    mid = uuid.uuid4()
    texts = [str(mid), str(mid).upper(), f"{{{mid}}}", f"urn:uuid:{mid}", mid.hex, "nope", None]
    frame = spark.createDataFrame([(t,) for t in texts], "t string")
    got = [r[0] for r in frame.select(audit.canonical_uuid(F.col("t"))).collect()]
    assert got == [str(mid)] * 5 + [None, None]

    stamp = datetime(2026, 11, 27, 10, 0, 0, 250_000, tzinfo=UTC)
    headers = [[], [("h", b"1"), ("n", None), ("\u00e9", b"")], None]
    cases = [
        ("orders.created", p, o, stamp, key, value, h)
        for p in (0, 2)
        for o in (0, 7, 123_456_789_012)
        for key, value, h in ((b"k", b"v", headers[0]), (None, b"", headers[1]), (b"", None, None))
    ]
    frame = spark.createDataFrame(
        [
            (*c[:6], None if c[6] is None else [{"key": k, "value": v} for k, v in c[6]])
            for c in cases
        ],
        "topic string, p int, o long, ts timestamp, key binary, value binary, "
        "headers array<struct<key:string,value:binary>>",
    )
    got = frame.select(
        audit.foreign_id(*(F.col(c) for c in ("topic", "p", "o", "ts", "key", "value", "headers")))
    ).collect()
    millis = round(stamp.timestamp() * 1000)
    assert [r[0] for r in got] == [
        str(python_foreign_id(t, p, o, millis, k, v, h or [])) for t, p, o, _, k, v, h in cases
    ]

    times = [
        "2026-11-27T10:00:00.250000+01:00",
        "2026-11-27T09:00:00.25Z",
        "2026-11-27 09:00:00.25",
    ]
    frame = spark.createDataFrame([(t,) for t in [*times, "garbage"]], "t string")
    for zone in ("UTC", "America/New_York"):  # a naive time means UTC, whatever the session's
        spark.conf.set("spark.sql.session.timeZone", zone)
        try:
            micros = frame.select(F.unix_micros(audit.utc_timestamp(F.col("t"), zone))).collect()
        finally:
            spark.conf.set("spark.sql.session.timeZone", "UTC")
        expected = int(datetime(2026, 11, 27, 9, 0, 0, 250000, tzinfo=UTC).timestamp() * 1e6)
        assert [r[0] for r in micros] == [expected] * 3 + [None], zone


# -- the aggregation on hand-made frames ----------------------------------------------------


def _ids(n: int) -> list[str]:
    return [str(uuid.UUID(int=i + 1)) for i in range(n)]


def _headers(message_id: str | None, created: datetime) -> list[dict[str, Any]]:
    headers = [{"key": "outbox-created-at", "value": created.isoformat().encode()}]
    if message_id is not None:
        headers.insert(0, {"key": "outbox-message-id", "value": message_id.encode()})
    return headers


def _records(spark: Any, rows: list[tuple[str, int, int, datetime, str | None, datetime]]) -> Any:
    """Kafka records as the source gives them: (topic, partition, offset, ts, id, created)."""
    from outbox.spark.source import SCHEMA

    data = [
        (b"k", b"{}", topic, p, o, ts, 0, _headers(mid, created))
        for topic, p, o, ts, mid, created in rows
    ]
    return spark.createDataFrame(data, SCHEMA)


def _inbox(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(
        rows,
        "service string, topic string, message_id string, created_at timestamp, "
        "processed_at timestamp, dead_at timestamp, handled_count int",
    )


def test_aggregation_counts_each_case_once(spark: Any) -> None:
    """One message per case, two services (one of them on one topic only)."""
    audit = _audit()
    window = audit.Window(
        since=NOW - timedelta(hours=1),
        until=NOW - timedelta(minutes=1),
        settled_before=NOW - timedelta(minutes=1),
    )
    t0 = NOW - timedelta(minutes=30)
    ms = timedelta(milliseconds=1)
    (handled_a, handled_b, pending, dead, missing, twice, resent, foreign_created) = (
        t0 + i * ms for i in range(8)
    )
    ids = _ids(10)
    records = _records(
        spark,
        [
            ("orders", 0, 0, handled_a, ids[0], handled_a),
            ("orders", 0, 1, handled_b, ids[1], handled_b),
            ("orders", 1, 0, pending, ids[2], pending),
            ("orders", 1, 1, dead, ids[3], dead),
            ("orders", 2, 0, missing, ids[4], missing),
            ("orders", 2, 1, twice, ids[5], twice),
            ("orders", 0, 2, resent, ids[6], resent),
            ("orders", 1, 2, resent + ms, ids[6], resent),  # the relay sent it again
            ("orders", 0, 3, NOW - timedelta(hours=2), ids[7], NOW - timedelta(hours=2)),  # old
            ("orders", 0, 4, NOW, ids[8], t0),  # put on Kafka too recently: not settled
            ("payments", 0, 0, foreign_created, None, foreign_created),  # no outbox id
        ],
    )
    foreign = str(
        python_foreign_id(
            "payments",
            0,
            0,
            round(foreign_created.timestamp() * 1000),
            b"k",
            b"{}",
            [(h["key"], h["value"]) for h in _headers(None, foreign_created)],
        )
    )
    done = lambda created, ms_: created + timedelta(milliseconds=ms_)  # noqa: E731

    def row(
        service: str, topic: str, i: int | str, created: datetime, **state: Any
    ) -> tuple[Any, ...]:
        message_id = ids[i] if isinstance(i, int) else i
        return (
            service,
            topic,
            message_id,
            created,
            state.get("processed"),
            state.get("dead"),
            state.get("count", 1 if state.get("processed") else 0),
        )

    inbox = _inbox(
        spark,
        [
            row("billing", "orders", 0, handled_a, processed=done(handled_a, 100)),
            row("billing", "orders", 1, handled_b, processed=done(handled_b, 300)),
            row("billing", "orders", 2, pending),
            row("billing", "orders", 3, dead, dead=NOW),
            row("billing", "orders", 5, twice, processed=done(twice, 200), count=2),
            row("billing", "orders", 6, resent, processed=done(resent, 400)),
            row("billing", "orders", 8, t0, processed=done(t0, 50)),  # unsettled on Kafka
            row("billing", "orders", str(uuid.uuid4()), t0, processed=done(t0, 9)),  # unknown
            row(
                "billing", "payments", foreign, foreign_created, processed=done(foreign_created, 20)
            ),
            row("shipping", "orders", 0, handled_a, processed=done(handled_a, 10)),
            row("shipping", "payments", foreign, foreign_created),  # not consumed there: ignored
        ],
    )
    pairs = [("billing", "orders"), ("billing", "payments"), ("shipping", "orders")]
    assignments = spark.createDataFrame(pairs, "service string, topic string")
    frame = audit.deliveries(audit.message_identities(records), inbox, assignments, window)
    report = audit.collect_report(frame, pairs, window, list_limit=10, generated_at=NOW)

    rows = {(r.topic, r.service): r for r in report.rows}
    assert list(rows) == [("orders", "billing"), ("orders", "shipping"), ("payments", "billing")]
    billing = rows[("orders", "billing")]
    assert (billing.sent, billing.received, billing.handled, billing.pending, billing.dead) == (
        7,
        6,
        4,
        1,
        1,
    )
    assert (billing.missing, billing.duplicated, billing.resent, billing.not_on_kafka) == (
        1,
        1,
        1,
        1,
    )
    assert (billing.p50_ms, billing.max_ms) == (200.0, 400.0)
    assert billing.p95_ms == billing.p99_ms == 400.0
    shipping = rows[("orders", "shipping")]
    assert (shipping.sent, shipping.received, shipping.handled, shipping.missing) == (7, 1, 1, 6)
    assert (shipping.duplicated, shipping.not_on_kafka, shipping.p50_ms) == (0, 0, 10.0)
    payments = rows[("payments", "billing")]
    assert (payments.sent, payments.handled, payments.missing, payments.p50_ms) == (1, 1, 0, 20.0)

    assert [(m["service"], m["message_id"]) for m in report.missing] == [
        ("billing", ids[4]),
        *(("shipping", ids[i]) for i in (1, 6, 2, 3, 4, 5)),  # by partition, offset
    ]
    assert report.missing[0]["partition"] == 2 and report.missing[0]["offset"] == 0
    assert [(d["service"], d["message_id"], d["handled_count"]) for d in report.duplicated] == [
        ("billing", ids[5], 2)
    ]
    assert [(r["topic"], r["message_id"], r["copies"]) for r in report.resent] == [
        ("orders", ids[6], 2)
    ]
    assert not report.ok and report.exit_code == 3


def test_a_clean_window_is_ok_and_a_listing_can_be_capped(spark: Any) -> None:
    audit = _audit()
    window = audit.Window(NOW - timedelta(hours=1), NOW, NOW)
    ids = _ids(3)
    created = NOW - timedelta(minutes=5)
    records = _records(spark, [("t", 0, i, created, ids[i], created) for i in range(3)])
    inbox = _inbox(
        spark,
        [("svc", "t", m, created, created + timedelta(seconds=1), None, 1) for m in ids],
    )
    pairs = [("svc", "t"), ("svc", "quiet")]
    assignments = spark.createDataFrame(pairs, "service string, topic string")
    frame = audit.deliveries(audit.message_identities(records), inbox, assignments, window)
    report = audit.collect_report(frame, pairs, window, list_limit=0, generated_at=NOW)
    assert report.ok and report.exit_code == 0
    assert report.rows == (
        AuditRow(topic="quiet", service="svc"),  # consumed, nothing sent: a row of zeros
        AuditRow(
            topic="t",
            service="svc",
            sent=3,
            received=3,
            handled=3,
            p50_ms=1000.0,
            p95_ms=1000.0,
            p99_ms=1000.0,
            max_ms=1000.0,
        ),
    )


# -- reading an inbox -----------------------------------------------------------------------


def test_split_ids_covers_the_range_once() -> None:
    from outbox.spark.inbox_reader import IdRange, split_ids

    assert split_ids(5, 14, 3) == [IdRange(5, 8), IdRange(9, 12), IdRange(13, 14)]
    assert split_ids(7, 7, 4) == [IdRange(7, 7)]
    ranges = split_ids(1, 1_000_003, 64)
    assert ranges[0].first_id == 1 and ranges[-1].last_id == 1_000_003
    assert all(a.last_id + 1 == b.first_id for a, b in pairwise(ranges))


def test_the_inbox_reader_reads_each_row_of_the_window_once(
    spark: Any, outbox_database_url: str
) -> None:
    from tests.integration.test_inbox import put

    audit = _audit()
    url = outbox_database_url
    wanted = put(url, "audited", [{"n": i} for i in range(7)], [f"k{i}" for i in range(7)])
    put(url, "other", [{"n": 0}], ["k"])
    with psycopg.connect(url) as conn:
        conn.execute(  # handled twice, as the Handler would record it
            "WITH handled AS (DELETE FROM outbox.consumer_queue WHERE message_id = %s"
            " RETURNING message_id, id, topic, key, lane, created_at)"
            " INSERT INTO outbox.consumer_processed"
            " (message_id, id, topic, key, lane, created_at, processed_at, handled_count)"
            " SELECT *, created_at + interval '1 second', 2 FROM handled",
            (wanted[0],),
        )
        conn.execute(
            "UPDATE outbox.consumer_queue SET created_at = now() - interval '2 days'"
            " WHERE message_id = %s",
            (wanted[6],),
        )
        (created,) = conn.execute(
            "SELECT created_at FROM outbox.consumer_processed WHERE message_id = %s", (wanted[0],)
        ).fetchone() or (None,)
    now = datetime.now(UTC)
    window = audit.Window(now - timedelta(hours=1), now + timedelta(minutes=1), now)
    service = audit.Service("svc", url)
    frame = audit.read_inbox(spark, service, ["audited"], window, partitions=3)
    rows = {r["message_id"]: r for r in frame.collect()}
    assert sorted(rows) == sorted(str(m) for m in wanted[:6])  # not the other topic, not old
    first = rows[str(wanted[0])]
    assert (first["service"], first["topic"], first["handled_count"]) == ("svc", "audited", 2)
    assert first["created_at"].astimezone(UTC) == created
    assert first["processed_at"].astimezone(UTC) == created + timedelta(seconds=1)
    assert rows[str(wanted[1])]["processed_at"] is None


# -- the window and bad input ---------------------------------------------------------------


def _config(**overrides: Any) -> Any:
    audit = _audit()
    settings: dict[str, Any] = {
        "topics": ("t",),
        "services": (audit.Service("svc", "postgresql://x/y"),),
        "kafka_bootstrap": "127.0.0.1:9",
    }
    return audit.AuditConfig(**{**settings, **overrides})


def test_the_default_window_stays_inside_the_dedup_window() -> None:
    audit = _audit()
    window, notes = audit.resolve_window(_config(settle=60, dedup_window=3600), NOW)
    assert window.since == NOW - timedelta(seconds=3600 - 180)  # 5% margin, at most 5 min
    assert window.until == window.settled_before == NOW - timedelta(seconds=60)
    assert notes == []
    window, notes = audit.resolve_window(_config(since=NOW - timedelta(days=3)), NOW)
    assert window.since == NOW - timedelta(days=3)
    assert len(notes) == 1 and "dedup window" in notes[0]
    with pytest.raises(audit.ConfigurationError, match="nothing to audit"):
        audit.resolve_window(_config(dedup_window=0), NOW)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "at least one --topic is required"),
        (["--topic", "t"], "at least one --service"),
        (["--topic", "bad topic!", "--service", "s=postgresql://h/d"], "bad topic!"),
        (["--topic", "t", "--service", "billing"], "--service expects NAME=DATABASE_URL"),
        (
            ["--topic", "t", "--service", "s=postgresql://u:hunter2@h/d#Bad-Schema"],
            "schema 'Bad-Schema' is not valid",
        ),
        (
            ["--topic", "t", "--service", "s=postgresql://h/d", "--since", "yesterday"],
            "--since 'yesterday' is not a time",
        ),
        (
            ["--topic", "t", "--service", "s=postgresql://h/d", "--until", "2026-13-45"],
            "--until '2026-13-45' is not a time",
        ),
        (
            ["--topic", "t", "--service", "s=postgresql://h/d", "--service-topics", "x=t"],
            "--service-topics names 'x'",
        ),
        (
            ["--topic", "t", "--service", "s=postgresql://h/d", "--service-topics", "s=u"],
            "consumes 'u', which is not a --topic",
        ),
        (
            ["--topic", "t", "--service", "s=h", "--service", "s=h2"],
            "a --service name is given twice",
        ),
        # A bad --settle is a usage error (exit 2): tests/unit/test_numeric_settings.py.
        (["--topic", "t", "--service", "s=h", "--chart", "out.svg"], "name it *.png"),
        (["--topic", "t", "--service", "s=h", "--json", "/no/such/dir/a.json"], "does not exist"),
        (
            ["--topic", "t", "--service", "s=h", "--since", "1h", "--until", "2h"],
            "nothing to audit",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.delenv("OUTBOX_KAFKA_BOOTSTRAP", raising=False)
    code = main(["spark", "audit", "--kafka-bootstrap", "127.0.0.1:9", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("outbox: error: "), err
    assert message in err[0]
    assert "hunter2" not in err[0]


def test_a_missing_bootstrap_or_database_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: Any, outbox_empty_database_url: str
) -> None:
    monkeypatch.delenv("OUTBOX_KAFKA_BOOTSTRAP", raising=False)
    assert main(["spark", "audit", "--topic", "t", "--service", "s=postgresql://h/d"]) == 1
    assert "--kafka-bootstrap is required" in capsys.readouterr().err
    argv = ["spark", "audit", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "t"]
    assert main([*argv, "--service", f"s={outbox_empty_database_url}"]) == 1
    assert "run `outbox migrate" in capsys.readouterr().err


# -- the outputs ----------------------------------------------------------------------------


def _report() -> AuditReport:
    return AuditReport(
        since=NOW - timedelta(hours=1),
        until=NOW,
        generated_at=NOW,
        rows=(
            AuditRow(
                "orders.created",
                "billing",
                sent=10,
                received=9,
                handled=8,
                dead=1,
                missing=1,
                duplicated=1,
                resent=2,
                p50_ms=12.5,
                p95_ms=40,
                p99_ms=41,
                max_ms=1500,
            ),
            AuditRow("orders.created", "shipping", sent=10, received=10, handled=10),
        ),
        missing=(
            {
                "topic": "orders.created",
                "service": "billing",
                "message_id": "m1",
                "partition": 1,
                "offset": 7,
                "created_at": NOW,
            },
        ),
        duplicated=(
            {
                "topic": "orders.created",
                "service": "billing",
                "message_id": "m2",
                "handled_count": 2,
                "processed_at": NOW,
            },
        ),
    )


def test_outputs_table_json_parquet_and_chart(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    report = _report()
    table = format_table(report).splitlines()
    assert table[1].split() == [
        "topic",
        "service",
        "sent",
        "received",
        "handled",
        "pending",
        "dead",
        "missing",
        "duplicated",
        "resent",
        "not_on_kafka",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "max_ms",
    ]
    assert table[3].split() == [
        "orders.created",
        "billing",
        "10",
        "9",
        "8",
        "0",
        "1",
        "1",
        "1",
        "2",
        "0",
        "12.5",
        "40.0",
        "41.0",
        "1500",
    ]
    assert table[4].split()[-4:] == ["-", "-", "-", "-"]
    assert "  billing orders.created m1 partition=1, offset=7" in "\n".join(table)
    assert table[-1] == "PROBLEMS: 1 missing, 1 handled more than once"

    write_json(report, tmp_path / "a.json")
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["ok"] is False and data["rows"][0]["missing"] == 1
    assert data["missing"][0]["created_at"] == NOW.isoformat()

    write_parquet(report, tmp_path / "a.parquet")
    rows = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert [(r["service"], r["missing"], r["ok"]) for r in rows] == [
        ("billing", 1, False),
        ("shipping", 0, True),
    ]

    write_chart(report, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the whole job on real servers ----------------------------------------------------------

MESSAGES = 30


def _send(url: str, topic: str, n: int) -> list[uuid.UUID]:
    broker = Broker()
    with psycopg.connect(url) as conn, conn.transaction():
        return [broker.send(conn, topic, {"n": i}, key=f"k{i % 7}") for i in range(n)]


def _inbox_state(url: str, schema: str) -> dict[uuid.UUID, tuple[bool, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT message_id, true, handled_count FROM {schema}.consumer_processed"
            f" UNION ALL SELECT message_id, false, handled_count FROM {schema}.consumer_queue"
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _resend_raw(bootstrap: str, topic: str, record: Any) -> None:
    """Put a copy of a record on Kafka, as a relay that crashed before deleting its row does."""
    producer = KafkaProducer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=record.value(), key=record.key(), headers=record.headers())
    assert producer.flush(10) == 0


def _handlers(topic: str) -> Handlers:
    handlers = Handlers()

    @handlers.handler(topic)
    def on_message(message: InboxMessage, conn: Any) -> None:
        pass

    return handlers


def _all_handled(url: str, schema: str) -> bool:
    state = _inbox_state(url, schema)
    return len(state) == MESSAGES and all(p for p, _ in state.values())


def _consume_and_handle(
    url: str,
    schema: str,
    topic: str,
    bootstrap: str,
    sabotage: tuple[uuid.UUID, uuid.UUID] | None = None,
) -> None:
    """Run a service's Consumer and Handler until every message is handled; with `sabotage`
    (removed, twice), then forget the first one and record the second one as handled twice
    (the claim keeps the Handler itself from doing it)."""
    with (
        consumer_thread(url, bootstrap, [topic], schema=schema, group=f"g-{schema}-{topic}"),
        handler_thread(url, _handlers(topic), schema=schema),
    ):
        wait_for(lambda: _all_handled(url, schema), 30, f"{schema}: all handled")
        if sabotage is None:
            return
        removed, twice = sabotage
        with psycopg.connect(url) as conn:
            table = f"{schema}.consumer_processed"
            conn.execute(f"DELETE FROM {table} WHERE message_id = %s", (removed,))
            conn.execute(
                f"UPDATE {table} SET handled_count = handled_count + 1 WHERE message_id = %s",
                (twice,),
            )
        wait_for(lambda: _inbox_state(url, schema)[twice] == (True, 2), 30, "handled again")


COUNTS = (
    "sent",
    "received",
    "handled",
    "pending",
    "dead",
    "missing",
    "duplicated",
    "resent",
    "not_on_kafka",
)


def _counts(row: dict[str, Any]) -> tuple[int, ...]:
    return tuple(row[name] for name in COUNTS)


def _audit_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["spark", "audit", *argv])
    return code, capsys.readouterr().out


def test_audit_finds_exactly_the_removed_and_the_twice_handled_message(
    spark: Any,
    outbox_database_factory: Any,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start = datetime.now(UTC)
    sender = outbox_database_factory()
    billing = outbox_database_factory()
    shipping = outbox_database_factory()
    migrate.upgrade(shipping, "ship")  # a second schema: NAME=URL#schema
    topic, bootstrap = outbox_topic, outbox_kafka_bootstrap
    ids = _send(sender, topic, MESSAGES)
    relay_until_empty(sender, bootstrap)
    records = consume(bootstrap, topic, MESSAGES)
    assert len(records) == MESSAGES
    _resend_raw(bootstrap, topic, records[0])
    removed, twice = ids[3], ids[4]
    _consume_and_handle(billing, "outbox", topic, bootstrap, sabotage=(removed, twice))
    _consume_and_handle(shipping, "ship", topic, bootstrap)

    json_path, parquet_path, chart_path = (tmp_path / n for n in ("a.json", "a.parquet", "a.png"))
    argv = [
        "--topic",
        topic,
        "--service",
        f"billing={billing}",
        "--service",
        f"shipping={shipping}#ship",
        "--kafka-bootstrap",
        bootstrap,
        "--since",
        (start - timedelta(seconds=5)).isoformat(),
        "--settle",
        "0",
        "--json",
        str(json_path),
        "--parquet",
        str(parquet_path),
        "--chart",
        str(chart_path),
    ]
    code, out = _audit_cli(argv, capsys)
    assert code == 3, out
    report = json.loads(json_path.read_text())
    rows = {r["service"]: r for r in report["rows"]}
    assert set(rows) == {"billing", "shipping"}
    # sent, received, handled, pending, dead, missing, duplicated, resent, not_on_kafka
    assert _counts(rows["billing"]) == (MESSAGES, MESSAGES - 1, MESSAGES - 1, 0, 0, 1, 1, 1, 0)
    assert _counts(rows["shipping"]) == (MESSAGES, MESSAGES, MESSAGES, 0, 0, 0, 0, 1, 0)
    for row in rows.values():
        assert 0 <= row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"] < 60_000
    assert [(m["service"], m["message_id"]) for m in report["missing"]] == [
        ("billing", str(removed))
    ]
    assert [(d["service"], d["message_id"]) for d in report["duplicated"]] == [
        ("billing", str(twice))
    ]
    resent_id = dict(records[0].headers())["outbox-message-id"].decode()
    assert [r["message_id"] for r in report["resent"]] == [resent_id]
    assert parquet_path.stat().st_size > 0 and chart_path.stat().st_size > 0
    assert f"billing {topic} {removed}" in out
    assert out.rstrip().endswith("PROBLEMS: 1 missing, 1 handled more than once")

    # Replay the range into billing: only the removed message is stored again (pending: the
    # Handler is not running), and the audit finds nothing missing any more.
    from outbox.spark.replay import ReplayConfig, replay, source_options

    config = ReplayConfig(billing, bootstrap, topic, since=start - timedelta(seconds=5))
    stored = replay(spark, config, source_options(config))
    assert (stored.received, stored.stored) == (MESSAGES + 1, 1)
    json_path.unlink()
    code, out = _audit_cli(argv, capsys)
    assert code == 3, out  # the message handled twice stays handled twice
    report = json.loads(json_path.read_text())
    rows = {r["service"]: r for r in report["rows"]}
    assert _counts(rows["billing"]) == (MESSAGES, MESSAGES, MESSAGES - 1, 1, 0, 0, 1, 1, 0)
    assert _counts(rows["shipping"]) == (MESSAGES, MESSAGES, MESSAGES, 0, 0, 0, 0, 1, 0)
    assert report["missing"] == []
    assert [d["message_id"] for d in report["duplicated"]] == [str(twice)]
