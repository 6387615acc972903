"""The latency benchmarks split each row at each hop (issue 35): commit -> relayed -> stored ->
claimed -> handled, each hop's own p50 and p99, beside the same run's floor."""

from __future__ import annotations

from benchmarks.harness import Result
from benchmarks.latency import HOPS, Stages, beside_floors, hop_budget


def _stages(ids: list[str], stored: float, claimed: float, handled: float) -> Stages:
    return Stages(
        stored={i: stored for i in ids},
        claimed={i: claimed for i in ids},
        handled={i: handled for i in ids},
        positions={},
    )


def test_each_hop_is_the_difference_of_its_two_stages_in_ms() -> None:
    committed = {"a": 100.0, "b": 100.0}
    budget = hop_budget(
        "x", committed, {"a": 100.001, "b": 100.001}, _stages(["a", "b"], 100.004, 100.010, 100.011)
    )
    m = budget.metrics
    assert budget.scenario == HOPS
    assert m["messages"] == 2
    assert round(m["commit->relayed p50"], 6) == 1.0
    assert round(m["relayed->stored p99"], 6) == 3.0
    assert round(m["stored->claimed p50"], 6) == 6.0
    assert round(m["claimed->handled p50"], 6) == 1.0
    assert round(m["total p99"], 6) == 11.0


def test_a_message_missing_a_stage_is_left_out_and_counted_in_the_notes() -> None:
    committed = {"a": 100.0, "b": 100.0}
    budget = hop_budget(
        "x", committed, {"a": 100.001}, _stages(["a", "b"], 100.002, 100.003, 100.004)
    )
    assert budget.metrics["messages"] == 1
    assert budget.notes.startswith("1 of 2 messages lack a stage")


def test_budgets_get_the_floor_of_their_settings_outbox_run_too() -> None:
    committed = {"a": 100.0}
    budgets = [
        hop_budget(name, committed, {"a": 100.001}, _stages(["a"], 100.002, 100.003, 100.004))
        for name in ("low latency: 500/s, 1 sender", "low latency (outbox run): 500/s, 1 sender")
    ]
    for budget in budgets:
        budget.metrics = {"target /s": 500, **budget.metrics}
    floor = Result("e", "low latency: broker floor, 500/s", {"p50 ms": 2.0, "p99 ms": 20.0})
    beside_floors(budgets, [floor])
    for budget in budgets:
        assert budget.metrics["floor p50"] == 2.0
        assert budget.metrics["floor p99"] == 20.0
        assert "ratio" not in budget.metrics
