"""The log going back under a consumer group (issue 31): a partition's records and counter set
back (a backup restored, newest records deleted by hand) while a member reads it, or while no
member holds it. The member notices it in its fetch, warns once, reads the partition again from
where its history and the log's part (else from the earliest record kept, the group's start),
and `outbox status` shows it: no record appended afterwards is skipped."""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
import pytest

from outbox.cli import main
from outbox.pglog import PgLog, PgLogSubscriber
from outbox.testing.plugin import DatabaseFactory

from .relay_helpers import running, wait_for
from .test_pglog import log_consumer, publish
from .test_pglog_groups import TOPIC, drain, partition_id, sql
from .test_pglog_groups import log_url as log_url

WENT_BACK = "went back"


def roll_back(url: str, topic: str, partition: int, to: int) -> None:
    """What an operator does by hand: delete a partition's records from `to` on and set its
    counter back to `to`, in one transaction."""
    pid = partition_id(url, topic, partition)
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute(
            "DELETE FROM outbox_log.log_records WHERE partition_id = %s AND log_offset >= %s",
            (pid, to),
        )
        conn.execute(
            "UPDATE outbox_log.log_partitions SET next_offset = %s WHERE id = %s", (to, pid)
        )


def appends(url: str, start: int, stop: int, size: int = 10) -> None:
    """Records `start` to `stop` (payload n), `size` per append."""
    for first in range(start, stop, size):
        publish(url, TOPIC, first, min(first + size, stop))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if WENT_BACK in r.getMessage()]


def offsets_and_payloads(rows: list[Any]) -> list[tuple[int, int]]:
    return [(r.offset, int(r.payload)) for r in rows]


def member(url: str) -> PgLogSubscriber:
    return PgLogSubscriber(url, [TOPIC], "g", rebalance_interval=0.1)


def test_a_log_rolled_back_under_a_consuming_group_delivers_every_record_appended_after(
    outbox_database_factory: DatabaseFactory, log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's scenario: a consumer reads the log while 20 records and the counter are
    rolled back by hand and 30 are appended; it once delivered 10 of the 30."""
    inbox = outbox_database_factory()
    PgLog(log_url).create_topic(TOPIC, 1)
    members: list[PgLogSubscriber] = []
    consumer = log_consumer(inbox, log_url, TOPIC, "g", members)

    def stored() -> set[int]:
        rows = sql(inbox, "SELECT payload FROM outbox.consumer_queue")
        return {int(bytes(p)) for (p,) in rows}

    with caplog.at_level(logging.WARNING, "outbox.pglog"), running(consumer):
        appends(log_url, 0, 50)
        wait_for(lambda: len(stored()) == 50, 30, "the first 50 stored")
        roll_back(log_url, TOPIC, 0, 30)
        appends(log_url, 100, 130)
        wait_for(lambda: stored() >= set(range(100, 130)), 30, "the 30 appended after stored")
        wait_for(lambda: PgLog(log_url).committed("g", TOPIC) == {0: 60}, 10, "all committed")
    assert stored() == set(range(50)) | set(range(100, 130))
    assert len(warnings(caplog)) == 1, warnings(caplog)
    assert PgLog(log_url).committed("g", TOPIC) == {0: 60}


def test_a_partition_whose_end_goes_below_a_members_position_is_read_again_from_there(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
        roll_back(log_url, TOPIC, 0, 30)
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            assert reader.poll(100, 0.3).rows() == []
            [warning] = warnings(caplog)
            assert f"group g: topic {TOPIC} partition 0 went back" in warning, warning
            assert "position 50, end 30" in warning, warning
            assert "from offset 30" in warning, warning
            # The group's position is reset, and stored (a commit never moves it back).
            assert PgLog(log_url).committed("g", TOPIC) == {0: 30}
            appends(log_url, 100, 130)
            rows = drain(reader, 30)
            assert offsets_and_payloads(rows) == list(
                zip(range(30, 60), range(100, 130), strict=True)
            )
            assert reader.poll(100, 0.2).rows() == []
        assert len(warnings(caplog)) == 1
    finally:
        reader.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 60}


def test_a_partition_rolled_back_and_grown_past_a_members_position_before_its_next_fetch(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The end alone cannot show this one: it is past the member's position again. The record
    before the position is not the one the member read (its append id differs)."""
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
        roll_back(log_url, TOPIC, 0, 30)
        appends(log_url, 100, 130)
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 30)
            # Exactly the records appended after: read from where the histories part (the
            # records 20-29 of the third append are still the ones read), none skipped.
            assert offsets_and_payloads(rows) == list(
                zip(range(30, 60), range(100, 130), strict=True)
            )
            assert reader.poll(100, 0.2).rows() == []
        [warning] = warnings(caplog)
        assert "position 50, end 60" in warning, warning
        assert "from offset 30" in warning, warning
    finally:
        reader.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 60}


