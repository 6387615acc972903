"""`outbox console` over HTTP, without a browser: escaping, secrets, CSRF, auth, read-only.

The console runs in this process on a free port; requests are made with urllib. The browser
test (`test_console_browser.py`) drives the same pages in Chromium.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import logging
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from http.cookies import SimpleCookie
from typing import Any

import psycopg
import pytest

from outbox.console import Console, ConsoleConfig, Database, serve
from outbox.console.server import parse_database
from outbox.core.errors import ConfigurationError
from outbox.postgres import migrate
from outbox.transports import settings_of
from tests.integration.relay_helpers import wait_for
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
    ) -> tuple[int, Message, bytes]:
        """(status, headers: their names compared without case, body)."""
        body = None if data is None else "&".join(f"{k}={v}" for k, v in data.items()).encode()
        request = urllib.request.Request(
            self.base + path, data=body, headers={**self.headers, **(headers or {})}
        )
        if self.cookie:
            request.add_header("Cookie", self.cookie)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()

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
        assert "producer_dead" in view["dead"] and "producer_queue" not in view["dead"]

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
        # issue 24: the outbox's dead rows are reported where they are, in producer_dead
        _, view = client.get_json("/api/view?db=orders&queue=producer")
        assert "No dead rows in producer_dead." in view["dead"], view["dead"]


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


def test_a_missing_console_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from outbox.cli import main

    real = importlib.util.find_spec
    for missing in ("starlette", "uvicorn"):
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *args, gone=missing: None if name == gone else real(name, *args),
        )
        assert main(["console", "--database-url", "postgresql://u@127.0.0.1:1/db"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(
            "outbox: error: outbox console needs the console extra: "
            "pip install 'pg-kafka-outbox[console]'"
        ), err
        assert f"({missing} is not installed)" in err and len(err.strip().splitlines()) == 1


def test_database_names() -> None:
    assert parse_database("postgresql://u:p@h/orders") == ("orders", "postgresql://u:p@h/orders")
    assert parse_database("billing=postgresql://u@h/b") == ("billing", "postgresql://u@h/b")
    assert parse_database("host=h dbname=shop") == ("shop", "host=h dbname=shop")
    assert parse_database("eu=host=h dbname=shop") == ("eu", "host=h dbname=shop")
    with pytest.raises(ConfigurationError):
        parse_database("not a url at all")
    # The console reads entries as every command does (outbox.core.databases).
    from outbox.core.databases import Database as Entry
    from outbox.core.databases import parse_entry

    assert parse_entry("billing/billing_v2=postgresql://u@h/app", "outbox") == Entry(
        "billing", "postgresql://u@h/app", "billing_v2"
    )
    assert parse_entry("orders=postgresql://u@h/app", "shop").schema == "shop"
    with pytest.raises(ConfigurationError, match="schema"):
        parse_entry('x/bad"name=postgresql://u@h/app', "outbox")


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


# -- hostile conditions: oversized rows, malformed requests, many connections -----------------


def _spawn_console(*args: str) -> tuple[subprocess.Popen[str], str]:
    """`outbox console` as a process of its own on a free port: (process, its URL)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "outbox.cli", "console", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("outbox console: http://"), line + process.stdout.read()
    return process, line.split(": ", 1)[1].strip().rstrip("/")


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def _get(base: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_oversized_rows_are_cut_in_postgresql_and_the_dead_letters_are_paged(
    outbox_database_url: str,
) -> None:
    """20 dead rows with 5 MB errors and a 100 MB payload: every answer stays small and the
    console's process stays small (it read everything before: 100 MB per refresh, 640 MB to
    open the payload's row)."""
    from outbox.console.reads import PAGE_ROWS, PREVIEW_BYTES
    from outbox.console.server import MAX_RESPONSE_BYTES

    url = outbox_database_url
    small = [insert(url, "consumer", "dead", error=f"KeyError: 'n{n}'")[0] for n in range(40)]
    frames = "".join(f'  File "app.py", line {n}, in f{n}\n    f{n + 1}()\n' for n in range(2000))
    traceback = f"Traceback (most recent call last):\n{frames}KeyError: 'the-end'\n"
    deep, _ = insert(url, "consumer", "dead", error=traceback)
    small.append(deep)
    with psycopg.connect(url) as conn:
        big = [
            row[0]
            for row in conn.execute(
                "INSERT INTO outbox.consumer_queue (message_id, topic, key, payload, "
                "content_type, lane, attempts, last_error, dead_at) "
                "SELECT gen_random_uuid(), 'orders', convert_to(repeat('k', 1000000), 'UTF8'), "
                "'{}', 'application/json', 1, 5, "
                "'ValueError: ' || repeat('boom ', 1000000), now() "
                "FROM generate_series(1, 20) RETURNING id"
            ).fetchall()
        ]
        [(huge,)] = conn.execute(
            "INSERT INTO outbox.consumer_queue (message_id, topic, payload, content_type, lane, "
            "attempts, last_error, dead_at) SELECT gen_random_uuid(), 'orders', "
            "convert_to(repeat('{\"x\": 1}', 12500000), 'UTF8'), 'application/json', 1, 5, "
            "'ValueError: huge', now() RETURNING id"
        ).fetchall()
    process, base = _spawn_console("--database-url", f"orders={url}")
    try:
        status, body = _get(base, "/api/view?db=orders&queue=consumer")
        assert status == 200 and len(body) < MAX_RESPONSE_BYTES, (status, len(body))
        view = json.loads(body)
        assert view["dead_total"] == 62 and view["dead_rows"] == PAGE_ROWS and view["more"]
        seen = [int(i) for i in re.findall(r'data-id="(\d+)"', view["dead"])]
        assert seen == sorted(small + big + [huge])[:PAGE_ROWS]
        assert "ValueError: boom boom" in view["dead"] and 'id="dead-more"' in view["dead"]
        # A long traceback's summary is its last exception's line, read from its end.
        row_html = view["dead"].split(f'data-id="{deep}"')[0].rsplit("<tr>", 1)[1]
        assert "KeyError: &#x27;the-end&#x27;" in row_html, row_html
        assert len(body) < 200_000, len(body)  # 20 errors of 5 MB: each cut to a summary

        status, body = _get(base, f"/api/view?db=orders&queue=consumer&after={seen[-1]}")
        rest = json.loads(body)
        assert status == 200 and not rest["more"] and rest["next_after"] is None
        more = [int(i) for i in re.findall(r'data-id="(\d+)"', rest["dead"])]
        assert seen + more == sorted(small + big + [huge]), "every dead row on one page"
        assert "first page" in rest["dead"]
        assert _get(base, "/api/view?db=orders&after=x")[0] == 400

        for _ in range(3):  # three opens of the 100 MB payload's row
            status, body = _get(base, f"/api/row?db=orders&queue=consumer&id={huge}")
            assert status == 200 and len(body) < 100_000, (status, len(body))
            detail = json.loads(body)
            assert detail["payload_size"] == 100_000_000
            assert detail["payload_preview_bytes"] == PREVIEW_BYTES
            assert "100000000 bytes, UTF-8, showing the first" in detail["html"]
        status, body = _get(base, f"/api/row?db=orders&queue=consumer&id={big[0]}")
        detail = json.loads(body)
        assert status == 200 and len(body) < 300_000 and detail["error_size"] == 5_000_012
        assert "5000012 bytes in all: showing the first 8192 and the last 8192" in detail["html"]
        status, body = _get(base, f"/api/row?db=orders&queue=consumer&id={deep}")
        html = json.loads(body)["html"]
        assert html.rstrip("</pre>").count("KeyError: &#x27;the-end&#x27;") == 1
        assert "Traceback (most recent call last)" in html and "in all: showing" in html
        assert "1000000 bytes, showing the first 1024" in detail["html"]  # the key
        for _ in range(5):  # refreshes of the page
            assert _get(base, "/api/view?db=orders&queue=consumer")[0] == 200
        # Generous: the interpreter with psycopg is ~40 MB; reading the rows took 500+ MB.
        peak = _peak_rss_mb(process.pid)
        print(f"peak RSS {peak:.0f} MB")
        assert peak < 200, f"the console's peak RSS was {peak:.0f} MB"
    finally:
        process.terminate()
        process.wait(30)
        assert process.stdout is not None
        process.stdout.close()


def _raw_request(app: Console, request: bytes, timeout: float = 10) -> bytes:
    """Send `request` on a socket of its own and read the answer until the server closes."""
    host, port = app.url.split("//")[1].rstrip("/").rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_requests_are_answered_4xx_without_holding_a_worker(
    outbox_database_url: str,
) -> None:
    with console(outbox_database_url, socket_timeout=1.0) as app:
        client = Client(app)
        client.open_page()
        host = app.url.split("//")[1].rstrip("/")

        def post(length: str, body: bytes = b"") -> bytes:
            head = (
                f"POST /api/requeue HTTP/1.1\r\nHost: {host}\r\nOrigin: {client.base}\r\n"
                f"Cookie: {client.cookie}\r\nX-CSRF-Token: {client.csrf}\r\n"
                f"Content-Type: application/x-www-form-urlencoded\r\n{length}\r\n"
            )
            return _raw_request(app, head.encode() + body)

        # The first four are refused by uvicorn's parser (h11) with its own 400 before the
        # console sees them; identical repeated lengths are one length to it (RFC 9110, 8.6).
        for length, expected in [
            ("Content-Length: abc\r\n", b"HTTP/1.1 400 "),  # was 500
            ("Content-Length: -1\r\n", b"HTTP/1.1 400 "),  # blocked the thread
            ("Content-Length: 1e3\r\n", b"HTTP/1.1 400 "),
            ("Content-Length: 5\r\nContent-Length: 6\r\n", b"HTTP/1.1 400 "),
            ("Content-Length: 99999999999\r\n", b"HTTP/1.1 413 "),
            ("Transfer-Encoding: chunked\r\n", b"HTTP/1.1 411 "),
        ]:
            answer = post(length)
            assert answer.startswith(expected), (length, answer[:200])
            assert b'"error"' in answer or b"Invalid HTTP request" in answer, answer
        # A body shorter than announced: the read times out (socket_timeout), 408.
        for length, body in [("Content-Length: 40\r\n", b"db=orders"),
                             ("Content-Length: 5\r\nContent-Length: 5\r\n", b"")]:  # fmt: skip
            started = time.monotonic()
            answer = post(length, body)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b'"error"' in answer and time.monotonic() - started < 5
        # A client that sends nothing, or never ends its head, is disconnected after
        # socket_timeout (and not after the 10 s the raw requests wait).
        for request in (b"", b"GET / HTTP/1.1\r\nHost: x"):
            started = time.monotonic()
            assert _raw_request(app, request) == b""
            assert time.monotonic() - started < 5
        assert client.get_json("/api/status?db=orders")[0] == 200


def test_a_client_that_reads_nothing_of_its_answer_is_cut_off(
    outbox_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.console import assets

    big = "/*" + "x" * 3_000_000 + "*/"
    monkeypatch.setattr(assets, "JS", big)
    with console(outbox_database_url, socket_timeout=1.0) as app:
        host, port = app.url.split("//")[1].rstrip("/").rsplit(":", 1)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(10)
            sock.connect((host, int(port)))
            sock.sendall(f"GET /static/console.js HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            time.sleep(3)  # reading nothing, past socket_timeout
            got = 0
            try:
                while chunk := sock.recv(65536):
                    got += len(chunk)
            except ConnectionResetError:
                pass
        assert got < len(big), "the whole answer waited for a client that did not read it"
        assert Client(app).get_json("/api/status?db=orders")[0] == 200


def test_the_database_reads_run_in_at_most_workers_threads_off_the_event_loop(
    outbox_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    running: list[str] = []
    seen: set[str] = set()
    most = 0
    lock = threading.Lock()
    real = Console.status_document

    def slow(self: Console, d: Database) -> dict[str, Any]:
        nonlocal most
        with lock:
            running.append(threading.current_thread().name)
            seen.add(threading.current_thread().name)
            most = max(most, len(running))
        time.sleep(0.5)
        with lock:
            running.remove(threading.current_thread().name)
        return real(self, d)

    monkeypatch.setattr(Console, "status_document", slow)
    with console(outbox_database_url, workers=2, queued=10) as app:
        client = Client(app)
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: client.get_json("/api/status")[0], range(6)))
        assert answers == [200] * 6
        assert most == 2, most
        assert "outbox-console-server" not in seen, seen  # not the event loop's thread
        # HEAD: the GET's headers, no body.
        answer = _raw_request(
            app, b"HEAD / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"", answer
        assert b"content-security-policy: default-src 'none'" in head.lower()
        assert int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) > 1000


def test_connections_beyond_the_workers_and_their_queue_are_answered_503(
    outbox_database_url: str,
) -> None:
    with console(outbox_database_url, workers=2, queued=1, socket_timeout=60.0) as app:
        host, port = app.url.split("//")[1].rstrip("/").rsplit(":", 1)
        # Three connections open (workers + queued), sending nothing: the next one accepted
        # (after them: accepted in order) is answered at once, before it sends anything.
        silent = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
        try:
            answer = _raw_request(app, b"")
            assert answer.startswith(b"HTTP/1.1 503 ") and b"busy" in answer, answer
            assert b"Retry-After: 1" in answer
            assert app.busy_answers == 1
        finally:
            for sock in silent:
                sock.close()
        # Their workers see them closed and serve again (until then: 503, Retry-After).
        client = Client(app)
        wait_for(lambda: client.get_json("/api/status?db=orders")[0] == 200, 30, "served")


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_console_serves_on_the_ipv6_loopback(outbox_database_url: str) -> None:
    with console(outbox_database_url, host="::1") as app:
        assert app.url.startswith("http://[::1]:")
        client = Client(app)
        client.open_page()
        assert client.get_json("/api/status?db=orders")[0] == 200


def test_a_host_the_console_cannot_listen_on_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, said in [
            ("no-such-host.invalid", "cannot listen on no-such-host.invalid"),
            ("192.0.2.1", "cannot listen on 192.0.2.1:"),  # not an address of this machine
            ("127.0.0.1", f"cannot listen on 127.0.0.1:{port}: "),  # in use
        ]:
            result = subprocess.run(
                [sys.executable, "-m", "outbox.cli", "console", "--database-url",
                 "postgresql://u@h/a", "--host", host, "--port", str(port),
                 "--auth-token", "t"],
                capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            assert result.returncode == 1, (host, result.stderr)
            assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


def test_the_transactions_in_flight_are_those_of_the_databases_schema(
    outbox_database_url: str,
) -> None:
    """Two services in one database, schemas outbox and billing: a handler transaction of
    billing is not one of outbox's (both were counted: the filter was the database)."""
    url = outbox_database_url
    migrate.upgrade(url, "billing")
    row, _ = insert(url, "consumer", "pending", schema="billing")
    databases = (
        Database("orders", _with_password(url)),
        Database("billing", _with_password(url), "billing"),
    )
    app = serve(ConsoleConfig(databases=databases, port=0, sample_interval=0.2))
    handler = psycopg.connect(url, application_name="outbox-handler")
    try:
        handler.execute("SELECT id FROM billing.consumer_queue WHERE id = %s FOR UPDATE", (row,))
        client = Client(app)
        _, billing = client.get_json("/api/status?db=billing")
        _, orders = client.get_json("/api/status?db=orders")
        assert len(billing["claims"]) == 1 and billing["claims"][0]["backend_pid"] == (
            handler.info.backend_pid
        )
        assert orders["claims"] == []
    finally:
        handler.close()
        app.close()


def test_the_throughput_counts_relayed_and_received_rows(outbox_database_url: str) -> None:
    """relayed: rows deleted from producer_queue after an acknowledgement, not those moved to
    producer_dead (they were counted); received: rows stored into consumer_queue, at once (the
    statistics it was read from are flushed 10 s after a session goes idle: it stayed 0)."""
    from outbox.console.reads import counters

    url = outbox_database_url
    ids = [insert(url, "producer", "pending")[0] for _ in range(3)]
    with psycopg.connect(url, autocommit=True) as reader:
        first = counters(reader, "outbox")
        with psycopg.connect(url, autocommit=True) as relay:
            relay.execute("DELETE FROM outbox.producer_queue WHERE id = ANY(%s)", (ids[:2],))
            relay.execute(
                "WITH moved AS (DELETE FROM outbox.producer_queue WHERE id = %s RETURNING *) "
                "INSERT INTO outbox.producer_dead (id, message_id, topic, key, payload, headers, "
                "content_type, lane, created_at, attempts, next_attempt_at, last_error, dead_at) "
                "SELECT id, message_id, topic, key, payload, headers, content_type, lane, "
                "created_at, attempts, next_attempt_at, 'too large', now() FROM moved",
                (ids[2],),
            )
        # The relay's session ended: its statistics are flushed.
        wait_for(
            lambda: (
                counters(reader, "outbox").relayed > first.relayed
                or counters(reader, "outbox").written > first.written + 99
            ),
            30,
            "the relay's statistics",
        )
        assert counters(reader, "outbox").relayed - first.relayed == 2

        before = counters(reader, "outbox")
        with psycopg.connect(url, autocommit=True) as consumer:  # stays open and idle
            consumer.execute("SELECT 1")
            consumer.execute(
                "INSERT INTO outbox.consumer_queue (message_id, topic, payload, content_type, "
                "lane) SELECT gen_random_uuid(), 'orders', '{}', 'application/json', 1 "
                "FROM generate_series(1, 4)"
            )
            after = counters(reader, "outbox", before)
            assert after.received == 4
            assert counters(reader, "outbox", after).received == 0


def test_a_database_the_console_cannot_reach_is_shown_and_retried_without_flooding_the_log(
    outbox_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    gone = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/nothing"
    databases = (Database("gone", gone), Database("orders", outbox_database_url))
    caplog.set_level(logging.INFO, "outbox.console")
    app = serve(ConsoleConfig(databases=databases, port=0, sample_interval=0.02))
    try:
        client = Client(app)
        status, body = client.get_json("/api/view?db=gone")
        assert status == 503 and "cannot connect to PostgreSQL (gone)" in body["error"]
        assert PASSWORD not in body["error"]
        assert client.get_json("/api/view?db=orders")[0] == 200
        time.sleep(1)  # some 50 samples of the unreachable database
    finally:
        app.close()
    warnings = [r for r in caplog.records if "sampling gone" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_the_console_shows_the_lag_of_the_log_transport(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    from outbox.pglog import PgLog
    from tests.integration.test_pglog import _commit_first, publish

    topic = "console.lag"
    PgLog(outbox_log_url).create_topic(topic, 2)
    publish(outbox_log_url, topic, 0, 10)
    _commit_first(outbox_log_url, topic, "shipping", 7)
    with console(
        outbox_database_url,
        transport=settings_of("postgres", log_url=outbox_log_url),
        groups=("shipping",),
    ) as app:
        client = Client(app)
        wait_for(
            lambda: client.get_json("/api/status?db=orders")[1]["lag"], 30, "the log's lag read"
        )
        _, doc = client.get_json("/api/status?db=orders")
        [shipping] = doc["lag"]
        assert shipping["group"] == "shipping" and shipping["total"] == 3, shipping
        _, view = client.get_json("/api/view?db=orders")
        assert "group shipping" in view["lag"] and ">3</span>" in view["lag"]
        assert "committed past the end" not in view["lag"]
        # An offset written by hand past a partition's end is shown as such, not as lag 0.
        with psycopg.connect(outbox_log_url) as conn:
            conn.execute(
                "UPDATE outbox_log.log_group_offsets o SET next_offset = p.next_offset + 100 "
                "FROM outbox_log.log_partitions p WHERE p.id = o.partition_id AND p.partition = 0"
            )
        wait_for(
            lambda: "committed past the end" in client.get_json("/api/view?db=orders")[1]["lag"],
            30,
            "the offset past the end shown",
        )
        _, doc = client.get_json("/api/status?db=orders")
        [shipping] = doc["lag"]
        assert [p["past_end"] for p in shipping["partitions"]] == [True, False], shipping
        # The log went back under the group in partition 1 (as a member notes it).
        with psycopg.connect(outbox_log_url) as conn:
            conn.execute(
                "UPDATE outbox_log.log_group_offsets o SET went_back = 2, went_back_at = now(), "
                "went_back_position = 9, went_back_end = 4, went_back_to = 4 "
                "FROM outbox_log.log_partitions p WHERE p.id = o.partition_id AND p.partition = 1"
            )
        wait_for(
            lambda: "log went back 2 times" in client.get_json("/api/view?db=orders")[1]["lag"],
            30,
            "the partition that went back shown",
        )
        _, view = client.get_json("/api/view?db=orders")
        assert "position 9, end 4, read again from offset 4" in view["lag"]
        _, doc = client.get_json("/api/status?db=orders")
        [shipping] = doc["lag"]
        assert [p["went_back"] for p in shipping["partitions"]] == [0, 2], shipping

    with console(outbox_database_url, transport=settings_of("postgres")) as app:
        _, view = Client(app).get_json("/api/view?db=orders")
        assert "needs --log-url" in view["lag"]


@pytest.mark.parametrize(
    ("transport", "relayed_to"), [("postgres", "the PostgreSQL log"), ("kafka", "Kafka")]
)
def test_the_chart_says_where_rows_were_relayed(
    outbox_database_url: str, transport: str, relayed_to: str
) -> None:
    """It said "relayed to Kafka" on the log transport."""
    with console(outbox_database_url, transport=settings_of(transport)) as app:
        client = Client(app)
        wait_for(
            lambda: "<svg" in client.get_json("/api/view?db=orders")[1]["chart"],
            30,
            "two samples of the throughput",
        )
        chart = client.get_json("/api/view?db=orders")[1]["chart"]
    assert f"relayed to {relayed_to}:" in chart
    assert ("Kafka" in chart) == (transport == "kafka")


def test_the_console_command_takes_the_daemons_transport_flags() -> None:
    from outbox.cli.command import build_parser

    args = build_parser().parse_args(
        ["console", "--transport", "postgres", "--log-url", "postgresql://u@h/log",
         "--log-schema", "my_log", "--database-url", "postgresql://u@h/a"]
    )  # fmt: skip
    assert (args.transport, args.log_url, args.log_schema) == (
        "postgres",
        "postgresql://u@h/log",
        "my_log",
    )


def test_an_answer_larger_than_the_bound_is_refused_not_sent(
    outbox_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.console import server

    with console(outbox_database_url) as app:
        client = Client(app)
        client.open_page()
        monkeypatch.setattr(server, "MAX_RESPONSE_BYTES", 200)
        status, headers, body = client.request("/api/status?db=orders")
        assert status == 500 and len(body) < 200 and b"larger than" in body, body
        assert int(headers["Content-Length"]) == len(body)
