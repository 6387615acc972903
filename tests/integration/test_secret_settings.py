"""No secret reaches an operator's screen: every secret-bearing librdkafka setting, and a database
URL libpq cannot parse, through the public commands only.

The librdkafka settings are walked from the installed library (`tests.librdkafka_properties`),
half given by `OUTBOX_KAFKA_CONFIG_*` variables and half by `--kafka-config-file`; each value is
unique, so any appearance of one in a daemon's output, `/readyz`, `outbox status` (text and
JSON) or `outbox migrate` is a leak. On the broker's plaintext listener librdkafka ignores the
SASL and SSL settings, so the daemons run for real with all of them set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from outbox.kafka.sources import variable_of_key
from tests.librdkafka_properties import properties
from tests.unit.test_kafka_secrets import HOLDS_NO_SECRET, secret_bearing

from .relay_helpers import Daemon, wait_for

APP = "tests.integration.inbox_app:handlers"


def secret_settings() -> dict[str, str]:
    """Every secret-bearing string setting of the installed librdkafka, each a unique value."""
    return {
        prop.name: f"S3cr3t-{index:03d}-{prop.name.replace('.', '-')}"
        for index, prop in enumerate(secret_bearing())
        if prop.name not in HOLDS_NO_SECRET
    }


def give(settings: dict[str, str], directory: Path) -> tuple[dict[str, str], Path]:
    """Half the settings as variables, half in a properties file."""
    env: dict[str, str] = {}
    lines = []
    for index, (key, value) in enumerate(sorted(settings.items())):
        if index % 2:
            lines.append(f"{key}={value}")
        else:
            env[variable_of_key(key)] = value
    path = directory / "kafka.properties"
    path.write_text("\n".join(lines) + "\n")
    return env, path


def leaks(text: str, secrets: dict[str, str]) -> list[str]:
    return [key for key, value in secrets.items() if value in text]


def outbox(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, str(answer.read().decode())
    except urllib.error.HTTPError as error:
        return error.code, str(error.read().decode())
    except OSError as error:
        return 0, str(error)


def test_the_walk_covers_the_settings_the_issue_found_in_clear() -> None:
    names = {prop.name for prop in properties()}
    found = secret_settings()
    for key in (
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
    ):
        assert key not in names or key in found


def test_no_secret_librdkafka_setting_is_shown_by_the_daemons_or_status(
    outbox_database_url: str, outbox_kafka_bootstrap: str, tmp_path: Path, free_tcp_port: int
) -> None:
    secrets = secret_settings()
    env, path = give(secrets, tmp_path)
    env["INBOX_APP_TOPIC"] = f"secrets-{os.getpid()}"
    port = free_tcp_port
    common = [
        "--database-url",
        outbox_database_url,
        "--kafka-bootstrap",
        outbox_kafka_bootstrap,
        "--kafka-config-file",
        str(path),
    ]
    with psycopg_schema(outbox_database_url):
        pass
    with Daemon(
        "run",
        APP,
        *common,
        "--group",
        f"g-secrets-{os.getpid()}",
        "--health-port",
        str(port),
        "--health-host",
        "127.0.0.1",
        "--kafka-config=session.timeout.ms=6000",
        env=env,
    ) as daemon:
        wait_for(lambda: "handler starting" in daemon.output(), 60, "the handler to start")
        wait_for(lambda: get(port, "/readyz")[0] == 200, 60, "/readyz to answer 200")
        answers = get(port, "/readyz")[1] + get(port, "/healthz")[1]
        daemon.terminate()
        assert daemon.wait(60) == 0
        output = daemon.output()
    assert "producer starting" in output and "consumer starting" in output
    status = outbox("status", *common, env=env)
    status_json = outbox("status", "--json", *common, env=env)
    json.loads(status_json.stdout)
    everything = "\n".join(
        [output, answers, status.stdout, status.stderr, status_json.stdout, status_json.stderr]
    )
    assert not leaks(everything, secrets)
    assert '"sasl.oauthbearer.assertion.private.key.passphrase":"***"' in output


class psycopg_schema:
    """Migrate the database (the daemons refuse an unmigrated one)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        import psycopg

        from . import inbox_app

        with psycopg.connect(self.url) as conn:
            conn.execute(inbox_app.SCHEMA)

    def __exit__(self, *exc: object) -> None:
        return None


BROKEN = [
    # A raw space in the password: libpq refuses the URL and its error quotes a piece of it.
    "postgresql://app:Hunter two secret@127.0.0.1:{port}/db",
    # A raw space and "@" and "/": the pieces libpq quotes are parts of the password.
    "postgresql://app:p@ss w/0rd-Hunter@127.0.0.1:{port}/db",
    # A space in a secret query parameter.
    "postgresql://127.0.0.1:{port}/db?user=app&password=Hunter two",
    # The keyword form with an unquoted space: libpq quotes the piece after it.
    "host=127.0.0.1 port={port} user=app password=Hunter two secret",
]


@pytest.mark.parametrize("template", BROKEN)
def test_a_url_libpq_cannot_parse_never_shows_its_password(
    template: str, outbox_database_url: str, tmp_path: Path, free_tcp_port_factory: Any
) -> None:
    url = template.format(port=1)
    good = outbox_database_url
    databases = tmp_path / "databases"
    databases.write_text(f"broken={url}\ngood={good}\n")
    outputs = [
        outbox("status", "--databases-file", str(databases), env={}),
        outbox("status", "--json", "--databases-file", str(databases), env={}),
        outbox("migrate", "--databases-file", str(databases), env={}),
        outbox("status", env={"OUTBOX_DATABASE_URL": url}),
        outbox("migrate", "--database-url", f"broken={url}", env={}),
    ]
    health, console_port = free_tcp_port_factory(), free_tcp_port_factory()
    handler = Daemon(
        "handler",
        APP,
        "--databases-file",
        str(databases),
        "--poll-interval",
        "0.2",
        "--health-port",
        str(health),
        "--health-host",
        "127.0.0.1",
    )
    console = Daemon("console", "--databases-file", str(databases), "--port", str(console_port))
    with handler, console:
        wait_for(lambda: "broken" in handler.output(), 30, "the handler to log the broken entry")
        wait_for(lambda: get(health, "/readyz")[0] in (200, 503), 30, "the handler's /readyz")
        wait_for(lambda: get(console_port, "/api/databases")[0] == 200, 30, "the console")
        answers = [
            get(health, "/readyz")[1],
            get(console_port, "/api/databases")[1],
            get(console_port, "/")[1],
        ]
        time.sleep(1)
        handler.terminate()
        handler.wait(60)
        outputs_of_daemons = [handler.output(), console.output()]
    assert any("broken" in answer for answer in answers)
    text = "\n".join([*outputs_of_daemons, *answers, *(o.stdout + o.stderr for o in outputs)])
    for piece in ("Hunter", "secret", "w/0rd", "two"):
        assert piece not in text, text
    # The operator still learns which entry is broken and where it points.
    assert "broken" in text and "127.0.0.1" in text
