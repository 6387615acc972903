"""docs/reference/configuration.md is what `python -m outbox.cli.reference` prints, and complete."""

from __future__ import annotations

import argparse
import ast
import difflib
import re
from pathlib import Path

import pytest

from outbox import settings
from outbox.cli import build_parser
from outbox.cli import reference as cli_reference

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "configuration.md"
PACKAGE = ROOT / "outbox"


def test_the_committed_reference_is_what_the_generator_prints() -> None:
    expected = cli_reference.render()
    actual = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    if actual != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    actual.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    "docs/reference/configuration.md (committed)",
                    "python -m outbox.cli.reference (generated)",
                )
            )[:60]
        )
        pytest.fail(
            f"docs/reference/configuration.md is out of date; regenerate it with\n\n"
            f"    {cli_reference.COMMAND}\n\n{diff}",
            pytrace=False,
        )


def test_the_reference_does_not_depend_on_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = cli_reference.render()
    monkeypatch.setenv(settings.SCHEMA, "from_env")
    monkeypatch.setenv(settings.DATABASE_URL, "postgresql://secret@db/app")
    monkeypatch.setenv(settings.KAFKA_BOOTSTRAP, "kafka:9092")
    assert cli_reference.render() == clean


def test_every_command_and_nested_command_has_a_section() -> None:
    text = cli_reference.render()
    names = [command.name for command in cli_reference.walk(build_parser()) if command.path]
    assert "outbox dead-letters requeue" in names
    assert "outbox spark consumer" in names
    for name in names:
        assert re.search(rf"^## `{re.escape(name)}[` ]", text, re.MULTILINE), name


def test_flags_show_the_variable_they_default_from() -> None:
    text = cli_reference.render()
    producer = text.split("## `outbox producer`")[1].split("\n## ")[0]
    assert "| `--database-url [NAME[/SCHEMA]=]URL` | `OUTBOX_DATABASE_URL` |" in producer
    assert "| `--databases-file PATH` | `OUTBOX_DATABASES_FILE` |" in producer
    assert "| `--schema SCHEMA` | `OUTBOX_SCHEMA` | `outbox` |" in producer
    assert "| `--kafka-bootstrap KAFKA_BOOTSTRAP` | `OUTBOX_KAFKA_BOOTSTRAP` |" in producer
    assert "| `--batch-size BATCH_SIZE` |  | `1000` |" in producer


def test_every_flag_has_a_meaning() -> None:
    missing = []
    for command in cli_reference.walk(build_parser()):
        for action in command.parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help and (*command.path, action.dest) not in (
                cli_reference.FALLBACK_HELP
            ):
                missing.append(f"{command.name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, (
        "flags without a help text (give them help= in the code, or an entry in "
        f"outbox.cli.reference.FALLBACK_HELP): {missing}"
    )


def test_every_python_parameter_has_a_meaning() -> None:
    assert "(undocumented)" not in cli_reference.render_python_api(build_parser), (
        "a parameter of Broker, Handlers or Handlers.handler has no entry in "
        "outbox.cli.reference.PARAMETER_MEANINGS"
    )


def test_the_librdkafka_settings_are_listed() -> None:
    text = cli_reference.render_kafka()
    assert "| `enable.idempotence` | `true` | forced |" in text
    assert "| `acks` | `all` | forced |" in text
    assert "| `enable.auto.commit` | `false` | forced |" in text
    assert "| `isolation.level` | `read_committed` | default |" in text


# -- the registry of environment variables ------------------------------------------------------


def _package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_outbox_variable_the_package_mentions_is_registered() -> None:
    unregistered = {
        f"{name} ({path.relative_to(ROOT)})"
        for path in _package_sources()
        for name in re.findall(r"\bOUTBOX_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8"))
        if not settings.is_read(name)
    }
    assert not unregistered, (
        f"register these in outbox/settings.py ENVIRONMENT (and read them through its "
        f"constants): {sorted(unregistered)}"
    )


def _environment_reads(tree: ast.AST) -> list[ast.expr]:
    """The name arguments of os.environ.get(X), os.getenv(X), os.environ[X] in a module."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func in {"os.environ.get", "os.getenv", "environ.get", "getenv"}:
                found.append(node.args[0])
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and ast.unparse(node.value) in {"os.environ", "environ"}
        ):
            found.append(node.slice)
    return found


def test_the_package_reads_no_variable_by_a_literal_name_outside_the_registry() -> None:
    registered = {entry.name for entry in settings.ENVIRONMENT}
    literal_reads = {
        f"{argument.value} ({path.relative_to(ROOT)})"
        for path in _package_sources()
        for argument in _environment_reads(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(argument, ast.Constant)
        and isinstance(argument.value, str)
        and argument.value not in registered
        and argument.value != "PYTHONPATH"  # passed on to the demo's child processes
    }
    assert not literal_reads, (
        f"environment variables read but not registered in outbox/settings.py: "
        f"{sorted(literal_reads)}"
    )


def test_registered_names_are_unique_and_described() -> None:
    names = [entry.name for entry in settings.ENVIRONMENT]
    assert len(names) == len(set(names))
    assert all(entry.meaning and entry.read_by for entry in settings.ENVIRONMENT)
    assert settings.variable(settings.DATABASE_URL).name == "OUTBOX_DATABASE_URL"
    with pytest.raises(KeyError):
        settings.variable("OUTBOX_NOT_A_THING")


def test_each_variable_names_every_command_whose_flags_default_from_it() -> None:
    """`read_by` is true: a command with a flag that defaults from a variable (its help says
    `(env NAME`) is named there, itself or its command group (`outbox log-topics`)."""
    mentioned: dict[str, set[str]] = {}
    for command in cli_reference.walk(build_parser()):
        if not command.path:
            continue  # the global flags (--log-level): read by `outbox`
        for action in command.parser._actions:
            for name in re.findall(r"\b(OUTBOX_[A-Z0-9_]+)\b", action.help or ""):
                mentioned.setdefault(name, set()).add(" ".join(command.path))
    untrue = []
    for entry in settings.ENVIRONMENT:
        if entry.read_by.startswith("every command") or entry.read_by == "`outbox`":
            continue
        named = [
            found[len("`outbox ") : -1] for found in re.findall(r"`outbox [a-z -]+`", entry.read_by)
        ]
        for command in sorted(mentioned.get(entry.name, ())):
            if not any(command == n or command.startswith(n + " ") for n in named):
                untrue.append(f"{entry.name}: `outbox {command}`")
    assert untrue == [], "add these commands to the variable's read_by in outbox/settings.py"
