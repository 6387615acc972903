"""`outbox status`: --check (exit 3) and --max-age, the lag of consumer groups, and the pids."""

from __future__ import annotations

import json
import os
import re
import subprocess

from tests.integration.relay_helpers import consumer_thread, count, wait_for
from tests.integration.test_lag import produce_one_by_one
from tests.integration.test_operations import CLI, _cli, insert


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
    # 10m00s, or a second or two more on a busy machine (the CLI runs after the insert)
    waiting = r"producer_queue: pending row of topic orders waiting 10m0\ds \(> 300 s\)"
    assert re.search(waiting, old.stdout), old.stdout

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


def test_check_fails_with_exit_3_when_a_group_lags_more_than_max_lag(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url, bootstrap = outbox_database_url, outbox_kafka_bootstrap
    group = f"g-{outbox_topic}"
    produce_one_by_one(bootstrap, outbox_topic, 4)  # k0..k3: every partition (committed)
    with consumer_thread(url, bootstrap, [outbox_topic], group=group):
        wait_for(lambda: count(url, "consumer_queue") == 4, 60, "the consumer to store 4")
    produce_one_by_one(bootstrap, outbox_topic, 3, start=4)  # lag 3
    args = ["status", "--database-url", url, "--kafka-bootstrap", bootstrap, "--group", group]
    within = _cli(*args, "--check", "--max-lag", "3")
    assert within.returncode == 0, within.stdout + within.stderr
    above = _cli(*args, "--check", "--max-lag", "2")
    assert above.returncode == 3, above.stdout + above.stderr
    assert f"consumer group {group}: lag 3 (> 2)" in above.stdout
    doc = json.loads(_cli(*args, "--check", "--json", "--max-lag", "0").stdout)
    assert doc["check"]["max_lag"] == 0
    assert doc["check"]["problems"] == [f"consumer group {group}: lag 3 (> 0)"]
    assert _cli(*args, "--max-lag", "0").returncode == 0, "no --check: always 0"

    from_env = subprocess.run(
        [*CLI, *args, "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUTBOX_STATUS_MAX_LAG": "1"},
    )
    assert from_env.returncode == 3, from_env.stdout + from_env.stderr

    no_kafka = _cli("status", "--database-url", url, "--check", "--max-lag", "5")
    assert no_kafka.returncode == 1
    assert "--max-lag needs --kafka-bootstrap" in no_kafka.stderr
    bad = _cli(*args, "--check", "--max-lag", "-1")
    assert bad.returncode == 2 and "--max-lag" in bad.stderr


def test_check_fails_when_the_lag_of_a_named_group_or_of_every_group_cannot_be_read(
    outbox_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    """A deploy gate must not pass on what it could not read: a misspelt --group (no
    committed offset anywhere) and an unreachable cluster were "lag 0" and "no group"."""
    from outbox.testing.servers import free_port

    url = outbox_database_url
    base = ["status", "--database-url", url, "--check", "--max-lag", "10"]
    typo = _cli(*base, "--kafka-bootstrap", outbox_kafka_bootstrap, "--group", "shiping")
    assert typo.returncode == 3, typo.stdout + typo.stderr
    assert "consumer group shiping: cannot read its lag: no committed offsets" in typo.stdout
    unreachable = _cli(
        *base,
        "--kafka-bootstrap",
        f"127.0.0.1:{free_port()}",
        "--kafka-config",
        "socket.connection.setup.timeout.ms=1000",
        "--json",
    )
    assert unreachable.returncode == 3, unreachable.stdout + unreachable.stderr
    doc = json.loads(unreachable.stdout)
    assert doc["check"]["ok"] is False
    [every] = doc["lag"]
    assert every["group"] == "(every group)" and "cannot list the groups" in every["error"]
    assert "%3|" not in unreachable.stderr, "librdkafka's own lines stay quiet"


def test_dead_rows_are_reported_where_they_are_and_max_dead_accepts_known_ones(
    outbox_database_url: str,
) -> None:
    # issue 24: a dead outbox row was reported in producer_queue; it sits in producer_dead
    url = outbox_database_url
    empty = _cli("dead-letters", "list", "--database-url", url, "--queue", "producer")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.strip() == "producer_dead: no dead rows"

    insert(url, "producer", "dead", topic="orders")
    insert(url, "consumer", "dead", topic="payments")
    insert(url, "consumer", "dead", topic="payments")
    listed = _cli("dead-letters", "list", "--database-url", url, "--queue", "producer")
    assert listed.stdout.splitlines()[0] == "producer_dead: 1 dead row"
    doc = json.loads(
        _cli("dead-letters", "list", "--database-url", url, "--queue", "producer", "--json").stdout
    )
    assert doc["table"] == "producer_dead"

    # By default every dead row fails the check, each named with the table that holds it.
    failed = json.loads(_cli("status", "--database-url", url, "--check", "--json").stdout)
    assert failed["check"]["max_dead"] == 0
    assert failed["check"]["problems"] == [
        "producer_dead: 1 dead in topic orders",
        "consumer_queue: 2 dead in topic payments",
    ]
    # --max-dead N accepts up to N dead rows per queue: the known ones pass, one more fails.
    accepted = _cli("status", "--database-url", url, "--check", "--max-dead", "2")
    assert accepted.returncode == 0, accepted.stdout
    one_short = _cli("status", "--database-url", url, "--check", "--max-dead", "1", "--json")
    assert one_short.returncode == 3
    assert json.loads(one_short.stdout)["check"]["problems"] == [
        "consumer_queue: 2 dead rows (> --max-dead 1)",
        "consumer_queue: 2 dead in topic payments",
    ]
    bad = _cli("status", "--database-url", url, "--check", "--max-dead", "-1")
    assert bad.returncode == 2, bad.stderr

    # A row not found is looked for in both tables of the outbox; requeue acts on producer_dead.
    show = _cli("dead-letters", "show", "--database-url", url, "--queue", "producer", "424242")
    assert show.returncode == 1
    assert show.stderr.strip() == (
        "outbox: error: neither producer_queue nor producer_dead has row 424242"
    )
    [pending] = [insert(url, "producer", "pending", topic="orders")[0]]
    requeue = _cli(
        "dead-letters", "requeue", "--database-url", url, "--queue", "producer", str(pending)
    )
    assert requeue.returncode == 1
    assert requeue.stderr.strip() == (
        f"outbox: error: cannot requeue in producer_dead: row {pending} is pending, not dead; "
        "nothing was requeued"
    )
