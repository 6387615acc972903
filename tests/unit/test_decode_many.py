"""A batch's messages built in one pass (`decode_many`, issue 35) are those `read_payload` gives
one by one: the same payloads, and for a payload that cannot be decoded the same error, at the
same message."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from outbox.core.envelope import InboxMessage
from outbox.core.errors import SerializationError
from outbox.core.inbox_rows import Claimed, Undecodable, decode, decode_many
from outbox.core.serializers import BYTES, JSON, TEXT, JsonSerializer, read_payload
from outbox.core.text import first_line

SERIALIZER = JsonSerializer()
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

#: JSON payloads `json.loads` reads, some of them only by its slow path (an encoding to detect,
#: whitespace around the value).
READABLE = [
    b'{"n": 1, "note": "xxxx"}',
    b"[]",
    b'"text"',
    b"0",
    b"-0.0",
    b"1e400",
    b"123456789012345678901234567890",
    b"NaN",
    b"-Infinity",
    b"true",
    b"null",
    b'{"a": 1, "a": 2}',
    '{"é": "ü€𝄞"}'.encode(),
    b'"\\ud800"',
    b' {"padded": true} ',
    b'{"newline": 1}\n',
    b'\xef\xbb\xbf{"bom": "utf-8"}',
    '{"utf": 16}'.encode("utf-16"),
    '{"utf": "16-le"}'.encode("utf-16-le"),
    '{"utf": "16-be"}'.encode("utf-16-be"),
    '{"utf": 32}'.encode("utf-32"),
    "1".encode("utf-16-le"),
    "[1]".encode("utf-32-le"),
    b'"\xed\xa0\x80"',  # a surrogate in UTF-8: json.loads decodes with surrogatepass
]
#: Payloads `json.loads` refuses, some of them JSON in part.
UNREADABLE = [
    b"",
    b"   ",
    b"{not json",
    b"[1",
    b"2]",
    b"1,2",
    b"{} x",
    b'"a\x00b"',
    b"1\x00\x00",
    b"\xff\xfe\xfd",
    b"\xef\xbb\xbf",
    b"[" * 100_000,
    b"'single'",
    b"{'a': 1}",
]


def _claimed(row: int, payload: bytes, content_type: str = JSON, headers: Any = None) -> Claimed:
    return Claimed(
        id=row,
        message_id=uuid.UUID(int=row),
        topic="t",
        key=b"k" if row % 2 else None,
        payload=payload,
        headers=headers,
        content_type=content_type,
        created_at=NOW,
        received_at=NOW,
        attempts=row % 3,
        partition=row % 2 or None,
        offset=row,
    )


def _expected(claimed: Claimed) -> InboxMessage[Any] | str:
    """The message (or the error text) of `claimed` as outbox built it before issue 35: by
    keyword, its payload read by `read_payload`."""
    payload = bytes(claimed.payload)
    try:
        decoded = read_payload(None, payload, claimed.content_type, SERIALIZER)
    except SerializationError as exc:
        return f"cannot decode the payload as {claimed.content_type!r}: {first_line(exc)}"
    return InboxMessage(
        id=claimed.message_id,
        topic=claimed.topic,
        key=claimed.key,
        payload=decoded,
        raw_payload=payload,
        content_type=claimed.content_type,
        headers={"h": "v"} if claimed.headers else {},
        attempt=claimed.attempts + 1,
        created_at=claimed.created_at,
        received_at=claimed.received_at,
        partition=claimed.partition,
        offset=claimed.offset,
    )


def _same(got: InboxMessage[Any], expected: InboxMessage[Any]) -> None:
    # NaN is not equal to itself: compare payloads by their repr, and the rest as dataclasses.
    assert repr(got.payload) == repr(expected.payload)
    assert type(got.payload) is type(expected.payload)
    assert {**_fields(got), "payload": None} == {**_fields(expected), "payload": None}


def _fields(message: InboxMessage[Any]) -> dict[str, Any]:
    return {name: getattr(message, name) for name in message.__dataclass_fields__}


@pytest.mark.parametrize("payload", READABLE, ids=repr)
def test_a_readable_payload_is_the_value_json_loads_gives(payload: bytes) -> None:
    claimed = _claimed(1, payload, headers={"h": "v"})
    expected = _expected(claimed)
    assert isinstance(expected, InboxMessage)
    messages, error = decode_many([claimed], SERIALIZER)
    assert error is None
    _same(messages[0], expected)
    _same(decode(claimed, SERIALIZER), expected)


@pytest.mark.parametrize("payload", UNREADABLE, ids=lambda p: repr(p[:20]))
def test_an_unreadable_payload_fails_with_the_error_of_read_payload(payload: bytes) -> None:
    claimed = _claimed(1, payload)
    expected = _expected(claimed)
    assert isinstance(expected, str)
    messages, error = decode_many([claimed], SERIALIZER)
    assert messages == []
    assert isinstance(error, Undecodable)
    assert str(error) == expected
    with pytest.raises(Undecodable) as raised:
        decode(claimed, SERIALIZER)
    assert str(raised.value) == expected


def test_a_batch_stops_at_its_first_undecodable_message_with_those_before_it() -> None:
    rows = [
        _claimed(1, b'{"n": 1}'),
        _claimed(2, b"bytes \xff", BYTES),
        _claimed(3, "text é".encode(), TEXT),
        _claimed(4, b'{"n": 4}', headers={"h": "v"}),
        _claimed(5, b"text \xff", TEXT),  # not UTF-8 text
        _claimed(6, b'{"n": 6}'),
    ]
    messages, error = decode_many(rows, SERIALIZER)
    assert [m.payload for m in messages] == [{"n": 1}, b"bytes \xff", "text é", {"n": 4}]
    for got, claimed in zip(messages, rows, strict=False):
        expected = _expected(claimed)
        assert isinstance(expected, InboxMessage)
        _same(got, expected)
    assert isinstance(error, Undecodable)
    assert str(error) == _expected(rows[4])
    assert decode_many(rows[:4] + rows[5:], SERIALIZER)[1] is None


def test_a_serializer_of_its_own_reads_every_payload() -> None:
    class Loud(JsonSerializer):
        def loads(self, data: bytes) -> Any:
            return {"read by": "Loud", "data": data.decode()}

    messages, error = decode_many([_claimed(1, b'{"n": 1}')], Loud())
    assert error is None
    assert messages[0].payload == {"read by": "Loud", "data": '{"n": 1}'}
