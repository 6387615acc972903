"""docs/http.md's curl examples, run as written (the address swapped for the test server's)
against `outbox serve` on the log, with the Producer relaying: each answers JSON without an
error, and `next` hands out the messages published before it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .relay_helpers import spawn_producer
from .serve_support import serving

PAGE = Path(__file__).resolve().parents[2] / "docs" / "http.md"
ADDRESS = "127.0.0.1:8480"


def examples() -> list[str]:
    """The curl lines of the page's "Try it" section, in order."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("## Try it\n")
    section = text[start : text.index("\n## ", start + 1)]
    [block] = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    return [line for line in block.splitlines() if line.startswith("curl ")]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_curl_examples_run_as_written(outbox_database_url: str, outbox_log_url: str) -> None:
    lines = examples()
    assert len(lines) >= 6
    answers = []
    with (
        serving(outbox_database_url, outbox_log_url) as server,
        spawn_producer(outbox_database_url, outbox_log_url),
    ):
        for line in lines:
            command = line.replace(ADDRESS, f"127.0.0.1:{server.port}")
            done = subprocess.run(
                ["bash", "-c", command + " -w '\\n%{http_code}'"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, (line, done.stderr)
            body, _, status = done.stdout.rpartition("\n")
            assert int(status) < 300, (line, body)
            answers.append(json.loads(body) if body.strip() else None)
    by_line = dict(zip(lines, answers, strict=True))
    [next_answer] = [a for line, a in by_line.items() if "/next" in line]
    assert [r["key"] for r in next_answer["records"]] != []
    assert sorted(r["payload"]["order_id"] for r in next_answer["records"]) == ["o-1", "o-2", "o-3"]
    assert "0193a0c4-0000-7000-8000-000000000001" in [
        r["message_id"] for r in next_answer["records"]
    ]
