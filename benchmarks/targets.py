"""The issues' targets beside a run's measurements: the "Targets" section of every results file
(issue 26's, then issue 34's, 35's and 36's).

Each target names the row of a scenario that measures it; its line shows that row's
measurement, the floor measured in the same run and their ratio (`benchmarks/floors.py`), and a
verdict:

- `met`: the measurement reaches the target;
- `missed`: it does not;
- `smaller run`: it reaches the target's number at a smaller size than the target names (a
  quick run's 100,000 messages for "one million end to end"), which proves nothing about it;
- `not run`: the run has no row for it (its scenario was not run, or failed).

Rows are given as the results JSON holds them (`{"scenario", "variant", "metrics", "notes"}`)
or as `harness.Result`s.

    python -m benchmarks.targets RESULTS.json [MORE.json ...]

judges the rows of one or more results files together (a complete run and the tenants scale
run, which is run apart) and prints the section.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, is_dataclass
from typing import Any

Row = Mapping[str, Any]

MET = "met"
MISSED = "missed"
SMALLER = "smaller run"
NOT_RUN = "not run"

#: The end-to-end target's size: one million messages.
MILLION = 1_000_000


@dataclass(frozen=True)
class Verdict:
    """One target's line of the table."""

    target: str
    measurement: str
    floor: float
    ratio: float
    verdict: str
    row: str


@dataclass(frozen=True)
class Target:
    """A target: where it is measured (`scenario`, the key of `python -m benchmarks --only`),
    how its row is found among a run's rows, and how the row is judged."""

    text: str
    scenario: str
    find: Callable[[Sequence[Row]], Row | None]
    judge: Callable[[Row, Sequence[Row]], tuple[str, str]]
    """(verdict, measurement) of the row found; the other rows are there for context."""


def _metrics(row: Row) -> Mapping[str, float]:
    metrics: Mapping[str, float] = row.get("metrics") or {}
    return metrics


def _get(row: Row, name: str) -> float:
    value = _metrics(row).get(name)
    return float("nan") if value is None else float(value)


def _of(scenario: str, rows: Sequence[Row]) -> list[Row]:
    """The rows of the scenario whose name starts with `scenario` (such as "w.")."""
    return [r for r in rows if str(r.get("scenario", "")).startswith(scenario)]


def _one(scenario: str, variant: str) -> Callable[[Sequence[Row]], Row | None]:
    def find(rows: Sequence[Row]) -> Row | None:
        return next((r for r in _of(scenario, rows) if r.get("variant") == variant), None)

    return find


