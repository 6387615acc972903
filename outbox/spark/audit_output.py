"""The delivery audit's result and its forms: a table for people, JSON and Parquet for machines,
a PNG chart. Pure Python (pyarrow and matplotlib are imported by the writers that need them);
the Spark job that fills an `AuditReport` is `outbox.spark.audit`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

#: Exit code of `outbox spark audit` when a message is missing or was handled twice.
EXIT_PROBLEMS = 3


@dataclass(frozen=True)
class AuditRow:
    """The counts of one topic in one service's inbox, over the audit window.

    sent: distinct outbox message ids on Kafka; resent: those of them at more than one offset
    (the relay re-sent them: normal, deduplicated by the inbox); received = pending + handled +
    dead, the ids found in the inbox; missing = sent - received; duplicated: handled more than
    once (handled_count > 1); not_on_kafka: inbox rows in the window whose id is not on Kafka
    (Kafka retention shorter than the window, or written by other means). Latencies are
    milliseconds from the message's created time to its handling, over the handled messages.
    """

    topic: str
    service: str
    sent: int = 0
    resent: int = 0
    received: int = 0
    pending: int = 0
    handled: int = 0
    dead: int = 0
    missing: int = 0
    duplicated: int = 0
    not_on_kafka: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None

    @property
    def ok(self) -> bool:
        """Nothing missing and nothing handled twice."""
        return self.missing == 0 and self.duplicated == 0


@dataclass(frozen=True)
class AuditReport:
    """What the audit found: one row per (topic, service), and examples of each problem."""

    since: datetime
    until: datetime
    generated_at: datetime
    rows: tuple[AuditRow, ...]
    #: At most `list_limit` examples each: dicts with topic, service, message_id and details.
    missing: tuple[dict[str, Any], ...] = ()
    duplicated: tuple[dict[str, Any], ...] = ()
    resent: tuple[dict[str, Any], ...] = ()
    list_limit: int = 100
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when no topic of any service has a missing or duplicated message."""
        return all(row.ok for row in self.rows)

    @property
    def exit_code(self) -> int:
        """0 when ok, else EXIT_PROBLEMS."""
        return 0 if self.ok else EXIT_PROBLEMS

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (times in ISO 8601)."""
        return {
            "ok": self.ok,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "generated_at": self.generated_at.isoformat(),
            "rows": [asdict(row) for row in self.rows],
            "missing": [_jsonable(item) for item in self.missing],
            "duplicated": [_jsonable(item) for item in self.duplicated],
            "resent": [_jsonable(item) for item in self.resent],
            "list_limit": self.list_limit,
            "notes": list(self.notes),
        }


def _jsonable(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in item.items()}


# -- the table ------------------------------------------------------------------------------

_COUNTS = (
    "sent",
    "received",
    "handled",
    "pending",
    "dead",
    "missing",
    "duplicated",
    "resent",
    "not_on_kafka",
)
_LATENCIES = ("p50_ms", "p95_ms", "p99_ms", "max_ms")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def format_table(report: AuditReport) -> str:
    """The report as a plain-text table, with the window and a verdict line, for stdout."""
    header = ["topic", "service", *_COUNTS, *_LATENCIES]
    lines = [
        [row.topic, row.service, *(str(getattr(row, c)) for c in _COUNTS)]
        + [_ms(getattr(row, c)) for c in _LATENCIES]
        for row in report.rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def render(cells: Sequence[str]) -> str:
        left = [cells[i].ljust(widths[i]) for i in range(2)]
        right = [cells[i].rjust(widths[i]) for i in range(2, len(cells))]
        return "  ".join(left + right).rstrip()

    out = [
        f"delivery audit, messages created {report.since.isoformat()} .. "
        f"{report.until.isoformat()}",
        render(header),
        render(["-" * w for w in widths]),
        *(render(line) for line in lines),
    ]
    out += _problem_lines("missing", report.missing, report)
    out += _problem_lines("duplicated", report.duplicated, report)
    out += [f"note: {note}" for note in report.notes]
    if report.ok:
        out.append("OK: nothing missing, nothing handled twice")
    else:
        missing = sum(r.missing for r in report.rows)
        duplicated = sum(r.duplicated for r in report.rows)
        out.append(f"PROBLEMS: {missing} missing, {duplicated} handled more than once")
    return "\n".join(out)


def _problem_lines(kind: str, items: Sequence[dict[str, Any]], report: AuditReport) -> list[str]:
    if not items:
        return []
    total = sum(getattr(row, kind) for row in report.rows)
    shown = f" (first {len(items)} of {total})" if total > len(items) else ""
    lines = [f"{kind}{shown}:"]
    for item in items:
        extra = ", ".join(
            f"{k}={v.isoformat() if isinstance(v, datetime) else v}"
            for k, v in item.items()
            if k not in ("topic", "service", "message_id")
        )
        lines.append(f"  {item['service']} {item['topic']} {item['message_id']} {extra}".rstrip())
    return lines


# -- machines -------------------------------------------------------------------------------


def write_json(report: AuditReport, path: str | Path) -> None:
    """Write the report's JSON form to `path`."""
    Path(path).write_text(json.dumps(report.to_dict(), indent=2) + "\n")


