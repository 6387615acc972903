"""Collects one row per injected fault and prints the summary table at the end of the run."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass
class FaultResult:
    fault: str
    sent: int
    handled_once: int
    duplicates: int
    lost: int
    dead: int
    seconds: float


RESULTS: list[FaultResult] = []


@pytest.fixture
def fault_results() -> list[FaultResult]:
    """Append a FaultResult here; the table is printed after the run."""
    return RESULTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from .fleet import TABLES

    if TABLES:
        terminalreporter.section("topology and soak accounting")
        for table in TABLES:
            for line in table.splitlines():
                terminalreporter.write_line(line)
    if not RESULTS:
        return
    header = ("fault", "sent", "handled once", "duplicates", "lost", "dead", "seconds")
    rows = [
        (
            r.fault,
            str(r.sent),
            str(r.handled_once),
            str(r.duplicates),
            str(r.lost),
            str(r.dead),
            f"{r.seconds:.1f}",
        )
        for r in RESULTS
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    terminalreporter.section("fault-injection summary")
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    terminalreporter.write_line(line)
    terminalreporter.write_line("  ".join("-" * w for w in widths))
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        terminalreporter.write_line("  ".join(cells))
