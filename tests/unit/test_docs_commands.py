"""Every page's `outbox` commands parse, the commands and flags its prose names exist, and the
variables it names exist.

The pages: README.md, every page of docs/ and every page of examples/. Every line of a shell
code block (```sh) that runs `outbox` (directly or through `docker compose exec SERVICE
outbox ...`) is split like a shell would (comments dropped, a pipe or redirection ends the
command) and given to the real argument parser. An `outbox ...` span of the prose names a
command and flags that must exist (its values are not checked). Every `OUTBOX_*` variable a
page mentions must be one outbox, its tests, benchmarks or `./run` read.
"""

from __future__ import annotations

import argparse
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
        named = {
            n
            for n in VARIABLE.findall(page.read_text(encoding="utf-8"))
            if not settings.is_read(n)  # OUTBOX_KAFKA_CONFIG_<NAME>: one per librdkafka key
        }
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


# -- commands named in the prose -------------------------------------------------------------

INLINE = re.compile(r"`(outbox [^`]+)`")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.M | re.S)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def named_wrongly(span: str, parser: argparse.ArgumentParser) -> str | None:
    """Why the command or a flag that an inline `outbox ...` span names does not exist, or
    None. Values and placeholders are not checked: prose names a command, it need not be a
    whole command line."""
    words = [w.strip("[](),") for w in span.replace("|", " ").split()[1:]]
    path = ["outbox"]
    options = _options(parser)
    for word in words:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            if flag not in options:
                return f"{' '.join(path)} has no flag {flag}"
            continue
        sub = _subcommands(parser)
        if sub and re.fullmatch(r"[a-z][a-z-]*", word):
            if word not in sub:
                return f"{' '.join(path)} has no command {word}"
            parser, path = sub[word], [*path, word]
            options |= _options(parser)
    return None


def _inline_cases() -> list[object]:
    cases: list[object] = []
    for page in PAGES:
        prose = FENCE.sub("", page.read_text(encoding="utf-8")).replace("\n", " ")
        for span in dict.fromkeys(INLINE.findall(prose)):
            cases.append(pytest.param(_name(page), span, id=f"{_name(page)}: {span}"))
    return cases


@pytest.mark.parametrize(("page", "span"), _inline_cases())
def test_each_command_the_prose_names_exists(page: str, span: str) -> None:
    problem = named_wrongly(span, build_parser())
    assert problem is None, f"{page}: `{span}`: {problem}"


def test_the_inline_check_itself() -> None:
    parser = build_parser()
    assert named_wrongly("outbox dead-letters list --queue producer", parser) is None
    assert named_wrongly("outbox status [--json] [--check]", parser) is None
    assert named_wrongly("outbox status [--jsn]", parser) == "outbox status has no flag --jsn"
    assert named_wrongly("outbox dead-letters --queue producer", parser) == (
        "outbox dead-letters has no flag --queue"
    )
    assert named_wrongly("outbox deadletters list", parser) == "outbox has no command deadletters"
    assert named_wrongly("outbox dead-letters list | show | requeue", parser) is None
    assert named_wrongly("outbox handler --lease", parser) is None