def write_parquet(report: AuditReport, path: str | Path) -> None:
    """Write one Parquet file: a row per (topic, service) with the window's bounds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f.name for f in fields(AuditRow)]
    columns: dict[str, list[Any]] = {
        name: [getattr(r, name) for r in report.rows] for name in names
    }
    columns["since"] = [report.since] * len(report.rows)
    columns["until"] = [report.until] * len(report.rows)
    columns["ok"] = [r.ok for r in report.rows]
    pq.write_table(pa.table(columns), str(path))


# -- the chart ------------------------------------------------------------------------------

#: Stacked states of a (topic, service) bar, with their colours.
_STACK = (
    ("handled", "#4c9a2a"),
    ("pending", "#9db8d9"),
    ("dead", "#7f7f7f"),
    ("missing", "#d62728"),
)


def write_chart(report: AuditReport, path: str | Path) -> None:
    """A PNG: per (topic, service) stacked message counts, and latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{row.topic}\n{row.service}" for row in report.rows]
    positions = list(range(len(report.rows)))
    width = max(6.0, 1.6 * len(report.rows) + 2)
    figure, (counts, latency) = plt.subplots(1, 2, figsize=(2 * width, 5))
    try:
        bottom = [0] * len(report.rows)
        for state, colour in _STACK:
            values = [getattr(row, state) for row in report.rows]
            counts.bar(positions, values, bottom=bottom, color=colour, label=state)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        duplicated = [row.duplicated for row in report.rows]
        counts.bar(
            positions,
            duplicated,
            color="none",
            edgecolor="#ff7f0e",
            hatch="//",
            label="handled twice",
        )
        for position, row, top in zip(positions, report.rows, bottom, strict=True):
            counts.annotate(
                _verdict(row),
                (position, top),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                color="#2a7a2a" if row.ok else "#d62728",
            )
        counts.set_ylim(0, max([*bottom, 1]) * 1.15)
        counts.set_xticks(positions, labels, fontsize=8)
        counts.set_ylabel("messages")
        counts.set_title("sent = handled + pending + dead + missing")
        counts.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5)
        step = 0.8 / len(_LATENCIES)
        for i, name in enumerate(_LATENCIES):
            values = [getattr(row, name) or 0.0 for row in report.rows]
            latency.bar([p + (i - 1.5) * step for p in positions], values, step, label=name[:-3])
        latency.set_xticks(positions, labels, fontsize=8)
        latency.set_ylabel("created -> handled (ms)")
        latency.set_title("end-to-end latency")
        latency.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4)
        verdict = "OK" if report.ok else "PROBLEMS"
        figure.suptitle(
            f"delivery audit {verdict}: {report.since:%Y-%m-%d %H:%M:%S} .. "
            f"{report.until:%Y-%m-%d %H:%M:%S} UTC"
        )
        figure.tight_layout()
        figure.savefig(str(path), dpi=100)
    finally:
        plt.close(figure)


def _verdict(row: AuditRow) -> str:
    """The words over a bar: what is wrong with it, or "ok"."""
    problems = [
        f"{row.missing} missing" if row.missing else "",
        f"{row.duplicated} handled twice" if row.duplicated else "",
    ]
    return ", ".join(p for p in problems if p) or "ok"
