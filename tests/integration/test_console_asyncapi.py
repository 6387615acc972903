"""`outbox console --asyncapi MODULE[:ATTRIBUTE]`: the service's AsyncAPI document as a page.

The page is plain HTML from the server (no script, nothing fetched from elsewhere: it works
offline), linked from the console's page, with the console's rules intact: loopback host names
or the auth token, the same Content-Security-Policy. Every text of the document is escaped:
descriptions, docstrings, schema titles, property names, enum values, class names.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

from outbox.console import Console, ConsoleConfig, Database
from outbox.core.errors import ConfigurationError
from tests.integration.test_console import Client, _raw_request, console

ROOT = Path(__file__).resolve().parents[2]

#: A service whose every text is hostile (topic names cannot be: Kafka's rules refuse them).
HOSTILE = textwrap.dedent(
    '''
    from typing import Literal

    import pydantic

    from outbox import Handlers, Topic

    EVIL = "<script>alert(1)</script>"


    class Evil(pydantic.BaseModel):
        """<img src=x onerror=alert(2)> & the model's docstring"""

        kind: Literal["<b>bold</b>", 'a "quote"']
        note: str = pydantic.Field(
            alias="<svg onload=alert(3)>",
            title="<i>t</i>",
            description="</td></tr></table><script>alert(4)</script>",
        )


    Renamed = pydantic.create_model("X<iframe src=//evil.example>", n=(int, ...))

    SENT = Topic("orders.evil", Evil, key="kind", description=EVIL + " sent")
    ALSO = Topic("x" * 249, Renamed, description="<a href='https://evil.example'>click</a>")
    RECEIVED = Topic("orders.received", None, description=EVIL + " received")
    handlers = Handlers()


    @handlers.handler(RECEIVED)
    def on_received(message, conn):
        """<script>alert(6)</script> & its docstring"""
    '''
)


@pytest.fixture
def hostile_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "hostile_console_svc.py").write_text(HOSTILE)
    (tmp_path / "nothing_console_svc.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hostile_console_svc"


class _Elements(HTMLParser):
    """The elements of a page as a browser parses them, and the URLs their attributes hold."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for name, value in attrs:
            if name in ("href", "src", "action", "data", "formaction", "srcset", "poster"):
                self.links.append(value or "")
            elif name == "id" and value:
                self.ids.add(value)
            assert not name.startswith("on"), f"an event handler attribute: {name}"


def test_the_page_shows_channels_messages_and_schemas_all_escaped(
    outbox_database_url: str, hostile_module: str
) -> None:
    with console(outbox_database_url, asyncapi=hostile_module) as app:
        client = Client(app)
        main = client.open_page()
        assert 'href="/asyncapi"' in main
        status, headers, body = client.request("/asyncapi")
        assert status == 200, body
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        page = body.decode()

        # Readable: what it sends and receives, each channel, message, payload, headers.
        sends = page.split("<h3>Sends</h3>")[1].split("<h3>Receives</h3>")[0]
        receives = page.split("<h3>Receives</h3>")[1].split("</section>")[0]
        assert "orders.evil" in sends and "x" * 249 in sends and "orders.received" not in sends
        assert "orders.received" in receives and "orders.evil" not in receives
        assert page.count('<section class="wide" id="channel-') == 3
        assert "outbox-message-id" in page and "Named schemas" in page
        assert "application/json" in page and "required" in page

        # Escaped, every text; no markup of the document's survives.
        lowered = page.lower()
        for raw in ("<script", "<img", "<svg", "<iframe", "<i>t</i>", "<b>bold</b>", "<a href='"):
            assert raw not in lowered, raw
        for escaped in (
            "&lt;script&gt;alert(1)&lt;/script&gt; sent",
            "&lt;script&gt;alert(1)&lt;/script&gt; received",
            "&lt;img src=x onerror=alert(2)&gt; &amp; the model&#x27;s docstring",
            "&lt;svg onload=alert(3)&gt;",
            "&lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;&lt;script&gt;alert(4)&lt;/script&gt;",
            "&lt;script&gt;alert(6)&lt;/script&gt; &amp; its docstring",
            "&lt;i&gt;t&lt;/i&gt;",
            "&quot;&lt;b&gt;bold&lt;/b&gt;&quot;",
        ):
            assert escaped in page, escaped

        # Offline: the console's own style sheet and the page's own anchors, nothing else;
        # only the page's own elements (as a browser parses it).
        elements = _Elements(page)
        links = elements.links
        assert links and all(link.startswith(("/", "#")) for link in links), links
        assert not [link for link in links if link.startswith("//")], links
        assert "/static/console.css" in links
        assert {link[1:] for link in links if link.startswith("#")} <= elements.ids
        assert not elements.tags & {"script", "img", "svg", "iframe", "i", "object", "embed"}

        status, headers, body = client.request("/asyncapi.json")
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert "<" not in body.decode()  # escaped as \u003c: inert even if sniffed as HTML
        assert app.asyncapi is not None and json.loads(body) == app.asyncapi.document
        assert set(json.loads(body)["operations"]) == {
            "send-orders.evil",
            f"send-{'x' * 249}",
            "receive-orders.received",
        }


def test_without_the_flag_there_is_no_page_and_no_link(outbox_database_url: str) -> None:
    with console(outbox_database_url) as app:
        client = Client(app)
        assert "/asyncapi" not in client.open_page()
        for path in ("/asyncapi", "/asyncapi.json"):
            status, body = client.get_json(path)
            assert status == 404 and "--asyncapi MODULE" in body["error"]


def test_the_page_keeps_the_consoles_rules(outbox_database_url: str, hostile_module: str) -> None:
    with console(outbox_database_url, asyncapi=hostile_module) as app:
        answer = _raw_request(
            app, b"GET /asyncapi HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 403"), answer[:100]
        status, _ = Client(app).post("/asyncapi", {"x": "1"})
        assert status == 404  # no POST route: nothing changes state here
    with console(
        outbox_database_url, asyncapi=hostile_module, auth_token="tok-a51", host="127.0.0.1"
    ) as app:
        for path in ("/asyncapi", "/asyncapi.json"):
            assert Client(app).request(path)[0] == 401
        basic = base64.b64encode(b"ops:tok-a51").decode()
        assert Client(app, {"Authorization": f"Basic {basic}"}).request("/asyncapi")[0] == 200


def test_a_service_that_cannot_be_described_stops_the_console_at_start(
    hostile_module: str,
) -> None:
    databases = (Database("orders", "postgresql://u@h/orders"),)
    for target, says in [
        ("nothing_console_svc", "has no outbox.Topic and no outbox.Handlers"),
        ("no_such_module_console", "cannot import 'no_such_module_console'"),
        (f"{hostile_module}:EVIL", "is a str, not an outbox.Handlers registry"),
    ]:
        with pytest.raises(ConfigurationError, match=re.escape(says)):
            Console(ConsoleConfig(databases=databases, port=0, asyncapi=target))


def test_the_command_takes_the_flag_and_its_variable(tmp_path: Path) -> None:
    (tmp_path / "nothing_console_cli.py").write_text("VALUE = 1\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
    }
    for extra, more in [
        (["--asyncapi", "nothing_console_cli"], {}),
        ([], {"OUTBOX_CONSOLE_ASYNCAPI": "nothing_console_cli"}),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "outbox.cli", "console", "--database-url",
             "postgresql://u@h/a", "--port", "0", *extra],
            capture_output=True, text=True, timeout=60, env={**env, **more}, cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "'nothing_console_cli' has no outbox.Topic" in result.stderr