def test_a_log_restored_from_an_older_backup_under_a_consuming_group(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A backup holds the records, the counters and the group's offsets of its time: after it
    is restored under the member, it reads exactly the records appended since (the backup's
    last records are the ones it read)."""
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 30)
    reader = member(log_url)
    try:
        assert len(drain(reader, 30)) == 30
        backup = ("log_records", "log_partitions", "log_group_offsets")
        for table in backup:
            sql(log_url, f"CREATE TABLE backup_{table} AS SELECT * FROM outbox_log.{table}")
        appends(log_url, 30, 60)
        assert len(drain(reader, 30)) == 30
        with psycopg.connect(log_url) as conn, conn.transaction():
            conn.execute("DELETE FROM outbox_log.log_group_offsets")
            conn.execute("DELETE FROM outbox_log.log_records")
            conn.execute("INSERT INTO outbox_log.log_records SELECT * FROM backup_log_records")
            conn.execute(
                "UPDATE outbox_log.log_partitions p SET next_offset = b.next_offset "
                "FROM backup_log_partitions b WHERE b.id = p.id"
            )
            conn.execute(
                "INSERT INTO outbox_log.log_group_offsets SELECT * FROM backup_log_group_offsets"
            )
        appends(log_url, 100, 120)
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 20)
            assert reader.poll(100, 0.2).rows() == []
        expected = list(zip(range(30, 50), range(100, 120), strict=True))
        assert offsets_and_payloads(rows) == expected
        [warning] = warnings(caplog)
        assert "position 60, end 50" in warning and "from offset 30" in warning, warning
    finally:
        reader.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 50}


def test_a_rollback_inside_one_append_is_read_again_from_the_first_record_removed(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50, size=50)
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
        roll_back(log_url, TOPIC, 0, 37)
        appends(log_url, 100, 120)
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 20)
        assert offsets_and_payloads(rows) == list(zip(range(37, 57), range(100, 120), strict=True))
        assert len(warnings(caplog)) == 1
    finally:
        reader.close()


def test_records_without_an_append_id_are_read_again_from_the_earliest_record_kept(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Records an older outbox appended carry no append id: the member cannot tell where the
    histories part, so it reads the partition again as a new group would (from the earliest
    record kept): the records before are delivered again (the inbox drops them), none skipped."""
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    sql(log_url, "UPDATE outbox_log.log_records SET append_id = NULL")
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
        roll_back(log_url, TOPIC, 0, 30)
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 30)
            [warning] = warnings(caplog)
            assert "position 50, end 30" in warning, warning
            assert "from offset 0" in warning, warning
            appends(log_url, 100, 130)
            rows += drain(reader, 30)
        expected = list(zip(range(30), range(30), strict=True)) + list(
            zip(range(30, 60), range(100, 130), strict=True)
        )
        assert offsets_and_payloads(rows) == expected
        assert len(warnings(caplog)) == 1
    finally:
        reader.close()


def test_a_batch_read_before_the_log_went_back_commits_nothing_past_where_it_is_read_again(
    log_url: str,
) -> None:
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    reader = member(log_url)
    try:
        first = reader.poll(40, 5)
        assert first.next_offsets() == {(TOPIC, 0): 40}
        reader.commit(first)
        in_hand = reader.poll(100, 5)  # up to offset 49, not committed yet
        assert in_hand.next_offsets() == {(TOPIC, 0): 50}
        roll_back(log_url, TOPIC, 0, 30)
        appends(log_url, 100, 110)
        # The member notices, and reads the partition again from offset 30.
        following = reader.poll(100, 5)
        expected = list(zip(range(30, 40), range(100, 110), strict=True))
        assert offsets_and_payloads(following.rows()) == expected
        reader.commit(in_hand)  # stored meanwhile: its records below 30 count, no more
        assert PgLog(log_url).committed("g", TOPIC) == {0: 30}
        reader.commit(following)
    finally:
        reader.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 40}


