"""`outbox spark consumer` against real PostgreSQL and the real broker."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import Handlers, InboxMessage
from outbox.cli import main
from tests.integration import inbox_app
from tests.integration.relay_helpers import (
    Daemon,
    consumer_thread,
    count,
    handler_thread,
    wait_for,
)

from .records import Sent, outbox_records, produce

pytestmark = pytest.mark.spark

ROW = (
    "message_id, topic, key, payload, headers, content_type, lane, created_at, "
    "source_partition, source_offset"
)


def _recording_handlers(topic: str) -> Handlers:
    """Handlers that write one `effects` row per handled message, in its transaction."""
    handlers = Handlers()

    @handlers.handler(topic)
    def record(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO effects (message_id, attempt, body) VALUES (%s, %s, %s)",
            (message.id, message.attempt, ""),
        )

    return handlers


def _prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)


def _inbox_ids(url: str) -> list[Any]:
    with psycopg.connect(url) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT message_id FROM outbox.consumer_queue"
                " UNION ALL SELECT message_id FROM outbox.consumer_processed"
            )
        ]


def _forget_last_commit(checkpoint: Path) -> int:
    """Make the checkpoint look as if the job died after storing its last committed batch
    but before Spark recorded it (and before it planned the next): that batch runs again."""
    commits = sorted(
        (p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    last = int(commits[-1].name)
    for folder in ("commits", "offsets"):
        for batch_id in range(last if folder == "commits" else last + 1, last + 100):
            for name in (str(batch_id), f".{batch_id}.crc"):
                (checkpoint / folder / name).unlink(missing_ok=True)
    return last


def test_20000_messages_are_stored_once_across_a_stop_and_restart_and_all_handled(
    spark: Any,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    tmp_path: Path,
) -> None:
    from outbox.spark.stream import InboxStream, StreamConfig

    url = outbox_database_url
    _prepare(url)
    sent = produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(20_000, keys=300))
    assert set(sent.ends()) == {0, 1, 2}
    config = StreamConfig(
        database_url=url,
        kafka_bootstrap=outbox_kafka_bootstrap,
        topics=[outbox_topic],
        checkpoint=str(tmp_path / "checkpoint"),
        trigger_interval=0,
        max_offsets_per_trigger=2000,
    )

    first = InboxStream(spark, config)
    first.start()
    wait_for(lambda: first.batches >= 3, 120, "three micro-batches", interval=0.2)
    assert first.query is not None
    first.query.stop()  # abrupt: the micro-batch in hand, if any, is cut short
    stored_before = count(url, "consumer_queue")
    assert 5000 <= stored_before < 20_000
    replayed_batch = _forget_last_commit(tmp_path / "checkpoint")

    with handler_thread(url, _recording_handlers(outbox_topic), concurrency=4):
        second = InboxStream(spark, dataclasses.replace(config, available_now=True))
        second.run()
        wait_for(
            lambda: count(url, "consumer_processed") == 20_000,
            180,
            "the Handler to handle every message",
            interval=0.5,
        )

    ids = _inbox_ids(url)
    assert len(ids) == 20_000 and set(ids) == sent.ids()
    # The forgotten batch ran again: all of it was already there and nothing was stored twice.
    assert replayed_batch >= 1
    assert second.counts.skipped >= 1
    with psycopg.connect(url) as conn:
        effects = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM effects")
        assert effects.fetchone() == (20_000, 20_000)


def _assorted_records() -> list[Sent]:
    """Outbox messages, foreign records (no outbox headers), user headers of both kinds."""
    records = outbox_records(150)
    for n in range(40):
        records.append(
            Sent(key=b"foreign-%d" % (n % 7), value=b"raw %d" % n, headers=[], message_id=None)
        )
    records.append(
        Sent(
            key=None,
            value=b"{}",
            headers=[("trace", b"abc"), ("blob", b"\xff\x00")],
            message_id=None,
        )
    )
    return records


def test_rows_are_the_consumer_daemons_and_a_sleeping_handler_is_woken(
    spark: Any,
    outbox_database_factory: Any,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    tmp_path: Path,
) -> None:
    from outbox.spark.stream import InboxStream, StreamConfig

    sent = produce(outbox_kafka_bootstrap, outbox_topic, _assorted_records())
    total = len(sent.sent)
    by_spark, by_daemon = outbox_database_factory(), outbox_database_factory()
    _prepare(by_spark)

    with consumer_thread(by_daemon, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.received == total, 60, "the Consumer daemon to store all")
    config = StreamConfig(
        database_url=by_spark,
        kafka_bootstrap=outbox_kafka_bootstrap,
        topics=[outbox_topic],
        checkpoint=str(tmp_path / "checkpoint"),
        available_now=True,
    )
    InboxStream(spark, config).run()

    query = f"SELECT {ROW} FROM outbox.consumer_queue ORDER BY message_id"
    with psycopg.connect(by_spark) as a, psycopg.connect(by_daemon) as b:
        rows = a.execute(query).fetchall()
        assert len(rows) == total
        assert rows == b.execute(query).fetchall()

    # A Handler that polls once a minute: only the NOTIFY can wake it in time.
    with handler_thread(by_spark, _recording_handlers(outbox_topic), poll_interval=60):
        wait_for(lambda: _handled(by_spark) == total, 30, "the Handler to handle the backlog")
        wait_for(
            lambda: count(by_spark, "relay_state", "queue = 'handler' AND sleeping") > 0,
            30,
            "the Handler to sleep",
        )
        produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(20, start=1000))
        InboxStream(spark, config).run()  # from the checkpoint: the 20 new ones only
        # stored (or already handled: the Handler is woken by the same statement)
        assert count(by_spark, "consumer_queue") + _handled(by_spark) == total + 20
        wait_for(lambda: _handled(by_spark) == total + 20, 20, "the woken Handler")

    # Taking over from the daemon: a new checkpoint starts where its group committed.
    takeover = InboxStream(
        spark,
        dataclasses.replace(
            config,
            database_url=by_daemon,
            checkpoint=str(tmp_path / "takeover"),
            starting_offsets=f"group:g-{outbox_topic}",
        ),
    )
    takeover.run()
    assert (takeover.counts.received, takeover.counts.stored) == (20, 20)


def _handled(url: str) -> int:
    return count(url, "consumer_processed")


def test_cli_consumer_streams_until_sigterm_then_exits_cleanly(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str, tmp_path: Path
) -> None:
    url = outbox_database_url
    produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(300))
    with Daemon(
        "spark",
        "consumer",
        "--database-url",
        url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--topic",
        outbox_topic,
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--trigger-interval",
        "0.5",
        "--master",
        "local[1]",
    ) as job:
        wait_for(lambda: count(url, "consumer_queue") == 300, 120, "the job to store all")
        produce(outbox_kafka_bootstrap, outbox_topic, outbox_records(50, start=300))
        wait_for(lambda: count(url, "consumer_queue") == 350, 60, "the next micro-batch")
        job.signal(signal.SIGTERM)
        assert job.wait(60) == 0, job.output()
        assert "spark consumer stopped" in job.output()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--topic", "t"], "a checkpoint location is required (--checkpoint)"),
        (["--checkpoint", "/tmp/x"], "at least one --topic is required"),
        (
            [
                "--topic",
                "t",
                "--checkpoint",
                "/tmp/x",
                "--available-now",
                "--trigger-interval",
                "1",
            ],
            "give --trigger-interval or --available-now, not both",
        ),
        # Bad numbers are usage errors (exit 2): tests/unit/test_numeric_settings.py.
        (["--topic", "no spaces", "--checkpoint", "/tmp/x"], "'no spaces' contains"),
        (["--topic", "t", "--checkpoint", "/tmp/x", "--schema", "Bad-Schema"], "schema"),
    ],
)
def test_cli_consumer_refuses_bad_input_before_starting(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--database-url", "postgresql://nowhere/x", "--kafka-bootstrap", "127.0.0.1:1"]
    assert main(["spark", "consumer", *common, *arguments]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("outbox: error: ") and message in err
    assert "\n" not in err


def test_records_the_daemon_quarantines_are_quarantined_alike(
    spark: Any,
    outbox_database_factory: Any,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    tmp_path: Path,
) -> None:
    # gap: the Spark path stored a poison record as an ordinary pending row, and lost its
    # reason and its headers as received
    from outbox.spark.stream import InboxStream, StreamConfig

    poison = [
        Sent(b"k", b"one", [("content-type", b"text\x00plain"), ("x", b"\xff")], None),
        Sent(b"k", b"two", [("content-type", b"\xfe")], None),
    ]
    produce(outbox_kafka_bootstrap, outbox_topic, [*poison, *outbox_records(3)])
    by_spark, by_daemon = outbox_database_factory(), outbox_database_factory()
    with consumer_thread(by_daemon, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.received == 5, 60, "the Consumer daemon to store all")
    assert consumer.quarantined == 2
    stream = InboxStream(
        spark,
        StreamConfig(
            database_url=by_spark,
            kafka_bootstrap=outbox_kafka_bootstrap,
            topics=[outbox_topic],
            checkpoint=str(tmp_path / "checkpoint"),
            available_now=True,
        ),
    )
    stream.run()
    assert (stream.counts.received, stream.counts.stored) == (5, 5)
    query = (
        f"SELECT {ROW}, raw_headers, last_error, attempts, dead_at IS NOT NULL "
        "FROM outbox.consumer_queue ORDER BY dead_at IS NULL, source_partition, source_offset"
    )
    with psycopg.connect(by_spark) as a, psycopg.connect(by_daemon) as b:
        rows = a.execute(query).fetchall()
        assert rows == b.execute(query).fetchall()
    assert [r[-1] for r in rows] == [True, True, False, False, False]
    assert all("content-type" in r[-3] and r[-4] for r in rows[:2])
