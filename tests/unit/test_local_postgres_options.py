"""The local PostgreSQL's max_connections: 300, or OUTBOX_TEST_PG_MAX_CONNECTIONS."""

from __future__ import annotations

import pytest

from outbox.testing.servers.postgres import _max_connections


def test_the_local_server_allows_300_connections_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OUTBOX_TEST_PG_MAX_CONNECTIONS", raising=False)
    assert _max_connections() == 300
    monkeypatch.setenv("OUTBOX_TEST_PG_MAX_CONNECTIONS", " 1010 ")
    assert _max_connections() == 1010


@pytest.mark.parametrize("bad", ["many", "-5", "5", "20000", "1e3", "\u0661\u0660\u0660"])
def test_a_bad_max_connections_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("OUTBOX_TEST_PG_MAX_CONNECTIONS", bad)
    with pytest.raises(ValueError, match="OUTBOX_TEST_PG_MAX_CONNECTIONS must be a whole number"):
        _max_connections()
