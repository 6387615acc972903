"""The inbox writer's contract (`InboxWriter`, `InboxWriterSession`): what the Consumer relies
on, for every store. What was stored is read back as the Handler reads it: claimed."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from outbox.core.batches import InboxBatch, quarantined_row
from outbox.core.inbox_rows import Claimed
from outbox.core.lanes import LANES
from outbox.core.retriable import refused_for_data

from .conftest import LONG_SCHEMA_TOO, StoresUnderTest, inbox_row, store

ALL = list(range(LANES))


def claim_all(stores: StoresUnderTest, done: bool = False) -> list[Claimed]:
    """Every row due, claimed in one transaction (and handled, if `done`)."""
    database = stores.inbox()
    session = database.open_session("psycopg")
    try:
        with session.transaction() as (tx, _):
            batch = database.work.claim_next(tx, ALL, 10_000, [])
            if done:
                database.work.done_many(tx, [row.id for row in batch.rows])
        return [batch.claimed[row.id] for row in batch.rows]
    finally:
        session.close()


@LONG_SCHEMA_TOO
def test_a_stored_record_is_read_back_as_it_was_received(stores: StoresUnderTest) -> None:
    created = datetime(2026, 1, 31, 12, 0, 0, 123456, tzinfo=UTC)
    row = inbox_row(
        "orders",
        b'{"n": 1}',
        key=b"order-1",
        headers={"trace": "abc", "blob": b"\x00\xff"},
        partition=2,
        offset=41,
    )
    row = dataclasses.replace(row, created_at=created)
    before = datetime.now(UTC) - timedelta(seconds=1)
    assert store(stores, [row]) == {"orders": 1}
    [claimed] = claim_all(stores)
    assert claimed.message_id == row.message_id
    assert (claimed.topic, claimed.key, claimed.payload) == ("orders", b"order-1", b'{"n": 1}')
    # the stored JSON form of the user headers, in jsonb's order
    assert claimed.headers == {"blob": {"b64": "AP8="}, "trace": "abc"}
    assert list(claimed.headers) == ["blob", "trace"]
    assert claimed.content_type == "application/json"
    assert claimed.created_at == created
    assert before <= claimed.received_at <= datetime.now(UTC) + timedelta(seconds=1)
    assert (claimed.attempts, claimed.partition, claimed.offset) == (0, 2, 41)


def test_a_record_without_user_headers_has_none(stores: StoresUnderTest) -> None:
    store(stores, [inbox_row(headers={})])
    [claimed] = claim_all(stores)
    assert claimed.headers is None


def test_each_message_id_is_stored_once(stores: StoresUnderTest) -> None:
    twice = inbox_row("orders", b"first copy")
    rows = [
        twice,
        inbox_row("orders", b"2"),
        inbox_row("payments", b"3"),
        inbox_row("orders", b"second copy", message_id=twice.message_id),
    ]
    assert store(stores, rows) == {"orders": 2, "payments": 1}
    assert store(stores, rows) == {}
    assert [c.payload for c in claim_all(stores)] == [b"first copy", b"2", b"3"]


def test_a_handled_message_is_not_stored_again_within_the_dedup_window(
    stores: StoresUnderTest,
) -> None:
    row = inbox_row()
    store(stores, [row])
    claim_all(stores, done=True)
    assert stores.processed() == {row.message_id: 1}
    assert store(stores, [row]) == {}
    with stores.inbox().connect() as control:
        assert control.forget_processed(3600.0, 100) == 0
        assert store(stores, [row]) == {}
        assert control.forget_processed(0.0, 100) == 1
    assert store(stores, [row]) == {"orders": 1}  # past the window: a new message
    assert stores.processed() == {}


def test_a_quarantined_record_is_a_dead_row_with_its_reason(stores: StoresUnderTest) -> None:
    bad = inbox_row("orders", b"\xff\x00 raw", key=b"\x00k", headers={"h": "v"})
    raw = '[["aA==", "dg=="]]'
    record = quarantined_row(bad, "header name is not text")._replace(raw_headers=raw)
    session = stores.inbox_writer().connect()
    try:
        assert session.quarantine([record]) == {"orders": 1}
        assert session.quarantine([record]) == {}  # once per message id
        assert session.quarantine([]) == {}
    finally:
        session.close()
    [dead] = stores.inbox_dead()
    assert (dead.message_id, dead.topic, dead.key, dead.payload) == (
        bad.message_id,
        "orders",
        b"\x00k",
        b"\xff\x00 raw",
    )
    assert (dead.attempts, dead.error) == (0, "header name is not text")
    assert dead.content_type == "application/octet-stream"
    assert dead.raw_headers == [["aA==", "dg=="]]
    assert claim_all(stores) == []
    assert store(stores, [bad]) == {}  # its id is taken
    with stores.inbox().connect() as control:
        assert control.recent_topics(10) == {"orders": 1}


def test_the_callers_work_runs_once_while_the_insert_is_on_its_way(
    stores: StoresUnderTest,
) -> None:
    calls: list[int] = []
    session = stores.inbox_writer().connect()
    try:
        stored = session.insert(InboxBatch.of([inbox_row()]), lambda: calls.append(1))
        assert stored == {"orders": 1} and calls == [1]
        assert session.insert(InboxBatch(), None) == {}
        assert session.usable
    finally:
        session.close()
    assert not session.usable


@pytest.mark.parametrize(
    "bad",
    [
        {"topic": "or\x00ders"},
        {"content_type": "application/json\x00"},
        {"topic": "lone \udc80 surrogate"},
    ],
    ids=["nul-topic", "nul-content-type", "surrogate-topic"],
)
def test_a_batch_refused_for_its_data_stores_nothing_and_the_session_goes_on(
    stores: StoresUnderTest, bad: dict[str, str]
) -> None:
    """All or nothing: the Consumer then stores the batch's records one by one and
    quarantines the one refused."""
    good = inbox_row("orders", b"good")
    refused = inbox_row(**{"topic": "orders", **bad})
    session = stores.inbox_writer().connect()
    try:
        with pytest.raises(Exception) as error:
            session.insert(InboxBatch.of([good, refused]))
        assert refused_for_data(error.value), repr(error.value)
        assert session.usable
        assert session.insert(InboxBatch.of([good])) == {"orders": 1}
    finally:
        session.close()
    assert [c.payload for c in claim_all(stores)] == [b"good"]


def test_headers_that_are_not_json_postgresql_can_hold_are_refused_for_their_data(
    stores: StoresUnderTest,
) -> None:
    batch = InboxBatch.of([inbox_row()])
    batch.headers[0] = '{"h": "\\u0000"}'  # written by hand: jsonb refuses NUL
    session = stores.inbox_writer().connect()
    try:
        with pytest.raises(Exception) as error:
            session.insert(batch)
        assert refused_for_data(error.value), repr(error.value)
    finally:
        session.close()
    assert claim_all(stores) == []


def test_the_writers_check_reports_each_attempt(stores: StoresUnderTest) -> None:
    attempts: list[int] = []
    stores.inbox_writer().check(attempt=lambda: attempts.append(1))
    assert attempts == [1]
    stores.inbox_writer().connect(checked=True).close()


def test_a_message_id_is_stored_in_its_canonical_form(stores: StoresUnderTest) -> None:
    message_id = uuid.uuid4()
    batch = InboxBatch.of([inbox_row(message_id=message_id)])
    batch.message_ids[0] = "{" + message_id.hex.upper() + "}"  # another spelling of the same id
    session = stores.inbox_writer().connect()
    try:
        assert session.insert(batch) == {"orders": 1}
    finally:
        session.close()
    assert store(stores, [inbox_row(message_id=message_id)]) == {}
    assert [c.message_id for c in claim_all(stores)] == [message_id]
