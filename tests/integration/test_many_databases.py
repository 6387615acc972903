"""Operating many databases (a database per tenant): `outbox status`, `outbox migrate` and
`outbox console` over several databases, one of them unmigrated, one dropped, one that never
answers; the single-database operator commands refuse several.

The commands run as the real CLI in a subprocess (the console also in-process, as the other
console tests do).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox.console import ConsoleConfig, Database, serve
from outbox.postgres import migrate
from outbox.testing.servers import drop_database
from tests.integration.relay_helpers import wait_for
from tests.integration.test_console import Client, _spawn_console
from tests.integration.test_operations import CLI, _cli, insert

DatabaseFactory = Callable[..., str]


def _dropped(factory: DatabaseFactory, admin_url: str) -> str:
    """The URL of a database that existed and was dropped."""
    url = factory()
    drop_database(admin_url, url.rsplit("/", 1)[1].split("?")[0])
    return url


@contextmanager
def _silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung database): its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


@pytest.fixture
def tenants(outbox_database_factory: DatabaseFactory, outbox_admin_url: str) -> dict[str, str]:
    """Four tenant databases: `a` with a dead row, `b` clean, `c` never migrated, `d` dropped."""
    found = {
        "a": outbox_database_factory(),
        "b": outbox_database_factory(),
        "c": outbox_database_factory(migrated=False),
        "d": _dropped(outbox_database_factory, outbox_admin_url),
    }
    insert(found["a"], "consumer", "dead", topic="payments")
    return found


def test_status_lists_each_database_and_check_names_those_at_fault(
    tenants: dict[str, str], tmp_path: Path
) -> None:
    file = tmp_path / "tenants.txt"
    file.write_text(f"# the rest of the tenants\nc={tenants['c']}\n\nd={tenants['d']}\n")
    args = ["status", "--database-url", f"a={tenants['a']}", "--database-url", f"b={tenants['b']}"]
    args += ["--databases-file", str(file)]

    text = _cli(*args)
    # Each database under its name; those that cannot be read say why, the others are shown.
    lines = text.stdout.splitlines()
    headers = [line for line in lines if line.startswith("database ")]
    assert [h.split()[1] for h in headers] == ["a", "b", "c", "d"], text.stdout
    assert headers[0].endswith(", schema outbox):") and headers[1].endswith(":")
    assert "run `outbox migrate" in headers[2]
    assert "does not exist" in headers[3]
    assert "  consumer_queue: 1 row" in text.stdout and "payments" in text.stdout
    # Without --check the command still fails, in one line naming them.
    assert text.returncode == 1
    assert text.stderr.strip().splitlines() == [
        "outbox: error: status could not read 2 of 4 databases: c, d (each one's reason is "
        "printed above)"
    ]

    check = _cli(*args, "--check")
    assert check.returncode == 3, check.stderr
    problems = check.stdout.split("check: FAILED (3)\n", 1)[1].splitlines()
    assert problems[0] == "  database a: consumer_queue: 1 dead in topic payments"
    assert problems[1].startswith("  database c: cannot read its status: database has no outbox")
    assert problems[2].startswith("  database d: cannot read its status: cannot connect")
    assert "database b" not in check.stdout.split("check:", 1)[1]

    doc = json.loads(_cli(*args, "--check", "--json").stdout)
    assert doc["format_version"] == 1
    assert [d["name"] for d in doc["databases"]] == ["a", "b", "c", "d"]
    a, b, c, d = doc["databases"]
    assert a["error"] is None and a["queues"]["consumer"]["totals"]["dead"]["count"] == 1
    assert b["error"] is None and b["schema"] == "outbox" and b["processes"] == []
    assert "queues" not in c and "outbox migrate" in c["error"]
    assert "queues" not in d and "does not exist" in d["error"]
    assert doc["check"]["ok"] is False and len(doc["check"]["problems"]) == 3

    # Once the faults are gone the check passes.
    migrate.upgrade(tenants["c"])
    file.write_text(f"c={tenants['c']}\n")
    with psycopg.connect(tenants["a"], autocommit=True) as conn:
        conn.execute("DELETE FROM outbox.consumer_queue")
    fixed = _cli(*args, "--check")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.rstrip().endswith("check: ok")


def test_a_database_that_never_answers_is_shown_as_such_without_holding_the_others(
    outbox_database_url: str,
) -> None:
    with _silent_server() as port:
        hung = f"hung=postgresql://postgres@127.0.0.1:{port}/tenant"
        result = _cli(
            "status", "--database-url", hung, "--database-url", f"fine={outbox_database_url}",
            "--database-timeout", "5", "--json",
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    hung_doc, fine = json.loads(result.stdout)["databases"]
    assert hung_doc["name"] == "hung" and "queues" not in hung_doc
    assert "timeout" in hung_doc["error"] or "no answer within 5 s" in hung_doc["error"]
    assert fine["error"] is None and "queues" in fine
    assert "could not read 1 of 2 databases: hung" in result.stderr


def test_migrate_migrates_each_database_and_names_those_that_failed(
    outbox_database_factory: DatabaseFactory, outbox_admin_url: str, tmp_path: Path
) -> None:
    first = outbox_database_factory(migrated=False)
    gone = _dropped(outbox_database_factory, outbox_admin_url)
    last = outbox_database_factory(migrated=False)
    head = migrate.head_revision()
    result = _cli(
        "migrate", "--database-url", f"first={first}", "--database-url", f"gone={gone}",
        "--database-url", f"last/billing={last}",
    )  # fmt: skip
    # Stop-at-first is not the rule: the one after the failing one is migrated too.
    lines = result.stdout.splitlines()
    assert lines[0] == f"database first: outbox schema 'outbox' created at revision {head}"
    assert lines[1].startswith("database gone: failed: cannot connect to PostgreSQL")
    assert lines[2] == f"database last: outbox schema 'billing' created at revision {head}"
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "outbox: error: migrate failed for 1 of 3 databases: gone (each one's reason is "
        "printed above; the others are migrated)"
    ]
    for url, schema in ((first, "outbox"), (last, "billing")):
        with psycopg.connect(url) as conn:
            migrate.check_schema(conn, schema)

    file = tmp_path / "tenants.txt"
    file.write_text(f"first={first}\nlast/billing={last}\n")
    again = _cli("migrate", "--databases-file", str(file))
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"database first: outbox schema 'outbox' is already at revision {head} (nothing to do)",
        f"database last: outbox schema 'billing' is already at revision {head} (nothing to do)",
    ]


def test_the_single_database_commands_take_one_database_given_as_a_tenant_entry(
    outbox_database_url: str,
) -> None:
    insert(outbox_database_url, "consumer", "dead", topic="payments")
    twice = _cli(
        "dead-letters", "list", "--database-url", f"a={outbox_database_url}",
        "--database-url", f"b={outbox_database_url}",
    )  # fmt: skip
    assert twice.returncode == 2
    [line] = twice.stderr.strip().splitlines()
    assert "--database-url is given more than once: this command serves one database" in line
    named = _cli("dead-letters", "list", "--database-url", f"a/outbox={outbox_database_url}")
    assert named.returncode == 0, named.stderr
    assert "consumer_queue: 1 dead row" in named.stdout
    elsewhere = _cli("dead-letters", "list", "--database-url", f"a/other={outbox_database_url}")
    assert elsewhere.returncode == 1 and "no outbox schema 'other'" in elsewhere.stderr
    file = _cli("dead-letters", "list", "--databases-file", "tenants.txt")
    assert file.returncode == 2 and "unrecognized arguments: --databases-file" in file.stderr


def test_the_console_lists_the_databases_marks_unreadable_ones_and_rereads_its_file(
    tenants: dict[str, str], outbox_database_factory: DatabaseFactory, tmp_path: Path
) -> None:
    file = tmp_path / "tenants.txt"
    file.write_text(f"b={tenants['b']}\nc={tenants['c']}\nd={tenants['d']}\n")
    config = ConsoleConfig(
        databases=(Database("a", tenants["a"]),),
        databases_file=str(file),
        port=0,
        sample_interval=0.05,
    )
    app = serve(config)
    try:
        client = Client(app)

        def states() -> dict[str, Any]:
            status, doc = client.get_json("/api/databases?db=a")
            assert status == 200, doc
            return {d["name"]: d for d in doc["databases"]}

        wait_for(lambda: None not in [d["ok"] for d in states().values()], 30, "a first sample")
        shown = states()
        assert list(shown) == ["a", "b", "c", "d"]
        assert shown["a"]["ok"] and shown["b"]["ok"]
        assert shown["c"]["ok"] is False and "outbox" in shown["c"]["error"]
        assert shown["d"]["ok"] is False and "does not exist" in shown["d"]["error"]
        page = client.open_page()
        assert page.count('class="db') == 4 and page.count("(cannot read)") == 2
        # The page of an unreadable database still loads; its view says why.
        assert client.request("/?db=d")[0] == 200
        status, view = client.get_json("/api/view?db=d")
        assert status == 503 and "(d)" in view["error"]
        assert client.get_json("/api/view?db=b")[0] == 200

        added = outbox_database_factory()
        file.write_text(f"b={tenants['b']}\nadded={added}\n")
        wait_for(lambda: list(states()) == ["a", "b", "added"], 30, "the file read again")
        assert client.get_json("/api/view?db=added")[0] == 200
        assert client.get_json("/api/view?db=d")[0] == 404
        file.write_text("-b=postgresql://u@h/b\n")  # a bad file keeps the databases shown
        wait_for(
            lambda: client.get_json("/api/databases")[1]["databases_file_error"], 30, "the error"
        )
        assert list(states()) == ["a", "b", "added"]
    finally:
        app.close()


def test_the_console_command_takes_a_databases_file(
    outbox_database_url: str, tmp_path: Path
) -> None:
    file = tmp_path / "tenants.txt"
    file.write_text(f"second={outbox_database_url}\n")
    process, base = _spawn_console(
        "--database-url", f"first/outbox={outbox_database_url}", "--databases-file", str(file),
        "--schema", "nothing_here",
    )  # fmt: skip
    try:
        with urllib.request.urlopen(base + "/api/databases", timeout=30) as response:
            doc = json.loads(response.read())
        assert [(d["name"], d["schema"]) for d in doc["databases"]] == [
            ("first", "outbox"),
            ("second", "nothing_here"),
        ]
    finally:
        process.terminate()
        process.wait(30)
        assert process.stdout is not None
        process.stdout.close()
    bad = subprocess.run(
        [*CLI, "console", "--databases-file", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("outbox: error: cannot read the databases file")
