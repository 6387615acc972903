"""The console in a real browser (Debian's Chromium driven by Playwright), end to end.

A service's messages travel producer relay -> Kafka -> consumer relay -> handler; one of them
fails in the handler until it is dead. The handler is then fixed (a row in `cured`), and an
operator opens the console, filters the dead letters, opens the dead one and requeues it with
the confirmation; the message is handled and leaves the dead letters.

Skipped, saying why, when Chromium (`apt-get install chromium`; `./run test` installs it as
root) or the `playwright` package is missing. Screenshots are taken every run; with
OUTBOX_UPDATE_SCREENSHOTS=1 they are also copied to docs/images/console-*.png.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import Broker, Message
from outbox.console import ConsoleConfig, Database, serve
from outbox.transports import settings_of
from tests.integration import inbox_app
from tests.integration.relay_helpers import (
    count,
    producer_thread,
    spawn_consumer,
    spawn_handler,
    wait_for,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Chromium is not installed (apt-get install chromium; `./run test` does it as "
        "root): the console's browser test needs it",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="the playwright package is not installed (pip install -e '.[dev]')",
    ),
]


@pytest.fixture
def browser_page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def _handled(url: str) -> int:
    return count(url, "consumer_processed")


def _dead(url: str) -> int:
    return count(url, "consumer_queue", "dead_at IS NOT NULL AND processed_at IS NULL")


def test_an_operator_requeues_a_dead_letter_in_the_console(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    browser_page: Any,
    tmp_path: Path,
) -> None:
    url, topic, page = outbox_database_url, outbox_topic, browser_page
    group = f"g-{topic}"
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)
    bodies: list[dict[str, Any]] = [{"n": i} for i in range(12)] + [{"poison": True, "sku": 42}]
    with psycopg.connect(url) as conn, conn.transaction():
        ids = Broker().send_many(
            conn, [Message(topic, body, key=f"k{i % 4}") for i, body in enumerate(bodies)]
        )
    poison_id = ids[-1]
    env = {"INBOX_APP_TOPIC": topic}
    # Started first, so that its throughput chart samples the messages travelling.
    config = ConsoleConfig(
        databases=(Database("orders", url),),
        port=0,
        refresh=1.0,
        sample_interval=1.0,
        transport=settings_of("kafka", kafka_bootstrap=outbox_kafka_bootstrap),
        groups=(group,),
    )
    with (
        closing(serve(config)) as console,
        producer_thread(url, outbox_kafka_bootstrap),
        spawn_consumer(url, outbox_kafka_bootstrap, topic, group) as consumer,
        spawn_handler(url, "tests.integration.inbox_app:handlers", env=env) as handler,
    ):
        wait_for(
            lambda: _handled(url) == 12 and _dead(url) == 1, 90, "12 handled and the poison dead"
        )
        with psycopg.connect(url) as conn:
            conn.execute("INSERT INTO cured VALUES (1)")  # the handler is fixed

        shots: list[Path] = []

        def shot(name: str) -> None:
            path = tmp_path / f"console-{name}.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)

        page.goto(console.url)
        page.wait_for_selector("#queues table.queue")
        page.wait_for_selector(f"#lag h3:has-text('{group}')")
        page.wait_for_selector("#processes table.processes")
        page.wait_for_selector("#chart svg", timeout=60_000)  # two samples
        processes = page.locator("#processes").inner_text()
        assert "handler" in processes and "producer" in processes  # relay_state's daemons
        assert str(handler.process.pid) in processes  # the daemon's own pid, from relay_id
        shot("overview")

        page.fill("#filter input[name=text]", "poison")
        page.click("#filter button[type=submit]")
        opener = page.locator("#dead button.open")
        opener.first.wait_for()
        assert opener.count() == 1
        page.locator("#dead-section, #dead").first.scroll_into_view_if_needed()
        shot("dead-letters")

        opener.first.click()
        page.wait_for_selector("#detail-title:has-text('dead')")
        detail = page.locator("#detail").inner_text()
        assert "ValueError: poison message" in detail
        assert str(poison_id) in detail and '{"poison":true,"sku":42}' in detail
        assert "bytes, UTF-8" in page.locator("#payload-size").inner_text()
        shot("dead-letter")

        page.click("#detail button[data-action=requeue]")
        page.wait_for_selector("dialog#confirm[open]")
        assert "requeue row" in page.locator("#confirm-text").inner_text()
        shot("confirm")
        page.click("#confirm-ok")

        page.wait_for_selector("#message:has-text('requeued 1 row of consumer_queue')")
        page.wait_for_selector("#detail .state:has-text('processed')")
        page.wait_for_selector("#dead-count:has-text('No dead rows')")
        shot("requeued")

        assert _handled(url) == 13 and _dead(url) == 0
        with psycopg.connect(url) as conn:
            effects = conn.execute(
                "SELECT count(*) FROM effects WHERE message_id = %s AND attempt = 1", (poison_id,)
            ).fetchone()
        assert effects is not None
        for daemon in (handler, consumer):
            daemon.signal(15)
            assert daemon.wait(30) == 0, daemon.output()

    if os.environ.get("OUTBOX_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        for path in shots:
            shutil.copyfile(path, DOCS_IMAGES / path.name)


def test_the_dead_letters_are_paged_in_the_browser(
    outbox_database_url: str, browser_page: Any
) -> None:
    from outbox.console.reads import PAGE_ROWS
    from tests.integration.test_operations import insert

    url, page = outbox_database_url, browser_page
    ids = [insert(url, "consumer", "dead", error=f"KeyError: {n}")[0] for n in range(60)]
    config = ConsoleConfig(databases=(Database("orders", url),), port=0, refresh=0.5)
    with closing(serve(config)) as console:
        page.goto(console.url)
        page.wait_for_selector("#dead-more")
        assert page.locator("#dead button.open").count() == PAGE_ROWS
        page.click("#dead-more")
        page.wait_for_selector(f"#dead-count:has-text('ids {ids[PAGE_ROWS]} to {ids[-1]}')")
        assert page.locator("#dead button.open").count() == 60 - PAGE_ROWS
        assert page.locator("#dead-more").count() == 0
        page.wait_for_timeout(1500)  # three refreshes keep the page that is shown
        assert page.locator("#dead button.open").count() == 60 - PAGE_ROWS
        page.click("#dead button.page:has-text('first page')")
        page.wait_for_selector(f"#dead-count:has-text('ids {ids[0]} to {ids[PAGE_ROWS - 1]}')")


@pytest.mark.parametrize("width", [1280, 760])
def test_the_open_button_of_a_dead_letter_stays_on_one_line(
    outbox_database_url: str, browser_page: Any, width: int
) -> None:
    """Long errors, topics and keys squeeze the table: the button must not wrap ("op" / "en")."""
    from tests.integration.test_operations import insert

    url, page = outbox_database_url, browser_page
    page.set_viewport_size({"width": width, "height": 900})
    for n in range(3):
        insert(
            url,
            "consumer",
            "dead",
            topic="orders.created.v2." + "x" * 120,
            key=b"customer-" + b"k" * 200,
            error=f"ValueError: {n} " + "a-very-long-word-without-spaces" * 20,
        )
    config = ConsoleConfig(databases=(Database("orders", url),), port=0, refresh=5)
    with closing(serve(config)) as console:
        page.goto(console.url)
        page.locator("#dead button.open").first.wait_for()
        lines = page.eval_on_selector_all(
            "#dead button.open",
            """buttons => buttons.map(button => {
                const range = document.createRange();
                range.selectNodeContents(button);
                return range.getClientRects().length;
            })""",
        )
    assert lines == [1, 1, 1]


def test_the_asyncapi_page_in_a_browser_fetches_nothing_from_elsewhere(
    browser_page: Any, outbox_database_url: str
) -> None:
    """From the console's page to the AsyncAPI page by its link; every request the browser
    makes goes to the console, the page runs no script and reports no error."""
    app = serve(
        ConsoleConfig(
            databases=(Database("notes", outbox_database_url),),
            port=0,
            asyncapi="examples.fastapi_app.app",
        )
    )
    requested: list[str] = []
    errors: list[str] = []
    browser_page.on("request", lambda request: requested.append(request.url))
    browser_page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    browser_page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        browser_page.goto(app.url)
        browser_page.click("a[href='/asyncapi']")
        browser_page.wait_for_url(f"{app.url}asyncapi")
        headings = browser_page.locator("h2").all_inner_texts()
        assert any("notes.created" in h for h in headings), headings
        assert browser_page.locator("script").count() == 0
        browser_page.click("summary >> nth=0")  # a schema's JSON opens
        assert browser_page.locator("details[open] pre").first.inner_text().startswith("{")
    finally:
        app.close()
    foreign = [url for url in requested if not url.startswith(app.url)]
    assert requested and not foreign, foreign
    assert errors == [], errors
