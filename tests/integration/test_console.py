"""`outbox console` over HTTP, without a browser: escaping, secrets, CSRF, auth, read-only.

The console runs in this process on a free port; requests are made with urllib. The browser
test (`test_console_browser.py`) drives the same pages in Chromium.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.cookies import SimpleCookie
from typing import Any

import psycopg
import pytest

from outbox.console import Console, ConsoleConfig, Database, serve
from outbox.console.server import parse_database
from outbox.core.errors import ConfigurationError
from tests.integration.test_operations import insert, row_of

PASSWORD = "pw-Secr3t-value"


def _with_password(url: str) -> str:
    """The test URL with a password (trust auth ignores it): it must never be rendered."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@")


@contextmanager
def console(url: str, **options: Any) -> Iterator[Console]:
    options.setdefault("sample_interval", 0.2)
    app = serve(
        ConsoleConfig(databases=(Database("orders", _with_password(url)),), port=0, **options)
    )
    try:
        yield app
    finally:
        app.close()


class Client:
    """A tiny browser: keeps the session cookie, reads the CSRF token off the page."""

    def __init__(self, app: Console, headers: dict[str, str] | None = None) -> None:
        self.base = app.url.rstrip("/")
        self.headers = dict(headers or {})
        self.cookie = ""
        self.csrf = ""

    def request(
        self, path: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        body = None if data is None else "&".join(f"{k}={v}" for k, v in data.items()).encode()
        request = urllib.request.Request(
            self.base + path, data=body, headers={**self.headers, **(headers or {})}
        )
        if self.cookie:
            request.add_header("Cookie", self.cookie)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def open_page(self) -> str:
        status, headers, body = self.request("/")
        assert status == 200, body
        if "Set-Cookie" in headers:
            cookie = SimpleCookie(headers["Set-Cookie"])
            self.cookie = "; ".join(f"{k}={m.value}" for k, m in cookie.items())
        page = body.decode()
        self.csrf = page.split('name="outbox-csrf" content="')[1].split('"')[0]
        return page

    def get_json(self, path: str) -> tuple[int, Any]:
        status, _, body = self.request(path)
        return status, json.loads(body)

    def post(self, path: str, data: dict[str, str], **headers: str) -> tuple[int, Any]:
        status, _, body = self.request(path, data, headers)
        return status, json.loads(body)


def test_everything_from_the_database_is_escaped_and_no_secret_is_rendered(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    hostile = "<script>alert(1)</script>"
    dead_id, _ = insert(
        url,
        "consumer",
        "dead",
        topic="orders",
        key=b"\xff\xfe<b>",
        payload=b"\xff\x00" + hostile.encode(),  # not UTF-8: shown as hex
        error=f"Traceback (most recent call last):\nValueError: {hostile} \x01 &amp;",
    )
    text_id, _ = insert(url, "consumer", "dead", topic="orders", payload=hostile.encode())
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox.consumer_queue SET headers = %s WHERE id = %s",
            (json.dumps({"x-evil": hostile + "\x1b[31m"}), dead_id),  # jsonb holds no NUL
        )
    with console(url) as app:
        client = Client(app)
        page = client.open_page()
        _, headers, _ = client.request("/")
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert PASSWORD not in page and "password=***" in page
        status, view = client.get_json("/api/view?db=orders")
        assert status == 200, view
        everything = json.dumps(view)
        assert PASSWORD not in everything
        assert "<script>" not in everything.replace("\\u003c", "<").replace("&lt;script&gt;", ""), (
            "raw <script> in a fragment"
        )
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in view["dead"]
        assert "&amp;amp;" in view["dead"] and "\\x01" in view["dead"]

        status, detail = client.get_json(f"/api/row?db=orders&queue=consumer&id={dead_id}")
        assert status == 200, detail
        html = detail["html"]
        assert "<script>" not in html and "&lt;script&gt;" in html
        assert "\\u001b[31m" in html  # the escape of the header, escaped by the JSON dump
        assert (b"\xff\x00" + hostile.encode()).hex() in html  # payload: hex, size shown
        assert f"{2 + len(hostile)} bytes" in html
        status, plain = client.get_json(f"/api/row?db=orders&queue=consumer&id={text_id}")
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in plain["html"]

        status, doc = client.get_json("/api/status?db=orders")
        assert status == 200 and doc["queues"]["consumer"]["totals"]["dead"]["count"] == 2
        assert PASSWORD not in json.dumps(doc)


def test_filter_requeue_and_purge_need_the_sessions_csrf_token_and_same_origin(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    a, _ = insert(url, "consumer", "dead", topic="orders", error="KeyError: 'sku-42'")
    b, _ = insert(url, "consumer", "dead", topic="payments", error="ValueError: bad amount")
    p, _ = insert(url, "producer", "dead", topic="orders", error="message too large")
    with console(url) as app:
        client = Client(app)
        client.open_page()
        _, view = client.get_json("/api/view?db=orders&queue=consumer&text=SKU-42")
        assert f'data-id="{a}"' in view["dead"] and f'data-id="{b}"' not in view["dead"]
        _, view = client.get_json("/api/view?db=orders&queue=consumer&topic=payments")
        assert f'data-id="{b}"' in view["dead"] and f'data-id="{a}"' not in view["dead"]
        _, view = client.get_json("/api/view?db=orders&queue=producer")
        assert f'data-id="{p}"' in view["dead"]

        origin = client.base
        form = {"db": "orders", "queue": "consumer", "id": str(a)}
        refused = [
            client.post("/api/requeue", form, **{"X-CSRF-Token": client.csrf}),  # no Origin
            client.post("/api/requeue", form, Origin="http://evil.example"),
            client.post("/api/requeue", form, Origin=origin),  # no token
            client.post("/api/requeue", form, Origin=origin, **{"X-CSRF-Token": "0" * 64}),
        ]
        assert [status for status, _ in refused] == [403, 403, 403, 403], refused
        assert row_of(url, "consumer", a)["dead_at"] is not None

        other = Client(app)  # another session: its token is not this session's
        other.open_page()
        status, _ = client.post("/api/requeue", form, Origin=origin, **{"X-CSRF-Token": other.csrf})
        assert status == 403

        status, done = client.post(
            "/api/requeue", form, Origin=origin, **{"X-CSRF-Token": client.csrf}
        )
        assert status == 200 and done["changed"] == 1, done
        assert row_of(url, "consumer", a)["dead_at"] is None
        status, again = client.post(
            "/api/requeue", form, Origin=origin, **{"X-CSRF-Token": client.csrf}
        )
        assert status == 404 and "not dead" in again["error"]

        purge = {"db": "orders", "queue": "producer", "id": str(p)}
        status, done = client.post(
            "/api/purge", purge, Origin=origin, **{"X-CSRF-Token": client.csrf}
        )
        assert status == 200 and done["changed"] == 1


def test_read_only_console_hides_and_refuses_requeue_and_purge(outbox_database_url: str) -> None:
    url = outbox_database_url
    a, _ = insert(url, "consumer", "dead")
    with console(url, read_only=True) as app:
        client = Client(app)
        assert "read-only" in client.open_page()
        _, detail = client.get_json(f"/api/row?db=orders&queue=consumer&id={a}")
        assert "data-action" not in detail["html"] and "Read-only" in detail["html"]
        status, body = client.post(
            "/api/requeue",
            {"db": "orders", "queue": "consumer", "id": str(a)},
            Origin=client.base,
            **{"X-CSRF-Token": client.csrf},
        )
        assert status == 403 and "read-only" in body["error"]
    assert row_of(url, "consumer", a)["dead_at"] is not None


def test_a_token_is_required_when_configured_and_hosts_are_checked_without_one(
    outbox_database_url: str,
) -> None:
    with console(outbox_database_url) as app:
        client = Client(app)
        assert client.get_json("/api/status?db=orders")[0] == 200
        status, _ = client.get_json("/api/status?db=nope")
        assert status == 404
        status, _, _ = client.request("/", headers={"Host": "attacker.example:8470"})
        assert status == 403, "a rebinding host name is refused"
        for query in ("text=a%00b", "topic=%00", "db=orders&queue=consumer&id=1%00"):
            status, body = client.get_json(f"/api/view?db=orders&{query}")
            assert status == 400 and "NUL" in body["error"], (query, status, body)

    with console(outbox_database_url, auth_token="tok-3f9a1c", host="127.0.0.1") as app:
        anonymous = Client(app)
        status, headers, _ = anonymous.request("/")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        wrong = Client(app, {"Authorization": "Bearer nope"})
        assert wrong.request("/")[0] == 401
        basic = base64.b64encode(b"ops:tok-3f9a1c").decode()
        assert Client(app, {"Authorization": f"Basic {basic}"}).request("/")[0] == 200
        bearer = Client(app, {"Authorization": "Bearer tok-3f9a1c"})
        assert bearer.request("/api/status?db=orders")[0] == 200
        page = bearer.open_page()
        assert "tok-3f9a1c" not in page


def test_binding_another_address_needs_a_token() -> None:
    db = (Database("a", "postgresql://u@h/a"),)
    with pytest.raises(ConfigurationError, match=r"refusing to serve the console on 0\.0\.0\.0"):
        ConsoleConfig(databases=db, host="0.0.0.0")
    ConsoleConfig(databases=db, host="0.0.0.0", auth_token="t")
    ConsoleConfig(databases=db, host="::1")
    result = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "console", "--database-url", "postgresql://u@h/a",
         "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "refusing to serve" in result.stderr


def test_database_names() -> None:
    assert parse_database("postgresql://u:p@h/orders") == ("orders", "postgresql://u:p@h/orders")
    assert parse_database("billing=postgresql://u@h/b") == ("billing", "postgresql://u@h/b")
    assert parse_database("host=h dbname=shop") == ("shop", "host=h dbname=shop")
    assert parse_database("eu=host=h dbname=shop") == ("eu", "host=h dbname=shop")
    with pytest.raises(ConfigurationError):
        parse_database("not a url at all")
    from outbox.console.server import parse_database_entry

    assert parse_database_entry("billing/billing_v2=postgresql://u@h/app") == (
        "billing",
        "postgresql://u@h/app",
        "billing_v2",
    )
    assert parse_database_entry("orders=postgresql://u@h/app")[2] is None
    with pytest.raises(ConfigurationError, match="schema"):
        parse_database_entry('x/bad"name=postgresql://u@h/app')


def test_a_quarantined_rows_raw_headers_are_shown_decoded_as_dead_letters_show_does(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    quarantined, _ = insert(url, "consumer", "dead", error="header name 'bad\\x00name' ...")
    ordinary, _ = insert(url, "consumer", "dead")
    raw = [
        [base64.b64encode(b"bad\x00name").decode(), base64.b64encode(b"\x00\x01").decode()],
        [base64.b64encode(b"content-type").decode(), base64.b64encode(b"<b>json</b>").decode()],
        [base64.b64encode(b"x-empty").decode(), None],
    ]
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox.consumer_queue SET raw_headers = %s WHERE id = %s",
            (json.dumps(raw), quarantined),
        )
    with console(url) as app:
        client = Client(app)
        client.open_page()
        _, view = client.get_json("/api/view?db=orders&queue=consumer")
        marked = view["dead"].split(f'data-id="{quarantined}"')[0].rsplit("<tr>", 1)[1]
        assert "(quarantined)" in marked
        assert (
            "(quarantined)"
            not in view["dead"].split(f'data-id="{ordinary}"')[0].rsplit("<tr>", 1)[1]
        )
        _, detail = client.get_json(f"/api/row?db=orders&queue=consumer&id={quarantined}")
        html = detail["html"]
        assert '<small id="raw-headers-count">3, as received</small>' in html
        # As `outbox dead-letters show --json` decodes them: text when printable, else hex.
        bad_name = b"bad\x00name".hex()
        assert f"<td><code>hex:{bad_name}</code></td><td><code>hex:0001</code>" in html
        assert "<td>content-type</td><td>&lt;b&gt;json&lt;/b&gt;</td>" in html
        assert '<td>x-empty</td><td><span class="none">(no value)</span></td>' in html
        _, plain = client.get_json(f"/api/row?db=orders&queue=consumer&id={ordinary}")
        assert "raw headers" not in plain["html"]
