"""The headers of a quarantined record as stored (`wire.raw_json`) read back by the one reverse,
`wire.from_raw_json`, which routing, `outbox dead-letters show` and the console use."""

from __future__ import annotations

import json

import pytest

from outbox.core.wire import from_raw_json, raw_json


def test_every_header_reads_back_as_its_bytes() -> None:
    headers = [
        ("x-tenant", b"acme"),
        ("caf\u00e9", "th\u00e9"),
        ("lone-\udc80", b"\xff\x00"),  # a name no UTF-8 encoder writes; NUL and non-UTF-8 data
        ("x-empty", None),
        ("x-tenant", b"globex"),  # a name that comes twice keeps both, in order
    ]
    stored = raw_json(headers)
    expected = (
        (b"x-tenant", b"acme"),
        ("caf\u00e9".encode(), "th\u00e9".encode()),
        (b"lone-\xed\xb2\x80", b"\xff\x00"),
        (b"x-empty", None),
        (b"x-tenant", b"globex"),
    )
    assert from_raw_json(stored) == expected
    assert from_raw_json(json.loads(stored)) == expected  # as psycopg reads jsonb


@pytest.mark.parametrize("stored", ["{}", '[["not base64!", null]]', '[["eA=="]]', "[1]"])
def test_what_raw_json_did_not_write_is_a_value_or_type_error(stored: str) -> None:
    with pytest.raises((ValueError, TypeError)):
        from_raw_json(stored)
