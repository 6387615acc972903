"""A daemon's batches summed into one INFO line per interval (`--log-interval`)."""

from __future__ import annotations

import logging
import time

import pytest

from outbox.observability.logs import BatchSummary


def test_many_databases_batches_make_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "outbox.test")
    summary = BatchSummary(logging.getLogger("outbox.test"), "producer", interval=0.3)
    for n in range(200):
        summary.add(3, {"orders": 2}, {"failed": {"orders": 1}, "dead": {}}, database=f"tenant{n}")
    assert caplog.records == []  # nothing before the interval ends
    deadline = time.monotonic() + 10
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.02)
    (line,) = caplog.records
    assert line.getMessage().startswith("relayed 400 of 600 messages in 200 batches over ")
    assert "(orders=400); failed orders=200; 200 databases (" in line.getMessage()
    assert "dead" not in line.getMessage()
    assert vars(line)["event"] == "producer.summary"
    assert vars(line)["relayed"] == {"orders": 400} and vars(line)["batches"] == 200
    assert len(vars(line)["databases"]) == 200
    assert line.getMessage().endswith(", and 195 more databases)")
    summary.add(1, {"orders": 1})  # a new interval starts with the next batch
    summary.flush()  # and what is left is said at stop, at once
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage().startswith("relayed 1 of 1 messages in 1 batches")
    summary.flush()
    assert len(caplog.records) == 2  # nothing left, nothing said
