"""Every page's `outbox` commands parse, and the variables it names exist.

The pages: README.md, every page of docs/ and every page of examples/. Every line of a shell
code block (```sh) that runs `outbox` (directly or through `docker compose exec SERVICE
outbox ...`) is split like a shell would (comments dropped, a pipe or redirection ends the
command) and given to the real argument parser. Every `OUTBOX_*` variable a page mentions
must be one outbox reads (`outbox.settings.ENVIRONMENT`).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from outbox import settings
from outbox.cli import build_parser  # `outbox.cli` as a module or as a package

ROOT = Path(__file__).resolve().parents[2]
#: The pages a newcomer starts from: each must show several commands.
FIRST_PAGES = [ROOT / "README.md", ROOT / "docs" / "quickstart.md"]
PAGES = sorted(
    {
        *FIRST_PAGES,
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "examples").rglob("*.md"),
    }
)
SHELL_BLOCK = re.compile(r"^[ \t]*```(?:sh|bash|shell|console)[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
VARIABLE = re.compile(r"\bOUTBOX_[A-Z0-9_]*[A-Z0-9]\b")
#: Where a command ends for the shell.
OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}


def outbox_commands(text: str) -> list[list[str]]:
    """The argument lists of the `outbox` commands in the shell blocks of a page."""
    commands = []
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["docker", "compose"] and "outbox" in words:
                words = words[words.index("outbox") :]
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words = words[1:]  # VAR=value outbox ...
            if not words or words[0] != "outbox":
                continue
            args = []
            for word in words[1:]:
                if word in OPERATORS or word.startswith((">", "<", "|")):
                    break
                args.append(word)
            commands.append(args)
    return commands


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _cases() -> list[object]:
    return [
        pytest.param(_name(page), args, id=f"{_name(page)}: outbox {shlex.join(args)}")
        for page in PAGES
        for args in outbox_commands(page.read_text(encoding="utf-8"))
    ]


def test_the_pages_have_outbox_commands() -> None:
    per_page = {
        page: len(outbox_commands(page.read_text(encoding="utf-8"))) for page in FIRST_PAGES
    }
    assert all(count >= 5 for count in per_page.values()), per_page


@pytest.mark.parametrize(("page", "args"), _cases())
def test_each_command_parses(page: str, args: list[str]) -> None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help exits 0
            pytest.fail(f"{page}: `outbox {shlex.join(args)}` does not parse: {stderr.getvalue()}")


def test_every_variable_they_name_exists() -> None:
    # The package's variables, and the knobs its tests, benchmarks and `./run` read
    # (the soak's, OUTBOX_TEST_SKIP_ASYNCAPI, OUTBOX_UPDATE_SCREENSHOTS, ...).
    suite = [*Path(__file__).parents[1].rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    suite.append(ROOT / "run")
    knobs = {n for f in suite for n in VARIABLE.findall(f.read_text("utf-8"))}
    known = {v.name for v in settings.ENVIRONMENT} | (knobs - {"OUTBOX_NOT_A_THING"})
    for page in PAGES:
        named = set(VARIABLE.findall(page.read_text(encoding="utf-8")))
        assert named <= known, f"{_name(page)} names unknown variables: {sorted(named - known)}"


def test_the_extraction_itself() -> None:
    text = (
        "```sh\n"
        "export OUTBOX_DATABASE_URL=postgresql://x   # not a command\n"
        "outbox migrate --sql > out.sql   # to a file\n"
        "OUTBOX_SCHEMA=s outbox status --json | jq .\n"
        "docker compose exec handler outbox status\n"
        "outbox dead-letters \\\n  purge 1\n"
        "```\n"
        "```python\noutbox = 1\n```\n"
    )
    assert outbox_commands(text) == [
        ["migrate", "--sql"],
        ["status", "--json"],
        ["status"],
        ["dead-letters", "purge", "1"],
    ]