def test_a_partition_that_went_back_while_no_member_held_it_is_read_again_by_the_next(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The group's committed offset is within the end again, but the record before it is not
    the one the group read: the member that takes the partition reads it from the start."""
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
    finally:
        reader.close()
    roll_back(log_url, TOPIC, 0, 30)
    appends(log_url, 100, 130)
    reader = member(log_url)
    try:
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 60)
        expected = list(zip(range(30), range(30), strict=True)) + list(
            zip(range(30, 60), range(100, 130), strict=True)
        )
        assert offsets_and_payloads(rows) == expected
        [warning] = warnings(caplog)
        assert "committed offset 50" in warning and "end 60" in warning, warning
    finally:
        reader.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 60}


def test_a_partition_that_went_back_below_an_offset_a_member_stored_is_read_from_the_start(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Rolled back below the committed offset and grown a little (not past it) while no member
    held the partition, its records without append ids: the offset a member stored past the
    end says the log went back (not a hand's edit, which would be reset to the end): the 10
    records appended since are read, not skipped."""
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    sql(log_url, "UPDATE outbox_log.log_records SET append_id = NULL")
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
    finally:
        reader.close()
    roll_back(log_url, TOPIC, 0, 30)
    appends(log_url, 100, 110)
    reader = member(log_url)
    try:
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 40)
        expected = list(zip(range(30), range(30), strict=True))
        expected += list(zip(range(30, 40), range(100, 110), strict=True))
        assert offsets_and_payloads(rows) == expected
        [warning] = warnings(caplog)
        assert "committed offset 50 is past its end (end 40" in warning, warning
    finally:
        reader.close()
    assert PgLog(log_url).committed("g", TOPIC) == {0: 40}


def test_a_committed_offset_moved_by_hand_is_where_the_group_resumes(
    log_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator who sets a group's offset back by hand (to read records again) is obeyed:
    only the offset a member stored is checked against the record before it."""
    PgLog(log_url).create_topic(TOPIC, 1)
    appends(log_url, 0, 50)
    reader = member(log_url)
    try:
        assert len(drain(reader, 50)) == 50
    finally:
        reader.close()
    sql(log_url, "UPDATE outbox_log.log_group_offsets SET next_offset = 20")
    reader = member(log_url)
    try:
        with caplog.at_level(logging.WARNING, "outbox.pglog"):
            rows = drain(reader, 30)
        assert [r.offset for r in rows] == list(range(20, 50))
        assert warnings(caplog) == []
    finally:
        reader.close()


def test_status_shows_how_often_a_partition_went_back_under_its_group(
    outbox_database_url: str, log_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    PgLog(log_url).create_topic(TOPIC, 2)
    appends(log_url, 0, 40)
    reader = member(log_url)
    try:
        drain(reader, 40)
        [(partition, end)] = sql(
            log_url,
            "SELECT partition, next_offset FROM outbox_log.log_partitions "
            "ORDER BY next_offset DESC LIMIT 1",
        )
        roll_back(log_url, TOPIC, partition, end - 5)
        assert reader.poll(100, 0.3).rows() == []
    finally:
        reader.close()
    args = ["status", "--database-url", outbox_database_url, "--transport", "postgres"]
    args += ["--log-url", log_url]

    assert main(args) == 0
    text = capsys.readouterr().out
    note = f"topic {TOPIC} partition {partition} went back under the group 1 time, last at "
    assert note in text, text
    assert f"position {end}, end {end - 5}, read again from offset {end - 5}" in text, text
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    parts = {p["partition"]: p for p in doc["lag"][0]["partitions"]}
    went_back = parts[partition]
    assert went_back["went_back"] == 1
    last = went_back["last_went_back"]
    assert (last["position"], last["end"], last["read_from"]) == (end, end - 5, end - 5)
    assert last["at"].endswith("+00:00")
    other = parts[1 - partition]
    assert other["went_back"] == 0 and other["last_went_back"] is None
    # It is a past event, not a problem now: --check passes.
    assert main([*args, "--check"]) == 0
