"""Hostile bytes through every store: NUL, invalid UTF-8 and lone surrogates in keys, payloads
and headers, sent as a service sends them and received as a transport delivers them. What a
store accepts reads back equal; what PostgreSQL refuses is refused alike, before anything is
written."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import pytest

from outbox.core.batches import InboxBatch, stored_message
from outbox.core.errors import InvalidHeaders, InvalidKey
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID, from_json
from outbox.core.inbox_rows import FailedAttempt
from outbox.core.lanes import LANES
from outbox.core.retriable import refused_for_data

from .conftest import LONG_SCHEMA_TOO, StoresUnderTest, inbox_row, store

ALL = list(range(LANES))

KEYS: list[bytes | str] = [b"\x00", b"\xff\xfe\x00", "k\x00ey", "ünï \U0001f600", b"\xed\xa0\x80"]
PAYLOADS = [b"\x00" * 3, b"\xff\xfe\xfd", b"\xed\xa0\x80 CESU surrogate", b"", b"\x00{}"]


@LONG_SCHEMA_TOO
def test_keys_payloads_and_header_values_of_any_bytes_go_out_as_sent(
    stores: StoresUnderTest,
) -> None:
    headers: dict[str, str | bytes] = {
        "nul": b"\x00",
        "not-utf8": b"\xff\xfe",
        "surrogate-utf8": b"\xed\xa0\x80",
        "ünïcödé name": "ünïcödé value \U0001f600",
        "empty": b"",
    }
    sent = [
        stores.send("orders", payload, key=key, headers=headers)
        for key, payload in zip(KEYS, PAYLOADS, strict=True)
    ]
    with stores.outbox().connect() as session:
        records = session.fetch(ALL, 100, []).fetchall()
    assert [r.message_id for r in records] == [str(m) for m in sent]
    for record, key, payload in zip(records, KEYS, PAYLOADS, strict=True):
        assert record.key == (key.encode() if isinstance(key, str) else key)
        assert record.payload == payload
        assert stored_message(record).headers == headers
        wire = dict(record.wire_headers())
        assert wire["not-utf8"] == b"\xff\xfe" and wire["nul"] == b"\x00"


@pytest.mark.parametrize(
    ("key", "headers", "refused"),
    [
        ("lone \ud800 surrogate", None, InvalidKey),
        ("k", {"h": "NUL \x00 in text"}, InvalidHeaders),
        ("k", {"h": "lone \udc80"}, InvalidHeaders),
        ("k", {"NUL\x00name": "v"}, InvalidHeaders),
        ("k", {"\ud800": "v"}, InvalidHeaders),
    ],
    ids=["surrogate-key", "nul-value", "surrogate-value", "nul-name", "surrogate-name"],
)
def test_text_postgresql_cannot_hold_is_refused_before_anything_is_written(
    stores: StoresUnderTest, key: str, headers: dict[str, str] | None, refused: type[Exception]
) -> None:
    with pytest.raises(refused):
        stores.send("orders", b"x", key=key, headers=headers)
    with stores.outbox().connect() as session:
        assert session.fetch(ALL, 10, []).fetchall() == []


def _record(
    batch: InboxBatch,
    offset: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, bytes | str | None]],
    message_id: uuid.UUID | None = None,
) -> uuid.UUID:
    message_id = message_id or uuid.uuid4()
    own: list[tuple[str, bytes | str | None]] = [
        (MESSAGE_ID, str(message_id).encode()),
        (CREATED_AT, datetime.now(UTC).isoformat().encode()),
    ]
    batch.add("orders", 0, offset, key, value, own + headers)
    return message_id


@LONG_SCHEMA_TOO
def test_records_of_any_bytes_are_stored_as_received_or_quarantined_whole(
    stores: StoresUnderTest,
) -> None:
    batch = InboxBatch()
    ordinary = {
        _record(batch, 0, b"\x00\xff", b"\xff\x00\xfe", [("bin", b"\x00\xff\xfe")]): (
            b"\x00\xff",
            b"\xff\x00\xfe",
            {"bin": b"\x00\xff\xfe"},
        ),
        _record(batch, 1, None, b"\xed\xa0\x80", [("text", "NUL \x00 str"), ("n", None)]): (
            None,
            b"\xed\xa0\x80",
            {"text": b"NUL \x00 str", "n": b""},
        ),
        _record(batch, 2, b"k", b"", [("ünï", "ok \U0001f600"), (CONTENT_TYPE, b"text/plain")]): (
            b"k",
            b"",
            {"ünï": "ok \U0001f600"},
        ),
    }
    quarantined = {
        _record(batch, 3, b"k", b"\x00", [("bad\x00name", b"v")]),
        _record(batch, 4, b"k", b"\xff", [("\udcff", b"v")]),
        _record(batch, 5, b"k", b"x", [(CONTENT_TYPE, b"\xff\xfe")]),
        _record(batch, 6, b"k", b"x", [("twice", b"1"), ("twice", b"2")]),
    }
    assert batch.ordinary == 3 and len(batch.quarantined) == 4
    session = stores.inbox_writer().connect()
    try:
        assert session.insert(batch) == {"orders": 3}
        assert session.quarantine(batch.quarantined) == {"orders": 4}
    finally:
        session.close()

    database = stores.inbox()
    worker = database.open_session("psycopg")
    try:
        with worker.transaction() as (tx, _):
            claimed = database.work.claim_next(tx, ALL, 100, []).claimed.values()
    finally:
        worker.close()
    got = {
        c.message_id: (c.key, c.payload, from_json(c.headers) if c.headers else {}) for c in claimed
    }
    for message_id, (key, payload, headers) in ordinary.items():
        assert got[message_id][:2] == (key, payload)
        # a str value PostgreSQL cannot hold as text is kept as its UTF-8 bytes
        assert got[message_id][2] == {
            name: (value.encode() if isinstance(value, str) and "\x00" in value else value)
            for name, value in headers.items()
        }
    assert got.keys() == ordinary.keys()
    dead = stores.inbox_dead()
    assert {d.message_id for d in dead} == quarantined
    assert all(d.content_type == "application/octet-stream" and d.raw_headers for d in dead)
    assert all("\x00" not in d.error for d in dead)


@pytest.mark.parametrize("delay", [math.nan, math.inf, -math.inf, 1e300])
def test_a_retry_delay_postgresql_cannot_add_to_now_is_refused_for_its_data(
    stores: StoresUnderTest, delay: float
) -> None:
    """Both failure statements add the delay to now(); a negative one is due at once."""
    stores.send("orders", b"1", key="k")
    store(stores, [inbox_row()])
    database = stores.inbox()
    with stores.outbox().connect() as session, database.connect() as control:
        [row] = session.fetch(ALL, 10, []).fetchall()
        [pending] = control.fetch(ALL, 10, [])
        for fail in (
            lambda d: session.fail([row.id], ["later"], [d]),
            lambda d: control.fail(FailedAttempt(pending.id, "later", False, d)),
        ):
            with pytest.raises(Exception) as refused:
                fail(delay)
            assert refused_for_data(refused.value), repr(refused.value)
            fail(-1.0)
        assert session.fetch(ALL, 10, []).fetchall()[0].attempts == 1
        assert control.fetch(ALL, 10, [])[0].id == pending.id
        assert control.attempts(pending.id) == 1
