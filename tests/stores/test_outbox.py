"""The outbox store's contract (`OutboxSession`, `QueueDatabase`): what the Producer relies on,
for every store. Rows are sent as `Broker.send` sends them; the calls are the relay's own."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime

import pytest

from outbox.core.batches import OutgoingRecord, stored_message
from outbox.core.errors import DuplicateMessageId
from outbox.core.lanes import LANES, lane_for
from outbox.core.retriable import refused_for_data

from .conftest import LONG_SCHEMA_TOO, StoresUnderTest

ALL = list(range(LANES))
CREATED_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00")


def fetch(
    stores: StoresUnderTest, lanes: list[int] = ALL, limit: int = 1000
) -> list[OutgoingRecord]:
    with stores.outbox().connect() as session:
        return session.fetch(lanes, limit, []).fetchall()


def payloads(records: list[OutgoingRecord]) -> list[bytes]:
    return [r.payload for r in records]


@LONG_SCHEMA_TOO
def test_a_sent_message_is_fetched_as_the_relay_hands_it_to_a_publisher(
    stores: StoresUnderTest,
) -> None:
    before = datetime.now(UTC)
    message_id = stores.send("orders", {"n": 1}, key="order-1")
    [record] = fetch(stores)
    assert record.topic == "orders"
    assert record.key == b"order-1"
    assert record.payload == b'{"n":1}'
    assert record.message_id == str(message_id)
    assert record.content_type == "application/json"
    assert record.headers is None  # no user headers: none at all, not "{}"
    assert record.attempts == 0
    assert CREATED_AT.fullmatch(record.created_at), record.created_at
    created = datetime.fromisoformat(record.created_at)
    assert before.replace(microsecond=0) <= created <= datetime.now(UTC)


def test_rows_are_fetched_by_lane_in_id_order(stores: StoresUnderTest) -> None:
    keys = [b"alpha", b"beta", b"gamma", None]
    sent = [stores.send("orders", f"{n}".encode(), key=keys[n % len(keys)]) for n in range(40)]
    every = fetch(stores)
    assert [r.message_id for r in every] == [str(m) for m in sent]
    assert [r.id for r in every] == sorted(r.id for r in every)
    beta = lane_for(b"beta", uuid.uuid4())
    mine = fetch(stores, [beta])
    assert mine and all(
        r.key == b"beta" or lane_for(r.key, uuid.UUID(r.message_id)) == beta for r in mine
    )
    assert [r.id for r in mine] == sorted(r.id for r in mine)
    assert [r.payload for r in mine if r.key == b"beta"] == [
        f"{n}".encode() for n in range(40) if keys[n % len(keys)] == b"beta"
    ]
    others = [lane for lane in ALL if lane != beta]
    assert {r.id for r in fetch(stores, others)} == {r.id for r in every} - {r.id for r in mine}
    assert fetch(stores, []) == []


def test_a_fetch_takes_at_most_its_limit_and_leaves_out_the_ids_in_flight(
    stores: StoresUnderTest,
) -> None:
    """The relay fetches the next batch while the last is on its way (`exclude`)."""
    for n in range(12):
        stores.send("orders", f"{n}".encode(), key=f"k{n % 3}")
    with stores.outbox().connect() as session:
        first = session.fetch(ALL, 5, []).fetchall()
        assert payloads(first) == [f"{n}".encode() for n in range(5)]
        ahead = session.fetch(ALL, 5, [r.id for r in first]).fetchall()
        assert payloads(ahead) == [f"{n}".encode() for n in range(5, 10)]
        assert session.fetch(ALL, 1, []).fetchone() == first[0]
        assert (
            session.fetch(ALL, 100, [r.id for r in first + ahead]).fetchall() == fetch(stores)[10:]
        )
        assert session.fetch([], 5, []).fetchone() is None


def test_user_headers_come_back_in_their_stored_json_form(stores: StoresUnderTest) -> None:
    headers: dict[str, str | bytes] = {
        "zz": "last by length",
        "a": "first",
        "é": b"\x00\xff binary",
        "trace": "ünïcödé \U0001f600",
        "aa": "",
    }
    stores.send("orders", b"x", key="k", headers=headers)
    [record] = fetch(stores)
    # jsonb's order (shorter keys first, then bytes) and its text form, on every store
    assert record.headers == (
        '{"a": "first", "aa": "", "zz": "last by length", "é": {"b64": "AP8gYmluYXJ5"}, '
        '"trace": "ünïcödé \U0001f600"}'
    )
    assert stored_message(record).headers == headers
    assert dict(record.wire_headers())["é"] == b"\x00\xff binary"


def test_delete_forgets_delivered_rows(stores: StoresUnderTest) -> None:
    ids = [stores.send("orders", f"{n}".encode(), key="k") for n in range(5)]
    with stores.outbox().connect() as session:
        rows = session.fetch(ALL, 10, []).fetchall()
        session.delete([rows[1].id, rows[3].id, 10**12])  # an id that is not there: ignored
        assert payloads(session.fetch(ALL, 10, []).fetchall()) == [b"0", b"2", b"4"]
        session.delete([])
    # a delivered message's id may be sent again (it is no longer waiting)
    stores.send("orders", b"again", key="k", message_id=ids[1])
    assert payloads(fetch(stores)) == [b"0", b"2", b"4", b"again"]


def test_a_message_id_still_waiting_is_refused_and_nothing_written(
    stores: StoresUnderTest,
) -> None:
    taken = stores.send("orders", b"1", key="k")
    with pytest.raises(DuplicateMessageId):
        stores.send("orders", b"2", key="k", message_id=taken)
    assert payloads(fetch(stores)) == [b"1"]


def test_a_failed_row_waits_for_its_delay_and_holds_its_keys_later_rows(
    stores: StoresUnderTest,
) -> None:
    for payload, key in [(b"k1", "k"), (b"o1", "o"), (b"k2", "k"), (b"n1", None), (b"k3", "k")]:
        stores.send("orders", payload, key=key)
    with stores.outbox().connect() as session:
        rows = session.fetch(ALL, 10, []).fetchall()
        first = rows[0]
        session.fail([first.id], ["broker says later"], [1.0])
        assert payloads(session.fetch(ALL, 10, []).fetchall()) == [b"o1", b"n1"]
        due = session.next_due(ALL)
        assert due is not None and 0 < due <= 1.0
        assert (
            session.next_due([lane for lane in ALL if lane != lane_for(b"k", uuid.uuid4())]) is None
        )
        time.sleep(1.1)
        again = session.fetch(ALL, 10, []).fetchall()
        # due now, with its attempt counted; the key's later rows still wait behind it
        assert payloads(again) == [b"k1", b"o1", b"n1"]
        assert again[0].attempts == 1
        due = session.next_due(ALL)
        assert due is not None and due <= 0
        # in flight (excluded), the retrying row still holds its key
        assert payloads(session.fetch(ALL, 10, [first.id]).fetchall()) == [b"o1", b"n1"]
        session.delete([first.id])
        assert payloads(session.fetch(ALL, 10, []).fetchall()) == [b"o1", b"k2", b"n1", b"k3"]
        assert session.next_due(ALL) is None


def test_the_error_and_attempts_of_a_failed_row_are_kept(stores: StoresUnderTest) -> None:
    message_id = stores.send("orders", b"1", key="k")
    with stores.outbox().connect() as session:
        [row] = session.fetch(ALL, 10, []).fetchall()
        session.fail([row.id], ["first"], [0.0])
        session.fail([row.id], ["second"], [0.0])
        assert stores.outbox_error(message_id) == (2, "second")
        assert session.fetch(ALL, 10, []).fetchall()[0].attempts == 2


def test_next_due_counts_only_a_keys_first_retrying_row(stores: StoresUnderTest) -> None:
    """A key's later retrying rows wait for its first whatever their own time says: waking
    for them would find nothing (rows of one batch fail together)."""
    stores.send("orders", b"k1", key="k")
    stores.send("orders", b"k2", key="k")
    with stores.outbox().connect() as session:
        assert session.next_due(ALL) is None
        first, second = session.fetch(ALL, 10, []).fetchall()
        session.fail([first.id, second.id], ["later", "later"], [30.0, 0.1])
        due = session.next_due(ALL)
        assert due is not None and 29 < due <= 30
        stores.send("orders", b"n1", key=None)
        [keyless] = [r for r in session.fetch(ALL, 10, []).fetchall() if r.key is None]
        session.fail([keyless.id], ["later"], [2.0])  # a row without a key counts on its own
        due = session.next_due(ALL)
        assert due is not None and 1 < due <= 2


def test_a_row_failed_for_good_is_dead_with_its_error_and_holds_nothing(
    stores: StoresUnderTest,
) -> None:
    doomed = stores.send("orders", b"k1", key="k")
    stores.send("orders", b"k2", key="k")
    error = "MSG_SIZE_TOO_LARGE: " + "é" * 2_500_000  # 5 MB of text
    with stores.outbox().connect() as session:
        first = session.fetch(ALL, 10, []).fetchall()[0]
        session.fail([first.id], ["retriable"], [0.0])
        session.fail([first.id], [error], [None])
        assert payloads(session.fetch(ALL, 10, []).fetchall()) == [b"k2"]
        assert session.next_due(ALL) is None
    [dead] = stores.outbox_dead()
    assert (dead.message_id, dead.topic, dead.key, dead.payload) == (doomed, "orders", b"k", b"k1")
    assert dead.attempts == 2
    assert dead.error == error
    # dead rows are not waiting: the id may be sent again
    stores.send("orders", b"k1 again", key="k", message_id=doomed)


def test_failing_a_row_that_is_gone_records_nothing(stores: StoresUnderTest) -> None:
    stores.send("orders", b"1", key="k")
    with stores.outbox().connect() as session:
        [row] = session.fetch(ALL, 10, []).fetchall()
        session.delete([row.id])
        session.fail([row.id, 10**12], ["late", "never there"], [1.0, None])
    assert stores.outbox_dead() == []
    assert fetch(stores) == []


def test_a_transaction_applies_its_statements_together_or_not_at_all(
    stores: StoresUnderTest,
) -> None:
    for n in range(3):
        stores.send("orders", f"{n}".encode(), key=f"k{n}")
    with stores.outbox().connect() as session:
        a, b, c = session.fetch(ALL, 10, []).fetchall()
        with pytest.raises(RuntimeError, match="no commit"), session.transaction():
            session.delete([a.id])
            session.fail([b.id, c.id], ["later", "dead"], [5.0, None])
            raise RuntimeError("no commit")
        assert session.fetch(ALL, 10, []).fetchall() == [a, b, c]
        assert stores.outbox_dead() == []
        with session.transaction():
            session.delete([a.id])
            session.fail([b.id, c.id], ["later", "dead"], [5.0, None])
        assert session.fetch(ALL, 10, []).fetchall() == []
        assert [d.payload for d in stores.outbox_dead()] == [b"2"]


def test_a_fetch_in_a_pipeline_reads_the_rows_as_they_were_when_it_ran(
    stores: StoresUnderTest,
) -> None:
    for n in range(3):
        stores.send("orders", f"{n}".encode(), key="k")
    with stores.outbox().connect() as session:
        with session.pipeline():
            fetched = session.fetch(ALL, 10, [])
            ids = [r.id for r in fetch(stores)]
            session.delete(ids[:2])
        assert payloads(fetched.fetchall()) == [b"0", b"1", b"2"]
        assert payloads(session.fetch(ALL, 10, []).fetchall()) == [b"2"]


@pytest.mark.parametrize("error", ["NUL \x00 inside", "a lone surrogate \ud800"])
def test_an_error_that_is_not_storable_text_is_refused_for_its_data(
    stores: StoresUnderTest, error: str
) -> None:
    """The port takes storable text (`outbox.core.text.storable`); anything else is refused
    as PostgreSQL refuses it, for its data, and nothing is recorded."""
    stores.send("orders", b"1", key="k")
    with stores.outbox().connect() as session:
        [row] = session.fetch(ALL, 10, []).fetchall()
        with pytest.raises(Exception) as refused:
            session.fail([row.id], [error], [1.0])
        assert refused_for_data(refused.value), refused.value
        assert session.fetch(ALL, 10, []).fetchall() == [row]  # and the session goes on


def test_the_database_check_reports_each_attempt(stores: StoresUnderTest) -> None:
    attempts: list[int] = []
    stores.outbox().check(0.0, lambda: False, lambda: attempts.append(1))
    assert attempts == [1]
