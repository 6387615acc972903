"""The inbox column path (InboxBatch.add) stores what the row path (decode_record) does."""

from __future__ import annotations

import base64
import itertools
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from outbox.core.batches import InboxBatch, Positions, quarantined_row
from outbox.core.wire import decode_record
from outbox.postgres.inbox import insert_params, quarantine_params

ID = "0196f3a2-4b1c-7d2e-8f3a-9b4c5d6e7f80"
VALUES: list[bytes | str | None] = [
    None,
    b"",
    ID.encode(),
    ID.upper().encode(),
    ("{" + ID + "}").encode(),
    b"\xff\xfe",
    "not-a-uuid",
    b"2026-11-26T01:15:18.100213+00:00",
    "2026-11-26 01:15:18",
    b"9999-12-31T23:59:59-14:00",
    b"0001-01-01T00:00:00+14:00",
    b"application/json",
]
EXTRA: list[list[tuple[str, bytes | str | None]]] = [
    [],
    [("x-user", b"\xff"), ("x-text", "s"), ("x-none", None)],
    [("content-type", b"text/plain")],
    [("x-nul", b"\x00\x01"), ("x-nul-text", "a\x00b"), ("x-surrogate", "\udc80")],
    [("bad\x00name", b"v")],
    [("content-type", b"text\x00plain")],
    [("x-dup", b"1"), ("x-dup", b"2")],
]


def test_every_column_matches_the_rows_of_decode_record() -> None:
    batch = InboxBatch()
    rows = []
    names = ("outbox-message-id", "outbox-created-at", "content-type")
    cases = itertools.product(
        VALUES, VALUES, VALUES, EXTRA, (b"key", None), (None, 1_700_000_000_000)
    )
    for offset, (mid, created, ctype, extra, key, stamp) in enumerate(cases):
        headers = [*zip(names, (mid, created, ctype), strict=True), *extra]
        record = ("t", offset % 3, offset, key, b"v", headers)
        batch.add(*record, stamp)
        rows.append(
            decode_record(
                topic="t",
                partition=offset % 3,
                offset=offset,
                key=key,
                value=b"v",
                headers=headers,
                timestamp_ms=stamp,
            )
        )
    expected = insert_params(InboxBatch.of(r for r in rows if r.quarantine is None), "channel")
    actual = insert_params(batch, "channel")
    assert actual.keys() == expected.keys()
    assert [uuid.UUID(m) for m in actual["message_ids"]] == [
        uuid.UUID(m) for m in expected["message_ids"]
    ]
    for name in expected.keys() - {"message_ids", "created_ats"}:
        assert actual[name] == expected[name], name
    # Without a usable header or timestamp both take now(): those may differ a little.
    now = datetime.now(UTC)
    for got, want in zip(actual["created_ats"], expected["created_ats"], strict=True):
        taken_now = abs((now - want).total_seconds()) < 60
        assert got == want or (taken_now and abs((got - want).total_seconds()) < 5)
    assert len(batch) == len(rows)
    assert sorted(t.topic for t in batch.topical()) == sorted(r.topic for r in rows)
    # Quarantined records: the same rows either way, and some of each kind were met.
    marked = [quarantined_row(r) for r in rows if r.quarantine is not None]
    got, want = quarantine_params(batch.quarantined), quarantine_params(marked)
    for name in want.keys() - {"created_ats"}:  # now() for the times, as above
        assert got[name] == want[name], name
    reasons = {q.reason.split(" ")[0] for q in batch.quarantined}
    assert reasons == {"header", "content-type"}
    assert batch.ordinary + len(batch.quarantined) == len(rows)


def test_offsets_to_commit_are_the_last_of_each_partition_plus_one() -> None:
    batch = InboxBatch()
    for partition, offset in [(0, 5), (1, 7), (0, 6), (1, 3)]:
        batch.add("t", partition, offset, None, b"", [], None)
    assert batch.next_offsets() == {("t", 0): 7, ("t", 1): 8}


