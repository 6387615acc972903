"""`outbox spark replay` against real PostgreSQL and the real broker."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from outbox.cli import main
from tests.integration.relay_helpers import count

from .records import Batch, outbox_records, produce

pytestmark = pytest.mark.spark


def _replay(
    capsys: pytest.CaptureFixture[str], url: str, bootstrap: str, topic: str, *range_args: str
) -> dict[str, int]:
    """Run `outbox spark replay` in this process (on the tests' session); its counts."""
    capsys.readouterr()
    code = main(
        [
            "spark",
            "replay",
            "--database-url",
            url,
            "--kafka-bootstrap",
            bootstrap,
            "--topic",
            topic,
            *range_args,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    counts = dict(re.findall(r"^(read|inserted|skipped)\s+(\d+)", out, re.MULTILINE))
    assert set(counts) == {"read", "inserted", "skipped"}, out
    return {name: int(value) for name, value in counts.items()}


def _row_id(url: str, partition: int, offset: int) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT message_id FROM outbox.consumer_queue"
            " WHERE source_partition = %s AND source_offset = %s",
            (partition, offset),
        ).fetchone()
    return row[0] if row else None


def _delete(url: str, message_ids: list[Any]) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM outbox.consumer_queue WHERE message_id = ANY(%s)", (message_ids,))


def _mark_processed(url: str, message_id: Any) -> None:
    """As the Handler leaves a handled message: out of consumer_queue, its id kept for dedup."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "WITH handled AS (DELETE FROM outbox.consumer_queue WHERE message_id = %s"
            " RETURNING message_id, id, topic, key, lane, created_at)"
            " INSERT INTO outbox.consumer_processed (message_id, id, topic, key, lane, created_at)"
            " SELECT * FROM handled",
            (message_id,),
        )


def _sent_at(batch: Batch, partition: int, offset: int) -> Any:
    return next(s.message_id for s in batch.sent if s.position == (partition, offset))


def test_replay_by_offsets_restores_a_deleted_message_and_skips_the_others(
    spark: Any,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    batch = produce(bootstrap, topic, outbox_records(600))
    assert _replay(capsys, url, bootstrap, topic, "--from-offset", "0") == {
        "read": 600,
        "inserted": 600,
        "skipped": 0,
    }
    deleted, handled = _sent_at(batch, 1, 5), _sent_at(batch, 1, 6)
    _delete(url, [deleted])
    _mark_processed(url, handled)

    counts = _replay(capsys, url, bootstrap, topic, "--from-offset", "1:3", "--to-offset", "1:10")

    assert counts == {"read": 7, "inserted": 1, "skipped": 6}
    assert _row_id(url, 1, 5) == deleted
    assert count(url, "consumer_queue") == 599  # the handled one is not stored again
    assert count(url, "consumer_processed") == 1  # left as it was
    again = _replay(capsys, url, bootstrap, topic, "--from-offset", "1:3", "--to-offset", "1:10")
    assert again == {"read": 7, "inserted": 0, "skipped": 7}


def test_replay_by_time_restores_only_the_messages_of_that_time(
    spark: Any,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, bootstrap, topic = outbox_database_url, outbox_kafka_bootstrap, outbox_topic
    base = 1_800_000_000_000  # ms; three groups of 200 records, a minute apart
    stamps = [base + (i // 200) * 60_000 + i for i in range(600)]
    batch = produce(bootstrap, topic, outbox_records(600), timestamps=stamps)
    _replay(capsys, url, bootstrap, topic, "--from-offset", "0")
    removed = [batch.sent[i].message_id for i in (10, 250, 260, 450)]
    _delete(url, removed)

    since = datetime.fromtimestamp((base + 60_000) / 1000, UTC).isoformat()
    until = datetime.fromtimestamp((base + 120_000) / 1000, UTC).isoformat()
    counts = _replay(capsys, url, bootstrap, topic, "--since", since, "--until", until)

    assert counts == {"read": 200, "inserted": 2, "skipped": 198}
    with psycopg.connect(url) as conn:
        present = {
            r[0]
            for r in conn.execute(
                "SELECT message_id FROM outbox.consumer_queue WHERE message_id = ANY(%s)",
                (removed,),
            )
        }
    assert present == {removed[1], removed[2]}  # the first and last groups were not replayed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--from-offset", "0"], "--topic is required"),
        (["--topic", "t"], "give a range: --from-offset/--to-offset or --since/--until"),
        (["--topic", "t", "--from-offset", "abc"], "--from-offset 'abc' is not an offset"),
        (["--topic", "t", "--from-offset", "-5"], "--from-offset '-5' is not an offset"),
        (["--topic", "t", "--to-offset", "1:2:3"], "--to-offset '1:2:3' is not an offset"),
        (["--topic", "t", "--from-offset", "1:4", "--from-offset", "1:5"], "given twice"),
        (
            ["--topic", "t", "--from-offset", "1:9", "--to-offset", "1:3"],
            "--from-offset 9 is after --to-offset 3 for partition 1",
        ),
        (
            ["--topic", "t", "--from-offset", "9", "--to-offset", "0:3"],
            "--from-offset 9 is after --to-offset 3 for partition 0",
        ),
        (["--topic", "t", "--since", "yesterday"], "--since 'yesterday' is not an ISO 8601 time"),
        (
            ["--topic", "t", "--since", "2026-11-26T10:00", "--until", "2026-11-26T09:00"],
            "is not before --until",
        ),
        (
            ["--topic", "t", "--since", "2026-11-26T10:00", "--from-offset", "0"],
            "not both",
        ),
    ],
)
def test_cli_replay_refuses_bad_input_before_starting(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--database-url", "postgresql://nowhere/x", "--kafka-bootstrap", "127.0.0.1:1"]
    assert main(["spark", "replay", *common, *arguments]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("outbox: error: ") and message in err, err
    assert "\n" not in err


def test_cli_replay_names_a_partition_or_topic_that_does_not_exist(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--database-url", outbox_database_url, "--kafka-bootstrap", outbox_kafka_bootstrap]
    cases = [
        (["--topic", outbox_topic, "--from-offset", "7:0"], "has no partition 7 (it has 3)"),
        (["--topic", f"{outbox_topic}-nope", "--from-offset", "0"], "does not exist"),
    ]
    for arguments, message in cases:
        assert main(["spark", "replay", *common, *arguments]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("outbox: error: ") and message in err, err
