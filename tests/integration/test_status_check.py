"""`outbox status`: --check (exit 3) and --max-age, the lag of consumer groups, and the pids."""

from __future__ import annotations

import json

from tests.integration.relay_helpers import consumer_thread, count, wait_for
from tests.integration.test_lag import produce_one_by_one
from tests.integration.test_operations import _cli, insert


def test_check_fails_with_exit_3_on_dead_rows_and_rows_older_than_max_age(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    clean = _cli("status", "--database-url", url, "--check")
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.rstrip().endswith("check: ok")

    insert(url, "producer", "pending", topic="orders", age=600)
    young = _cli("status", "--database-url", url, "--check", "--max-age", "900")
    assert young.returncode == 0, young.stdout
    old = _cli("status", "--database-url", url, "--check", "--max-age", "300")
    assert old.returncode == 3, old.stdout
    assert "producer_queue: pending row of topic orders waiting 10m00s (> 300 s)" in old.stdout

    insert(url, "consumer", "dead", topic="payments")
    dead = _cli("status", "--database-url", url, "--check", "--json")
    assert dead.returncode == 3
    doc = json.loads(dead.stdout)
    assert doc["check"]["ok"] is False
    assert doc["check"]["problems"] == ["consumer_queue: 1 dead in topic payments"]
    assert _cli("status", "--database-url", url).returncode == 0, "no --check: always 0"


def test_status_shows_the_lag_of_groups_in_text_and_json(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url, bootstrap = outbox_database_url, outbox_kafka_bootstrap
    group = f"g-{outbox_topic}"
    produce_one_by_one(bootstrap, outbox_topic, 4)
    with consumer_thread(url, bootstrap, [outbox_topic], group=group):
        wait_for(lambda: count(url, "consumer_queue") == 4, 60, "the consumer to store 4")
    produce_one_by_one(bootstrap, outbox_topic, 3, start=4)
    args = ["status", "--database-url", url, "--kafka-bootstrap", bootstrap, "--group", group]
    text = _cli(*args)
    assert text.returncode == 0, text.stderr
    assert f"consumer group {group}: lag 3" in text.stdout
    assert "COMMITTED" in text.stdout and "END" in text.stdout
    doc = json.loads(_cli(*args, "--json").stdout)
    [lag] = doc["lag"]
    assert lag["group"] == group and lag["total"] == 3 and lag["topics"] == {outbox_topic: 3}


def test_the_process_table_names_the_daemons_pid_and_the_backends_pid(
    outbox_database_url: str,
) -> None:
    import psycopg

    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.relay_state (relay_id, queue, backend_pid, sleeping) "
            "VALUES ('web-1:4242:ab12cd34', 'handler', pg_backend_pid(), false)"
        )
        text = _cli("status", "--database-url", outbox_database_url)
        doc = json.loads(_cli("status", "--database-url", outbox_database_url, "--json").stdout)
    header = next(line for line in text.stdout.splitlines() if "BACKEND PID" in line)
    assert header.split()[:4] == ["ID", "HOST", "PID", "QUEUE"]
    row = next(line for line in text.stdout.splitlines() if "web-1:4242" in line)
    assert row.split()[1:3] == ["web-1", "4242"]
    [process] = doc["processes"]
    assert process["host"] == "web-1" and process["pid"] == 4242
    assert isinstance(process["backend_pid"], int) and process["backend_pid"] != 4242
