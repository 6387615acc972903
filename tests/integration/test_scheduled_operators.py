"""What operators see of the messages due later (decision 21): `outbox status` (text and JSON)
and the console count them per topic with the next due time and the overdue ones; the
Producer's metrics export how many wait and how many are overdue."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import psycopg

from outbox import Broker, Message
from outbox.console import render
from outbox.observability.runtime import ObservabilityConfig
from outbox.postgres import operations as ops

from .relay_helpers import producer_thread, wait_for
from .test_observability import FAST, _port, scrape, value

broker = Broker()


def _schedule(url: str) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        broker.send_many(
            conn,
            [
                Message("reminders", {"n": 1}, delay=timedelta(hours=1)),
                Message("reminders", {"n": 2}, delay=timedelta(hours=2)),
                Message("timeouts", {"n": 3}, delay=timedelta(minutes=10)),
                Message("now", {"n": 4}),
            ],
        )
        # Due an hour ago and still here: what a database without a running relay shows.
        conn.execute(
            "INSERT INTO outbox.producer_scheduled (message_id, topic, payload, content_type, "
            "lane, deliver_at) VALUES (gen_random_uuid(), 'timeouts', '\\x7b7d', "
            "'application/json', 1, now() - interval '1 hour')"
        )


def _status(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", "status", "--database-url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_counts_the_scheduled_per_topic_with_the_next_due_time(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    empty = _status(url)
    assert empty.returncode == 0, empty.stderr
    assert "producer_scheduled: none due later" in empty.stdout
    _schedule(url)
    doc = json.loads(_status(url, "--json").stdout)
    scheduled = doc["scheduled"]
    assert scheduled["rows"] == 4 and scheduled["overdue"] == 1
    assert set(scheduled["topics"]) == {"reminders", "timeouts"}
    reminders, timeouts = scheduled["topics"]["reminders"], scheduled["topics"]["timeouts"]
    assert reminders["rows"] == 2 and reminders["overdue"] == 0
    assert 3500 < reminders["next_due_in_seconds"] <= 3600
    assert timeouts["rows"] == 2 and timeouts["overdue"] == 1
    assert -3700 < timeouts["next_due_in_seconds"] < -3500
    assert scheduled["next_due_at"] == timeouts["next_due_at"]
    # The message due now is in producer_queue, not here.
    assert doc["queues"]["producer"]["totals"]["pending"]["count"] == 1

    text = _status(url).stdout
    assert "producer_scheduled: 4 due later" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("timeouts"))
    assert line.split()[1:3] == ["2", "1"] and "overdue" in line, text
    line = next(line for line in text.splitlines() if line.strip().startswith("reminders"))
    assert line.split()[1:3] == ["2", "-"] and "in 59m" in line, text


def test_the_console_shows_the_scheduled_per_topic(outbox_database_url: str) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn:
        assert "None due later" in render.queues(ops.status(conn, "outbox"))
    _schedule(url)
    with psycopg.connect(url) as conn:
        html = render.queues(ops.status(conn, "outbox"))
    assert "producer_scheduled" in html
    assert "<td>reminders</td>" in html and "<td>timeouts</td>" in html
    assert "overdue</span>" in html  # the one due an hour ago


def test_scheduled_and_overdue_messages_are_gauges(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn, conn.transaction():
        broker.send_many(
            conn, [Message("reminders", {"n": n}, delay=timedelta(hours=1)) for n in range(3)]
        )
    observe = ObservabilityConfig(**FAST)  # type: ignore[arg-type]
    with producer_thread(url, outbox_kafka_bootstrap, observability=observe) as p:
        port = _port(p, "metrics_port")
        wait_for(
            lambda: value(scrape(port), "outbox_scheduled_messages") == 3,
            10,
            "the scheduled gauge to count producer_scheduled",
        )
        samples = scrape(port)
        assert value(samples, "outbox_scheduled_overdue_messages") == 0
        assert value(samples, "outbox_scheduled_overdue_seconds") == 0
