"""The PostgreSQL log's header form: what outbox's publisher writes reads back; anything else
is refused with the reason, never read as something it is not."""

from __future__ import annotations

import pytest

from outbox.pglog.log import decode_headers, encode_headers


def test_headers_read_back_in_order_with_duplicates_and_null_values() -> None:
    headers = [("a", b"1"), ("a", b"2"), ("nul", None), ("bin", b"\x00\xff"), ("é", b"")]
    assert decode_headers(encode_headers(headers)) == headers
    assert decode_headers(b"") == [] and decode_headers(None) == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x00", "cut short"),
        (b"\x00\x05ab", "runs past the end"),
        (b"\x00\x01x\x00\x00", "runs past the end"),
        (b"\x00\x01x\x7f\xff\xff\xff", "does not fit"),
        (b"\x00\x01x\xff\xff\xff\xfe", "does not fit"),
        (encode_headers([("a", b"1")]) + b"\x00", "cut short"),
    ],
)
def test_headers_not_in_the_logs_form_are_refused(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode_headers(data)


def test_a_name_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(UnicodeDecodeError):
        decode_headers(b"\x00\x02\xff\xfe\xff\xff\xff\xff")
