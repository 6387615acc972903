"""`outbox run`'s one health port answers for the three components: /livez fails when any
loop is stuck, /readyz when any is not ready, each reason named by its component."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from outbox.observability.health import HealthState, Heartbeat
from outbox.runtime.process import _AllHealthy


def component(running: bool = True, stuck: bool = False) -> Any:
    heartbeat = Heartbeat()
    if stuck:
        heartbeat.last -= 1000
    state = HealthState(heartbeat=heartbeat, liveness_timeout=120, check_expiry=60)
    state.running = running
    state.record({"postgres": None})
    return SimpleNamespace(observability=SimpleNamespace(health=state))


def test_ready_and_live_when_every_component_is() -> None:
    health = _AllHealthy({"consumer": component(), "producer": component()})
    assert health.live() == (True, "ok")
    assert health.ready() == (True, "ok")


def test_one_stuck_loop_fails_livez_and_says_which() -> None:
    health = _AllHealthy({"consumer": component(), "handler": component(stuck=True)})
    alive, reason = health.live()
    assert not alive
    assert reason.startswith("handler: main loop made no progress")


def test_one_component_not_ready_fails_readyz_and_says_which() -> None:
    health = _AllHealthy({"consumer": component(running=False), "producer": component()})
    assert health.ready() == (False, "consumer: starting")
    assert health.live() == (True, "ok")
