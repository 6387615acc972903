"""`broker.send` sets the tenant header a routing consumer reads: from the `Broker`, or per call;
an invalid tenant raises before anything is written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outbox import Broker, Message
from outbox.core.errors import ConfigurationError, InvalidHeaders
from outbox.core.headers import TENANT_HEADER


def _headers(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT headers FROM outbox.producer_queue ORDER BY id").fetchall()
    return [r[0] for r in rows]


def test_the_brokers_tenant_is_sent_and_a_call_overrides_it(outbox_database_url: str) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        Broker(tenant="acme").send(conn, "t", {"n": 1})
        Broker(tenant="acme").send(conn, "t", {"n": 2}, tenant="globex", headers={"x": "1"})
        Broker().send(conn, "t", {"n": 3}, tenant="initech")
        Broker().send(conn, "t", {"n": 4})
        Broker(tenant="a", tenant_header="x-tenant").send_many(
            conn, [Message("t", {"n": 5}), Message("t", {"n": 6}, tenant="b")]
        )
    assert _headers(url) == [
        {TENANT_HEADER: "acme"},
        {"x": "1", TENANT_HEADER: "globex"},
        {TENANT_HEADER: "initech"},
        {},
        {"x-tenant": "a"},
        {"x-tenant": "b"},
    ]


@pytest.mark.parametrize("tenant", ["", "no spaces", "-dash-first", "x" * 64, "é", 7])
def test_an_invalid_tenant_raises_and_writes_nothing(outbox_database_url: str, tenant: Any) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        with pytest.raises(InvalidHeaders, match="is not valid: a tenant is a database NAME"):
            Broker().send(conn, "t", {"n": 1}, tenant=tenant)
        Broker().send(conn, "t", {"n": 2})  # the transaction goes on
    with pytest.raises(ConfigurationError, match=r"tenant .* is not valid"):
        Broker(tenant=tenant)
    assert _headers(url) == [{}]


def test_the_tenant_header_is_given_once(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        broker = Broker(tenant="acme", tenant_header="x-tenant")
        with pytest.raises(InvalidHeaders, match="carries the tenant"):
            broker.send(conn, "t", {}, headers={"x-tenant": "other"})
    for name in ("outbox-message-id", "content-type", "outbox-other", ""):
        with pytest.raises(ConfigurationError, match="tenant header name"):
            Broker(tenant_header=name)
