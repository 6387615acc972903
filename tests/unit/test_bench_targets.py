"""The benchmarks' "Targets" section judges each of issue 26's targets from a run's rows: met,
missed, reached only at a smaller size, or not run."""

from __future__ import annotations

from typing import Any

from benchmarks import targets
from benchmarks.harness import Result


def _row(scenario: str, variant: str, **metrics: float) -> dict[str, Any]:
    return {"scenario": scenario, "variant": variant, "metrics": metrics, "notes": ""}


def test_an_empty_run_has_every_target_not_run() -> None:
    verdicts = targets.judge([])
    assert len(verdicts) == len(targets.TARGETS) == 9
    assert {v.verdict for v in verdicts} == {targets.NOT_RUN}


def test_whole_path_rows_are_met_or_missed_against_their_own_numbers() -> None:
    rows = [
        _row(
            "w. whole path",
            "per message",
            **{"msg/s": 12_500.0},
            figure=12_500,
            floor=20_000,
            ratio=0.625,
        ),
        _row("w. whole path", "pipelined", figure=30_000, floor=20_000, ratio=1.5),
        _row("w. whole path", "batch", figure=24_000, floor=40_000, ratio=0.6),
    ]
    per_message, batch, *rest = targets.judge(rows)
    assert (per_message.verdict, per_message.floor, per_message.ratio) == ("met", 20_000, 0.625)
    assert per_message.row == "w. whole path: per message"
    assert batch.verdict == "missed" and batch.measurement == "24,000 msg/s"
    assert all(v.verdict == targets.NOT_RUN for v in rest)
    exactly = _row("w. whole path", "per message", figure=12_000, floor=1, ratio=12_000)
    assert targets.judge([exactly])[0].verdict == targets.MET  # the target says >=


def _retention(rate: float, messages: int, left: float) -> list[dict[str, Any]]:
    return [
        _row(
            "f. backlog",
            f"{messages:,} messages end to end",
            messages=messages,
            figure=rate,
            floor=2 * rate,
            ratio=0.5,
            **{"msg/s": rate},
        ),
        _row(
            "f. backlog",
            "peak during the run",
            **{"producer_queue MB": 50.0, "consumer_queue MB": 80.0},
        ),
        _row(
            "f. backlog",
            "after retention",
            **{"consumer_queue rows": 0.0, "consumer_processed rows": left},
        ),
    ]


def test_end_to_end_needs_the_rate_the_million_and_bounded_tables() -> None:
    def verdict(rows: list[dict[str, Any]]) -> str:
        return targets.judge(rows)[2].verdict

    assert verdict(_retention(11_000, 1_000_000, 0)) == targets.MET
    assert verdict(_retention(9_000, 1_000_000, 0)) == targets.MISSED
    assert verdict(_retention(11_000, 1_000_000, 5)) == targets.MISSED  # retention left rows
    assert verdict(_retention(11_000, 100_000, 0)) == targets.SMALLER
    assert verdict(_retention(11_000, 1_000_000, 0)[:1]) == targets.MISSED  # no retention row


def test_relay_is_met_by_the_rate_or_by_twice_the_floor_on_the_largest_backlog() -> None:
    def relay(messages: int, figure: float, ratio: float) -> dict[str, Any]:
        return _row(
            "b. relay",
            "100 B, 1 producer",
            messages=messages,
            figure=figure,
            floor=figure / ratio,
            ratio=ratio,
        )

    assert targets.judge([relay(20_000, 160_000, 0.9)])[3].verdict == targets.MET
    assert targets.judge([relay(20_000, 90_000, 2.1)])[3].verdict == targets.MET
    v = targets.judge([relay(1_000_000, 60_000, 0.5), relay(200_000, 200_000, 3.0)])[3]
    assert (v.verdict, v.ratio) == (targets.MISSED, 0.5)
    assert (
        targets.judge([_row("b. relay", "1 KiB, 1 producer", messages=1, figure=1e6, ratio=9)])[
            3
        ].verdict
        == targets.NOT_RUN
    )


def test_latencies_need_both_quantiles_under_their_bounds() -> None:
    def kafka(p50: float, p99: float) -> str:
        row = _row("e. latency", "low latency: 500/s, 1 sender", **{"p50 ms": p50, "p99 ms": p99})
        return targets.judge([row])[4].verdict

    def log(p50: float, p99: float) -> str:
        row = _row(
            "transports: detail", "PostgreSQL log, 1,000/s", **{"p50 ms": p50, "p99 ms": p99}
        )
        return targets.judge([row])[5].verdict

    assert kafka(4.9, 24.0) == targets.MET
    assert kafka(5.0, 10.0) == targets.MISSED
    assert kafka(2.0, 30.0) == targets.MISSED
    assert log(2.9, 14.0) == targets.MET
    assert log(3.5, 14.0) == targets.MISSED
    assert targets.judge([])[5].verdict == targets.NOT_RUN


def test_send_needs_nine_tenths_of_the_floor_and_to_beat_the_naive_design() -> None:
    def send(ratio: float, naive: float | None, writers: int = 16) -> str:
        rows = [
            _row("a. send", "+ broker.send", writers=writers, ratio=ratio, **{"commits/s": 1.0})
        ]
        if naive is not None:
            rows.append(
                _row("a. send", "+ queue INSERT + NOTIFY (naive)", writers=writers, ratio=naive)
            )
        return targets.judge(rows)[6].verdict

    assert send(0.95, 0.90) == targets.MET
    assert send(0.95, 0.97) == targets.MISSED  # behind the naive design
    assert send(0.85, 0.70) == targets.MISSED
    assert send(0.95, None) == targets.MISSED  # nothing to be ahead of
    assert send(0.95, 0.5, writers=4) == targets.NOT_RUN


def test_results_and_the_markdown_section() -> None:
    results = [
        Result(
            "w. whole path", "per message", {"figure": 13_000.0, "floor": 26_000.0, "ratio": 0.5}
        )
    ]
    lines = targets.markdown(results)
    assert lines[0] == "## Targets"
    line = next(x for x in lines if x.startswith("| whole path, one-INSERT"))
    assert "| 13,000 msg/s | 26,000 | 0.50 | met | w. whole path: per message |" in line
    assert sum("| not run |" in x for x in lines) == 8


def test_due_later_rows_need_nine_tenths_and_a_million_and_lateness_a_p99_under_50_ms() -> None:
    def relay(ratio: float, scheduled: int) -> dict[str, Any]:
        return {
            "scenario": "delayed. relay with due-later rows",
            "variant": f"{scheduled:,} due in an hour",
            "metrics": {"scheduled": scheduled, "ratio": ratio},
        }

    def late(p99: float) -> dict[str, Any]:
        return {
            "scenario": "delayed. lateness at 1,000 due/s",
            "variant": "10,000 due, 1,000/s",
            "metrics": {"p50 ms": 3.0, "p99 ms": p99, "floor": 2.0},
        }

    def verdicts(*rows: dict[str, Any]) -> list[str]:
        return [v.verdict for v in targets.judge(rows)[-2:]]

    assert verdicts(relay(0.95, 1_000_000), late(20)) == [targets.MET, targets.MET]
    assert verdicts(relay(0.95, 100_000), late(60)) == [targets.SMALLER, targets.MISSED]
    assert verdicts(relay(0.85, 1_000_000)) == [targets.MISSED, targets.NOT_RUN]
