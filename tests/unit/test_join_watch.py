"""`JoinWatch`: a consumer joining its group says what it waits for, and is never silent long."""

from __future__ import annotations

import logging

import pytest

from outbox.kafka.start import SESSION_TIMEOUT_MS, JoinWatch


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_join_is_announced_then_reported_every_few_seconds_until_assigned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    clock = Clock()
    watch = JoinWatch({"group.id": "shipping", "session.timeout.ms": "12000"}, clock)
    watch.begin()
    for _ in range(130):  # 13 s of polls, 0.1 s apart
        clock.now += 0.1
        watch.waiting()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("joining consumer group shipping (waiting for its partition")
    assert "12000 ms" in messages[0]
    still = [m for m in messages if m.startswith("still joining consumer group shipping after")]
    assert [m.split(" after ")[1].split(" s:")[0] for m in still] == ["5", "10"]
    assert watch.assigned() == pytest.approx(13.0)
    assert watch.assigned() is None  # only the first assignment is the join
    caplog.clear()
    clock.now += 20
    watch.waiting()
    assert not caplog.records, "nothing once assigned"


def test_the_session_timeout_is_librdkafka_s_default_when_not_set() -> None:
    watch = JoinWatch({"group.id": "g"})
    assert watch.session_timeout_ms == SESSION_TIMEOUT_MS == 45000
    assert watch.assigned() is None  # before `begin`: no join to time
