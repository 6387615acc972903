"""librdkafka settings from the environment and from a properties file, besides --kafka-config."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaException, Producer

from outbox import settings
from outbox.cli import build_parser
from outbox.cli.reference import walk
from outbox.core.errors import ConfigurationError
from outbox.kafka.sources import (
    UNDERSCORED,
    environment_settings,
    key_of_variable,
    read_properties,
    variable_of_key,
)
from tests.unit.deployment_checks import check_no_secret, environment, secrets_in

ROOT = Path(__file__).resolve().parents[2]


def _commands_with_kafka_config() -> Iterator[tuple[str, ...]]:
    for command in walk(build_parser()):
        if any("--kafka-config" in a.option_strings for a in command.parser._actions):
            yield command.path


KAFKA_COMMANDS = sorted(_commands_with_kafka_config())
#: What each command needs besides the flags under test to parse.
EXTRA = {
    ("spark", "audit"): ["--service", "orders=postgresql://h/db"],
    ("asyncapi",): ["app:handlers"],
    ("run",): ["app:handlers"],
}


def test_a_variable_names_its_key_with_dots_as_underscores() -> None:
    assert key_of_variable("OUTBOX_KAFKA_CONFIG_SASL_PASSWORD") == "sasl.password"
    assert key_of_variable("OUTBOX_KAFKA_CONFIG_SECURITY_PROTOCOL") == "security.protocol"
    assert variable_of_key("ssl.key.password") == "OUTBOX_KAFKA_CONFIG_SSL_KEY_PASSWORD"
    assert key_of_variable("OUTBOX_KAFKA_CONFIG_LOG_LEVEL") == "log_level"
    # Not settings: the file's own variable, other variables, malformed names.
    for name in ("OUTBOX_KAFKA_CONFIG_FILE", "OUTBOX_KAFKA_BOOTSTRAP", "OUTBOX_KAFKA_CONFIG_"):
        assert key_of_variable(name) is None
    assert key_of_variable("OUTBOX_KAFKA_CONFIG_A__B") is None


def test_the_underscored_keys_are_librdkafka_s_and_their_dotted_twins_are_not() -> None:
    """The ambiguity rule holds against the real librdkafka: each underscored key it takes as
    text is accepted, the dotted spelling the general rule would give is unknown to it."""
    for suffix, key in UNDERSCORED.items():
        Producer({"bootstrap.servers": "127.0.0.1:1", key: "0"})
        with pytest.raises(KafkaException, match="No such configuration property"):
            Producer({"bootstrap.servers": "127.0.0.1:1", suffix.lower().replace("_", "."): "0"})


def test_empty_variables_are_unset() -> None:
    env = {
        "OUTBOX_KAFKA_CONFIG_SASL_USERNAME": "u",
        "OUTBOX_KAFKA_CONFIG_SASL_PASSWORD": "  ",
        "OUTBOX_KAFKA_CONFIG_FILE": "/nowhere",
        "PATH": "/bin",
    }
    assert environment_settings(env) == {"sasl.username": "u"}


def test_a_properties_file_has_key_value_lines_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text(
        "# the cluster\n\nsecurity.protocol = SASL_SSL\nsasl.password=a=b#c\n  # indented\n"
    )
    assert read_properties(str(path)) == {"security.protocol": "SASL_SSL", "sasl.password": "a=b#c"}


def test_a_bad_line_names_the_file_and_the_line_but_never_shows_it(tmp_path: Path) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text("client.id=a\nsasl.password hunter22\n")
    with pytest.raises(ConfigurationError) as raised:
        read_properties(str(path))
    assert f"{path}:2:" in str(raised.value)
    assert "hunter22" not in str(raised.value)


@pytest.mark.parametrize("content", [None, b"\xff\xfe"], ids=["missing", "not-utf8"])
def test_an_unreadable_file_stops_the_command_with_one_line(
    tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "kafka.properties"
    if content is not None:
        path.write_bytes(content)
    env = {**os.environ, settings.KAFKA_CONFIG_FILE: str(path)}
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "producer"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0] and "Kafka settings file" in lines[0]


def test_the_commands_that_take_kafka_config_include_every_kafka_command() -> None:
    """The list of the settings registry is the parser's."""
    assert KAFKA_COMMANDS
    for path in KAFKA_COMMANDS:
        assert f"`outbox {' '.join(path)}`" in settings.KAFKA_COMMANDS


