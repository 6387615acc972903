"""A Node client of `outbox serve` (Node's built-in fetch, tests/http/seed.mjs): the seed
designs' four behaviours over HTTP, with the Producer relaying into the log between phases."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from outbox.pglog import PgLog

from .relay_helpers import spawn_producer, wait_for
from .serve_support import Server, serving

SEED = Path(__file__).resolve().parents[1] / "http" / "seed.mjs"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs node")


def node(server: Server, phase: str) -> Any:
    done = subprocess.run(
        ["node", str(SEED), server.url, phase], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{phase}: {done.stderr}"
    return json.loads(done.stdout)


def test_the_four_seed_behaviours_from_node(outbox_database_url: str, outbox_log_url: str) -> None:
    log = PgLog(outbox_log_url)
    with (
        serving(outbox_database_url, outbox_log_url) as server,
        spawn_producer(outbox_database_url, outbox_log_url),
    ):
        published = node(server, "publish")["message_ids"]
        wait_for(lambda: log.count("posts") == 3, 60, "the three posts in the log")
        read = node(server, "read")
        assert read["message_ids"] == published
        assert read["alice_left_after_one"] == 2
        assert read["subscriptions"] == [{"name": "alice", "lag": 0}, {"name": "bob", "lag": 3}]
        assert log.apply_retention(0.001) == 0  # bob has read none of them
        assert node(server, "catch_up") == {"bob_lag": 0}
        assert log.apply_retention(0.001) == 3  # read by every subscriber: deleted
        assert node(server, "leave") == {"records_after_retention": 0}
        wait_for(lambda: log.count("posts") == 1, 60, "the fourth post in the log")
        assert node(server, "rejoin") == {"alice_lag": 0, "alice_next": 204, "bob_next": ["four"]}