def _rate(minimum: float) -> Callable[[Row, Sequence[Row]], tuple[str, str]]:
    def judge(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
        figure = _get(row, "figure")
        if figure != figure:
            figure = _get(row, "msg/s")
        verdict = MET if figure >= minimum else MISSED
        return verdict, f"{figure:,.0f} msg/s"

    return judge


def _lost(row: Row) -> str:
    """ "N of M messages not received in time" when the latency row says so (its quantiles are
    then of the messages that came only), else ""."""
    notes = str(row.get("notes") or "")
    mark = " messages not received in time"
    return notes[: notes.index(mark) + len(mark)] if mark in notes else ""


def _latency(p50: float, p99: float) -> Callable[[Row, Sequence[Row]], tuple[str, str]]:
    def judge(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
        got50, got99 = _get(row, "p50 ms"), _get(row, "p99 ms")
        lost = _lost(row)
        verdict = MET if got50 < p50 and got99 < p99 and not lost else MISSED
        text = f"p50 {got50:.2f} ms, p99 {got99:.2f} ms"
        floor99 = _get(row, "floor p99 ms")
        if floor99 == floor99:
            text += f" (floor p99 {floor99:.2f})"
        if lost:
            text += f"; {lost}"
        return verdict, text

    return judge


def _end_to_end(rows: Sequence[Row]) -> Row | None:
    return next(
        (r for r in _of("f.", rows) if str(r.get("variant", "")).endswith("messages end to end")),
        None,
    )


def _judge_end_to_end(row: Row, rows: Sequence[Row]) -> tuple[str, str]:
    """>= 10,000 msg/s, and retention left both inbox tables empty (the tables are bounded)."""
    rate = _get(row, "msg/s")
    messages = _get(row, "messages")
    after = next((r for r in _of("f.", rows) if r.get("variant") == "after retention"), None)
    left = (
        _get(after, "consumer_queue rows") + _get(after, "consumer_processed rows")
        if after is not None
        else float("nan")
    )
    bounded = left == 0
    peak = next((r for r in _of("f.", rows) if r.get("variant") == "peak during the run"), None)
    text = f"{rate:,.0f} msg/s over {messages:,.0f} messages; "
    text += (
        "after retention the inbox tables hold no rows"
        if bounded
        else f"after retention the inbox tables hold {left:,.0f} rows"
        if left > 0
        else "no count of the inbox tables' rows after retention"
    )
    if peak is not None:
        text += (
            f"; peak producer_queue {_get(peak, 'producer_queue MB'):.0f} MB, "
            f"consumer_queue {_get(peak, 'consumer_queue MB'):.0f} MB"
        )
    if rate < 10_000 or not bounded:
        return MISSED, text
    return (MET if messages >= MILLION else SMALLER), text


def _relay(rows: Sequence[Row]) -> Row | None:
    """(b)'s one-producer row of 100 B messages over the largest backlog."""
    candidates = [
        r
        for r in _of("b.", rows)
        if str(r.get("variant", "")).startswith("100 B") and "1 producer" in str(r["variant"])
    ]
    return max(candidates, key=lambda r: _get(r, "messages"), default=None)


def _judge_relay(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
    figure, ratio = _get(row, "figure"), _get(row, "ratio")
    if figure != figure:  # a run from before the floors
        figure = _get(row, "msg/s after 1st")
    verdict = MET if figure >= 150_000 or ratio >= 2 else MISSED
    return (
        verdict,
        f"{figure:,.0f} msg/s after the first delete, {_get(row, 'messages'):,.0f} messages",
    )


SEND = "+ broker.send"
NAIVE = "+ queue INSERT + NOTIFY (naive)"


def _send(rows: Sequence[Row]) -> Row | None:
    return next(
        (r for r in _of("a.", rows) if r.get("variant") == SEND and _get(r, "writers") == 16),
        None,
    )


def _judge_send(row: Row, rows: Sequence[Row]) -> tuple[str, str]:
    ratio = _get(row, "ratio")
    naive = next(
        (r for r in _of("a.", rows) if r.get("variant") == NAIVE and _get(r, "writers") == 16),
        None,
    )
    naive_ratio = _get(naive, "ratio") if naive is not None else float("nan")
    verdict = MET if ratio >= 0.90 and ratio > naive_ratio else MISSED
    text = f"{_get(row, 'commits/s'):,.0f} commits/s, {ratio:.2f} of the floor"
    text += f" (naive {naive_ratio:.2f})" if naive is not None else " (no naive row)"
    return verdict, text


def _detail(variant: str) -> Callable[[Sequence[Row]], Row | None]:
    """A row of the transports scenario's latency detail (it has p50 and p99)."""

    def find(rows: Sequence[Row]) -> Row | None:
        return next(
            (
                r
                for r in _of("transports", rows)
                if r.get("variant") == variant and "p50 ms" in _metrics(r)
            ),
            None,
        )

    return find


def _due_later(rows: Sequence[Row]) -> Row | None:
    """The delayed scenario's relay row with rows due later in producer_scheduled."""
    return next(
        (r for r in _of("delayed. relay", rows) if _get(r, "scheduled") > 0),
        None,
    )


def _judge_due_later(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
    """>= 0.9 of the same relay's rate with producer_scheduled empty, beside a million."""
    ratio, scheduled = _get(row, "ratio"), _get(row, "scheduled")
    text = f"{ratio:.2f} of the empty table's rate beside {scheduled:,.0f} due later"
    if not ratio >= 0.9:
        return MISSED, text
    return (MET if scheduled >= MILLION else SMALLER), text


def _lateness(rows: Sequence[Row]) -> Row | None:
    return next(iter(_of("delayed. lateness", rows)), None)


def _judge_lateness(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
    p50, p99 = _get(row, "p50 ms"), _get(row, "p99 ms")
    text = f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (floor p99 {_get(row, 'floor'):.1f})"
    return (MET if p99 < 50 else MISSED), text


def _p50_under(bound: float) -> Callable[[Row, Sequence[Row]], tuple[str, str]]:
    """p50 < `bound` ms (issue 35's targets at 100/s), shown beside the floor's p50."""

    def judge(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
        got = _get(row, "p50 ms")
        text = f"p50 {got:.2f} ms (floor p50 {_get(row, 'floor'):.2f})"
        return (MET if got < bound else MISSED), text

    return judge


def _judge_near_floor(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
    """p99 within 2x of the broker floor's p99, measured in the same run."""
    got, floor = _get(row, "p99 ms"), _get(row, "floor p99 ms")
    text = f"p99 {got:.2f} ms, broker floor p99 {floor:.2f} ms ({got / floor:.1f}x)"
    lost = _lost(row)
    if lost:
        return MISSED, f"{text}; {lost}"
    return (MET if got <= 2 * floor else MISSED), text


#: Issue 36's size: tenant databases served by one producer, one consumer, one handler.
TENANTS = 500


def _scale(rows: Sequence[Row]) -> Row | None:
    """The tenants scale run's row of the most tenants (`python -m benchmarks.tenants`)."""
    return max(_of("tenants scale", rows), key=lambda r: _get(r, "tenants"), default=None)


def _tenants(
    measure: Callable[[Row], tuple[bool, str]],
) -> Callable[[Row, Sequence[Row]], tuple[str, str]]:
    """Met at 500 tenants, `smaller run` at fewer, missed when `measure` says so."""

    def judge(row: Row, _rows: Sequence[Row]) -> tuple[str, str]:
        ok, text = measure(row)
        n = _get(row, "tenants")
        text += f" ({n:,.0f} tenants, --max-connections {_get(row, 'budget per daemon'):,.0f})"
        if not ok:
            return MISSED, text + _connect_floor(row)
        return (MET if n >= TENANTS else SMALLER), text

    return judge


def _connect_floor(row: Row) -> str:
    """What connects alone take at this scale (`benchmarks.tenants.connect_floor`), when the
    run measured it and they take more than the machine has: no daemon can meet a latency
    target with the connects it cannot avoid queueing for the CPU."""
    cores, have = _get(row, "connect floor cores"), _get(row, "cores")
    if not cores > 0 or not have > 0:
        return ""
    text = (
        f"; connect floor: {_get(row, 'connect floor connects/s'):,.0f} connects/s at "
        f"{_get(row, 'connect CPU ms'):.1f} ms of CPU each take {cores:.1f} of {have:.0f} cores"
    )
    return text + (", beyond this machine" if cores >= have else "")


def _start_up(row: Row) -> tuple[bool, str]:
    got = _get(row, "start-up s (all handled)")
    if got != got:  # not every first message was handled within the run's wait
        handled = _get(row, "start-up first messages handled")
        return False, f"{handled:,.0f} of {_get(row, 'tenants'):,.0f} first messages handled"
    return got <= 60, f"{got:,.1f} s"


def _worst_p99(prefix: str, whose: str) -> Callable[[Row], tuple[bool, str]]:
    """The worst tenant's p99 under 1 s and every message sent handled, in the phase whose
    metrics start with `prefix` ("0.5 msg/s", "beside a flood")."""

    def measure(row: Row) -> tuple[bool, str]:
        worst = _get(row, f"{prefix} worst tenant p99 ms")
        handled, sent = _get(row, f"{prefix} handled"), _get(row, f"{prefix} sent")
        text = f"{whose} p99 {worst:,.0f} ms, {handled:,.0f} of {sent:,.0f} handled"
        return worst < 1000 and handled >= sent, text

    return measure


def _connections(row: Row) -> tuple[bool, str]:
    peaks = [
        _get(row, f"{daemon} connections (peak)") for daemon in ("producer", "consumer", "handler")
    ]
    text = "peaks " + " / ".join(f"{p:,.0f}" for p in peaks) + " (producer / consumer / handler)"
    return all(p <= 150 for p in peaks), text


def _parked(row: Row) -> tuple[bool, str]:
    got = _get(row, "parked wake-up p50 ms")
    return got <= 2000, f"p50 {got:,.0f} ms"


#: How a target's scenario is run when it is not one of `python -m benchmarks --only`.
RUN_APART = {"tenants": "python -m benchmarks.tenants --only scale --scale 500"}

#: Issue 26's targets, in its order, then issue 34's (messages due later), 35's (latency near
#: the floor) and 36's (hundreds of tenant databases).
TARGETS: tuple[Target, ...] = (
    Target(
        "whole path, one-INSERT per-message handler >= 12,000 msg/s",
        "w",
        _one("w.", "per message"),
        _rate(12_000),
    ),
    Target("whole path, batch_handler >= 25,000 msg/s", "w", _one("w.", "batch"), _rate(25_000)),
    Target(
        "one million messages end to end >= 10,000 msg/s, tables bounded",
        "f",
        _end_to_end,
        _judge_end_to_end,
    ),
    Target(
        "relay >= 150,000 msg/s from the first delete, or >= 2x the bare loop",
        "b",
        _relay,
        _judge_relay,
    ),
    Target(
        "commit -> handler p50 < 5 ms, p99 < 25 ms at 500/s on Kafka (fetch wait 1 ms)",
        "e",
        _one("e.", "low latency: 500/s, 1 sender"),
        _latency(5, 25),
    ),
    Target(
        "commit -> handler p50 < 3 ms, p99 < 15 ms at 1,000/s on the log",
        "transports",
        _detail("PostgreSQL log, 1,000/s"),
        _latency(3, 15),
    ),
    Target(
        "send >= 0.90 of the floor at 16 writers and ahead of the naive design",
        "a",
        _send,
        _judge_send,
    ),
    Target(
        "relay beside 1,000,000 due later >= 0.9 of its rate beside none",
        "delayed",
        _due_later,
        _judge_due_later,
    ),
    Target(
        "lateness (relayed - due) p99 < 50 ms at 1,000 due/s",
        "delayed",
        _lateness,
        _judge_lateness,
    ),
    Target(
        "commit -> handler p50 < 2 ms at 100/s on the log",
        "transports",
        _detail("PostgreSQL log, 100/s"),
        _p50_under(2),
    ),
    Target(
        "commit -> handler p50 < 3 ms at 100/s on Kafka (fetch wait 1 ms)",
        "e",
        _one("e.", "low latency: 100/s, 1 sender"),
        _p50_under(3),
    ),
    Target(
        "commit -> handler p99 at 500/s on Kafka within 2x of the broker floor's p99",
        "e",
        _one("e.", "low latency: 500/s, 1 sender"),
        _judge_near_floor,
    ),
    Target(
        "500 tenant databases served within 60 s of start",
        "tenants",
        _scale,
        _tenants(_start_up),
    ),
    Target(
        "every tenant's p99 < 1 s at 0.5 msg/s each",
        "tenants",
        _scale,
        _tenants(_worst_p99("0.5 msg/s", "worst tenant's")),
    ),
    Target("<= 150 connections per daemon", "tenants", _scale, _tenants(_connections)),
    Target(
        "a parked tenant's first message handled within 2 s p50",
        "tenants",
        _scale,
        _tenants(_parked),
    ),
    Target(
        "beside a tenant flooding 50,000 messages, every other tenant's p99 < 1 s",
        "tenants",
        _scale,
        _tenants(_worst_p99("beside a flood", "worst other tenant's")),
    ),
)


def as_rows(results: Iterable[Any]) -> list[Row]:
    """Rows as the results JSON holds them, from dicts or `Result`s."""
    fields = ("scenario", "variant", "metrics", "notes")
    return [{name: getattr(r, name) for name in fields} if is_dataclass(r) else r for r in results]


def judge(results: Iterable[Any], targets: Sequence[Target] = TARGETS) -> list[Verdict]:
    """Each target beside the run's measurement, floor and ratio, with its verdict."""
    rows = as_rows(results)
    verdicts = []
    for target in targets:
        row = target.find(rows)
        if row is None:
            verdicts.append(
                Verdict(
                    target.text,
                    f"scenario {target.scenario} not in this run"
                    + (
                        f" (`{RUN_APART[target.scenario]}`)" if target.scenario in RUN_APART else ""
                    ),
                    float("nan"),
                    float("nan"),
                    NOT_RUN,
                    "",
                )
            )
            continue
        verdict, measurement = target.judge(row, rows)
        verdicts.append(
            Verdict(
                target.text,
                measurement,
                _get(row, "floor"),
                _get(row, "ratio"),
                verdict,
                f"{row.get('scenario')}: {row.get('variant')}",
            )
        )
    return verdicts


def _cell(value: float) -> str:
    if value != value:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def markdown(results: Iterable[Any]) -> list[str]:
    """The "Targets" section: one line per target of issues 26, 34, 35 and 36."""
    lines = [
        "## Targets",
        "",
        "Issues 26, 34, 35 and 36's targets on this 2-core machine beside this run's "
        "measurement, its floor "
        "measured in the same run and their ratio (`n/a`: that row has no floor). "
        "`smaller run`: reached at a smaller size than the target names.",
        "",
        "| target | measurement | floor | ratio | verdict | row |",
        "|---|---|---:|---:|---|---|",
    ]
    for v in judge(results):
        lines.append(
            f"| {v.target} | {v.measurement} | {_cell(v.floor)} | {_cell(v.ratio)} | "
            f"{v.verdict} | {v.row} |"
        )
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the Targets section judged over the rows of the results files named."""
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m benchmarks.targets RESULTS.json [MORE.json ...]", file=sys.stderr)
        return 2
    rows: list[Row] = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as file:
                rows += json.load(file)["results"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: not a results file of `python -m benchmarks`: {exc!r}", file=sys.stderr)
            return 2
    print("\n".join([*markdown(rows), "Judged over: " + ", ".join(paths)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