@pytest.mark.parametrize("path", KAFKA_COMMANDS, ids=" ".join)
def test_a_flag_beats_a_variable_which_beats_the_file(
    tmp_path: Path, path: tuple[str, ...]
) -> None:
    properties = tmp_path / "kafka.properties"
    properties.write_text(
        "client.id=from-file\nsasl.username=file-user\nsasl.password=file-secret\n"
    )
    env = {
        settings.KAFKA_CONFIG_FILE: str(properties),
        "OUTBOX_KAFKA_CONFIG_SASL_PASSWORD": "env-secret",
        "OUTBOX_KAFKA_CONFIG_CLIENT_ID": "from-env",
    }
    argv = [*path, *EXTRA.get(path, []), "--kafka-config", "client.id=from-flag"]
    with environment(env):
        args = build_parser().parse_args(argv)
    assert dict(args.kafka_config) == {
        "client.id": "from-flag",
        "sasl.username": "file-user",
        "sasl.password": "env-secret",
    }


def test_the_file_flag_replaces_the_file_variable(tmp_path: Path) -> None:
    first, second = tmp_path / "a.properties", tmp_path / "b.properties"
    first.write_text("client.id=a\n")
    second.write_text("client.id=b\n")
    with environment({settings.KAFKA_CONFIG_FILE: str(first)}):
        args = build_parser().parse_args(["producer", "--kafka-config-file", str(second)])
    assert dict(args.kafka_config) == {"client.id": "b"}


# -- no secret on a documented command line ----------------------------------------------------

FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
INLINE = re.compile(r"`(outbox [^`]+)`")


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*.md")]
    return sorted(p for p in pages if "node_modules" not in p.parts)


def documented_command_lines(text: str) -> list[list[str]]:
    """The words of every `outbox ...` command of a page, from `outbox` on: in its code blocks
    (continuation lines joined; whatever runs it before, `docker compose exec X outbox` or
    `VAR=value outbox`, dropped) and in its inline code."""
    lines = [
        line for block in FENCE.findall(text) for line in block.replace("\\\n", " ").splitlines()
    ]
    lines.extend(INLINE.findall(text))
    commands = []
    for line in lines:
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        if "outbox" in words:
            commands.append(words[words.index("outbox") :])
    return commands


def test_secrets_in_finds_secret_settings_flags_and_url_passwords() -> None:
    assert secrets_in(["outbox", "consumer", "--kafka-config", "sasl.password=x"]) == [
        "sasl.password=x"
    ]
    assert secrets_in(["--kafka-config=ssl.key.location=/k"]) == [
        "--kafka-config=ssl.key.location=/k"
    ]
    assert secrets_in(["--auth-token", "t"]) == ["--auth-token"]
    assert secrets_in(["--database-url", "postgresql://app:pw@db/app"]) == [
        "postgresql://app:pw@db/app"
    ]
    assert (
        secrets_in(["--kafka-config", "client.id=x", "--database-url", "postgresql://db/a"]) == []
    )


def test_the_docs_have_outbox_command_lines() -> None:
    assert sum(len(documented_command_lines(p.read_text("utf-8"))) for p in _pages()) > 50


YAML_FENCE = re.compile(r"^[ \t]*```ya?ml[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)


def documented_yaml_command_lines(text: str) -> list[list[str]]:
    """The `command`, `args` and `entrypoint` lists of the YAML blocks of a page (a manifest's
    or a compose file's excerpts)."""
    found: list[list[str]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("command", "args", "entrypoint") and isinstance(value, list):
                    found.append([str(v) for v in value])
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for block in YAML_FENCE.findall(text):
        for document in yaml.safe_load_all(block):
            walk(document)
    return found


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_documented_outbox_command_puts_a_secret_on_its_command_line(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for words in [*documented_command_lines(text), *documented_yaml_command_lines(text)]:
        check_no_secret(words, f"{page.relative_to(ROOT)}: `{shlex.join(words)}`")