def test_a_foreign_id_is_the_same_for_the_same_record_only() -> None:
    from outbox.core.wire import foreign_id

    record = ("t", 0, 5, 1_700_000_000_000, b"k", b"v", [("h", b"1"), ("n", None)])
    same = foreign_id(*record)
    assert same == foreign_id(*record) and same.version == 5
    others = [
        ("t", 0, 5, 1_700_000_000_001, b"k", b"v", [("h", b"1"), ("n", None)]),
        ("t", 0, 5, 1_700_000_000_000, None, b"v", [("h", b"1"), ("n", None)]),
        ("t", 0, 5, 1_700_000_000_000, b"", b"v", [("h", b"1"), ("n", None)]),
        ("t", 0, 5, 1_700_000_000_000, b"k", b"w", [("h", b"1"), ("n", None)]),
        ("t", 0, 5, 1_700_000_000_000, b"k", b"v", [("h", b"1"), ("n", b"")]),
        ("t", 0, 5, 1_700_000_000_000, b"k", b"v", [("n", None), ("h", b"1")]),
        ("t", 0, 5, None, b"k", b"v", [("h", b"1"), ("n", None)]),
        ("t", 1, 5, 1_700_000_000_000, b"k", b"v", [("h", b"1"), ("n", None)]),
    ]
    ids = {foreign_id(*other) for other in others}  # type: ignore[arg-type]
    assert len(ids) == len(others) and same not in ids


def _record(created: bytes, timestamp_ms: int | None) -> datetime:
    return decode_record(
        topic="t",
        partition=0,
        offset=0,
        key=None,
        value=b"",
        headers=[("outbox-created-at", created)],
        timestamp_ms=timestamp_ms,
    ).created_at


def test_a_creation_time_psycopg_could_not_read_back_is_replaced_by_the_record_timestamp() -> None:
    # Stored as they are, these would be years 10000 and 0 in UTC: PostgreSQL keeps them, but
    # psycopg cannot load them, and the Handler stopped on the row (found by Hypothesis).
    for created in (b"9999-12-31T23:59:59-14:00", b"0001-01-01T00:00:00+14:00"):
        assert _record(created, 1_700_000_000_000) == datetime.fromtimestamp(1_700_000_000, UTC)
    assert _record(b"2026-11-26T02:00:00+01:00", None) == datetime(2026, 11, 26, 1, tzinfo=UTC)


def test_a_record_timestamp_no_datetime_can_hold_falls_back_to_now() -> None:
    before = datetime.now(UTC)
    for millis in (10**18, -(10**18)):
        created = _record(b"garbage", millis)
        assert before <= created <= datetime.now(UTC)


def _decoded(headers: list[tuple[str, bytes | None]]) -> Any:
    """The inbox row of a record with these headers (the rest fixed)."""
    return decode_record(
        topic="t", partition=0, offset=7, key=b"k", value=b"{}", headers=headers, timestamp_ms=None
    )


def test_a_header_name_that_comes_twice_quarantines_the_record_with_every_header() -> None:
    """A row keeps one value per name: two content types or two ids cannot both hold, and
    keeping the last one silently changed what the handler received."""
    cases = [
        [("content-type", b"application/json"), ("content-type", b"text/plain")],
        [("outbox-message-id", ID.encode()), ("outbox-message-id", None)],
        [("outbox-created-at", None), ("outbox-created-at", None)],
        [("trace", b"hop-1"), ("trace", b"hop-2")],
    ]
    for headers in cases:
        row = _decoded(headers)
        assert row.quarantine is not None and "comes more than once" in row.quarantine, headers
        assert repr(headers[0][0]) in row.quarantine
        kept = [
            (base64.b64decode(n).decode(), None if v is None else base64.b64decode(v))
            for n, v in json.loads(row.raw_headers or "[]")
        ]
        assert kept == headers
    fine = _decoded([("trace", b"1"), ("Trace", b"2")])
    assert fine.quarantine is None and fine.headers == {"trace": "1", "Trace": "2"}


def test_pick_takes_the_ordinary_records_at_indices_and_positions_only_commit() -> None:
    batch = InboxBatch()
    for offset in range(4):
        batch.add("t", offset % 2, offset, b"k", b"v%d" % offset, [("h", b"%d" % offset)], 1)
    picked = batch.pick([3, 0])
    assert [r.payload for r in picked.rows()] == [b"v3", b"v0"]
    assert picked.raw_headers == [[("h", b"3")], [("h", b"0")]]
    assert picked.quarantined == [] and batch.ordinary == 4
    positions = Positions({("t", 1): 7, ("a", 0): 2})
    assert len(positions) == 0
    assert positions.next_offsets() == {("a", 0): 2, ("t", 1): 7}
