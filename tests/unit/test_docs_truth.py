"""The docs' checkable claims hold: measured numbers name their run, "every flag has a variable"
is true of the parser, and a list of outbox's tables names them all.

The convention for numbers (docs/README.md, "Numbers"; `unmarked_numbers` says it exactly): a
number that reads as a measurement (`12,000 msg/s`, `rows/s`, `records/s`, `commits/s`, `p99
35 ms`, `4x faster`) names its run, in its own paragraph, table row or list item, else in its
section (the text under one heading): a date `YYYY-MM-DD`, or a link to the file of
`benchmarks/results/` that holds it (as written or rounded).
Rates given as an input (`at 100 msg/s`, `up to 100 msg/s`) or a target (`target 20,000
msg/s`, `>= 12,000 msg/s`) are not measurements.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

import pytest

from outbox.cli import build_parser, reference
from outbox.postgres import schema

ROOT = Path(__file__).resolve().parents[2]
#: Every page a user or contributor reads; the generated reference is checked elsewhere.
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*.md")]
)

_NUMBER = r"(?<![\w.,])\d[\d,]*(?:\.\d+)?"
MEASURED = re.compile(
    r"(?<!at )(?<!up to )(?<!target )(?<!>= )(?<!≥ )("
    rf"{_NUMBER}\s*(?:msg/s|messages/s|rows/s|records/s|commits/s|[x\u00d7] faster)"
    rf"|(?:p50|p95|p99|p99\.9|median)\s*(?:of\s*)?{_NUMBER}\s*(?:ms|µs)"
    rf"|{_NUMBER}\s*(?:ms|µs)\s*(?:at\s*)?(?:p50|p95|p99|median)"
    r")",
    re.I,
)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b20\d{6}T\d{6}Z")
RESULTS_LINK = re.compile(r"benchmarks/results/[\w.\-]+")


def _relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


def sections(text: str) -> list[tuple[int, str]]:
    """The text under each heading (code blocks left out), with its first line's number."""
    out: list[tuple[int, str]] = []
    lines: list[str] = []
    start, fenced = 1, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#"):
            out.append((start, "\n".join(lines)))
            lines, start = [], number
        lines.append(line)
    out.append((start, "\n".join(lines)))
    return out


def units(section: str) -> list[str]:
    """The paragraphs of a section, a table row or a list item each on its own."""
    out: list[list[str]] = []
    fresh = True
    for line in section.splitlines():
        if not line.strip():
            fresh = True
            continue
        if fresh or line.lstrip().startswith(("|", "- ", "* ")):
            out.append([])
        out[-1].append(line)
        fresh = False
    return ["\n".join(unit) for unit in out]


def _linked(links: list[str], results: Path) -> str:
    files = [results.parent.parent / link for link in links]
    return " ".join(f.read_text(encoding="utf-8") for f in files if f.is_file())


def unmarked_numbers(text: str, results: Path) -> list[str]:
    """The measured numbers of a page that break the convention, as `line: number (why)`.

    A number's paragraph (table row, list item) that names a date names its run; one that
    links results files must quote them. Else its section decides the same way, the links
    first: a section that links results files may quote only what they hold."""
    problems = []
    for start, section in sections(text):
        section_links = RESULTS_LINK.findall(section)
        for unit in units(section):
            numbers = [" ".join(m.split()) for m in MEASURED.findall(unit)]
            if not numbers or DATE.search(unit):
                continue
            links = RESULTS_LINK.findall(unit) or section_links
            if not links:
                if not DATE.search(section):
                    problems += [f"{start}: {n} (no run named)" for n in numbers]
                continue
            quoted = _values(_linked(links, results))
            for n in numbers:
                if not _quotes(n, quoted):
                    problems.append(f"{start}: {n} (not in {', '.join(sorted(set(links)))})")
    return problems


def _values(text: str) -> set[float]:
    return {float(v.replace(",", "")) for v in re.findall(r"\d[\d,]*(?:\.\d+)?", text)}


def _quotes(number: str, values: set[float]) -> bool:
    """Whether a measured number is one of `values`, as written or rounded: `113,200`
    quotes 113,184 and `5.4` quotes 5.43 (rounded to the digits the doc shows). A heuristic:
    another value of the file that rounds the same matches too."""
    match = re.search(_NUMBER, number)
    if match is None:
        return False
    text = match.group().replace(",", "")
    if "." in text:
        half = 0.5 * 10 ** -len(text.split(".")[1])
    else:
        zeros = len(text) - len(text.rstrip("0"))
        half = 0.5 * 10**zeros if zeros < len(text) else 0.5
    return any(abs(v - float(text)) <= half for v in values)


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_measured_numbers_name_their_run(page: Path) -> None:
    problems = unmarked_numbers(page.read_text(encoding="utf-8"), ROOT / "benchmarks" / "results")
    assert not problems, f"{_relative(page)}: measured numbers without their run: {problems}"


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_linked_results_files_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = sorted({link for link in RESULTS_LINK.findall(text) if not (ROOT / link).exists()})
    assert not missing, f"{_relative(page)} links results that do not exist: {missing}"


def test_the_number_convention_itself(tmp_path: Path) -> None:
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "run.md").write_text("| relay | 55,144 |\n", encoding="utf-8")
    unmarked = "# A\n\nThe relay sends 15,700 msg/s, p99 35 ms.\n"
    assert unmarked_numbers(unmarked, results) == [
        "1: 15,700 msg/s (no run named)",
        "1: p99 35 ms (no run named)",
    ]
    dated = "# A\n\nRun of 2026-11-26 21:15 (`./run bench`): 15,700 msg/s.\n"
    assert unmarked_numbers(dated, results) == []
    linked = "# A\n\n55,100 msg/s, 15,700 msg/s ([run](benchmarks/results/run.md)).\n"
    assert unmarked_numbers(linked, results) == [
        "1: 15,700 msg/s (not in benchmarks/results/run.md)"
    ]
    # A table row without its own date is held to the results file its section links.
    table = "# A\n\nRun of 2026-11-26 ([run](benchmarks/results/run.md)):\n\n| 1,000 msg/s |\n"
    assert unmarked_numbers(table, results) == ["1: 1,000 msg/s (not in benchmarks/results/run.md)"]
    inputs = (
        "# A\n\nAt 100 msg/s, or a target 20,000 msg/s, waits `poll 50 ms`.\n```\n9 msg/s\n```\n"
    )
    assert unmarked_numbers(inputs, results) == []
    elsewhere = "# A\n\nSee 2026-11-26.\n\n## B\n\n4x faster\n"
    assert unmarked_numbers(elsewhere, results) == ["5: 4x faster (no run named)"]


# -- "every flag has its environment variable" -----------------------------------------------

CLAIM = re.compile(
    r"\b(?:every|each|all)\s+(?:flags?|options?)\s+(?:has|have)\b[^.]*?\bvariables?\b", re.I
)
COMMAND = re.compile(r"`outbox ([a-z][a-z-]*(?: [a-z][a-z-]*)?)")
#: The commands a claim is about when its page names none: the daemons.
DAEMONS = ("producer", "consumer", "handler")


def flags_without_variable() -> dict[str, list[str]]:
    """Each command's flags that no environment variable sets, by the real parser."""
    env_of = reference._environment_of_flags(build_parser)
    out: dict[str, list[str]] = {}
    for command in reference.walk(build_parser()):
        missing = []
        for action in command.parser._actions:
            if not action.option_strings or not reference._shown(action):
                continue
            if isinstance(action, argparse._VersionAction):
                continue
            env = env_of.get((command.path, action.dest))
            if env is None and not reference._ENV_IN_HELP.search(action.help or ""):
                missing.append(action.option_strings[-1])
        out[" ".join(command.path)] = missing
    return out


def claims(text: str) -> list[tuple[str, list[str]]]:
    """Each "every flag has a variable" claim of a page and the commands it is about: those
    its paragraph names, else those the page names."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        for claim in CLAIM.findall(paragraph):
            named = COMMAND.findall(paragraph) or COMMAND.findall(text)
            found.append((" ".join(claim.split()), named))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_flag_claims_hold(page: Path) -> None:
    missing = flags_without_variable()
    for claim, named in claims(page.read_text(encoding="utf-8")):
        commands = [c for c in named if c in missing] or list(DAEMONS)
        without = {c: missing[c] for c in commands if missing[c]}
        assert not without, (
            f"{_relative(page)} says {claim!r}, but these flags have no variable: {without}"
        )


def test_the_claim_check_itself() -> None:
    text = "Every flag has its environment variable: see `outbox console`.\n\nNo claim here."
    assert claims(text) == [("Every flag has its environment variable", ["console"])]
    page = "Run `outbox status`.\n\nAll options have a variable."
    assert claims(page) == [("All options have a variable", ["status"])]
    assert "--batch-size" in flags_without_variable()["producer"]  # so the claim would fail


# -- outbox's tables -------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_a_list_of_outboxs_tables_names_them_all(page: Path) -> None:
    tables = {t.name for t in schema.metadata().sorted_tables}
    text = page.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        named = {t for t in tables if re.search(rf"\b{t}\b", line)}
        if len(named) >= 3 and "relay_state" in named and named != tables:
            pytest.fail(
                f"{_relative(page)}:{number} lists outbox's tables without "
                f"{sorted(tables - named)}: {line.strip()}"
            )


# -- the package's metadata ------------------------------------------------------------------


def test_the_classifiers_name_the_python_the_tests_run_on() -> None:
    # `./run test` runs on the machine's python3 (3.11 where this project is developed and
    # tested); a new Python the suite passes on gets its classifier.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    running = f"Programming Language :: Python :: {sys.version_info[0]}.{sys.version_info[1]}"
    assert running in project["classifiers"], f"pyproject.toml lacks {running!r}"
    lowest = project["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {lowest}" in project["classifiers"]
