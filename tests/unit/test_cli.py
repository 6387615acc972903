"""The conventions of the `outbox` command: its exit codes (as the reference's table says),
help, version and flags."""

from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path

import pytest

import outbox
from outbox import _version, settings
from outbox.cli import build_parser, main
from outbox.cli import operator as cli_operator
from outbox.cli.reference import walk

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_outbox_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for entry in settings.ENVIRONMENT:
        monkeypatch.delenv(entry.name, raising=False)


def _exit_code(argv: list[str]) -> int:
    """main's return value, or the code argparse exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


# -- version --------------------------------------------------------------------------------


def test_version_is_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert outbox.__version__ == metadata.version("pg-kafka-outbox")
    assert _exit_code(["--version"]) == 0
    assert capsys.readouterr().out == f"outbox {outbox.__version__}\n"


def test_version_falls_back_on_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(_name: str) -> str:
        raise metadata.PackageNotFoundError(_name)

    monkeypatch.setattr(metadata, "version", not_installed)
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{_version.version()}"' in text


# -- exit 2: usage errors -------------------------------------------------------------------


def test_no_command_prints_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["--log-level", "DEBUG"]):
        assert _exit_code(argv) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("usage: outbox")
        assert "migrate" in err and "dead-letters" in err and "--version" in err


def test_flags_are_never_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["migrate", "--sql", "--database", "postgresql://h/d"],
        ["--log-lev=DEBUG", "migrate", "--sql"],
        ["dead-letters", "list", "--lim", "3"],
        ["spark", "audit", "--kafka", "k:9092"],
    ):
        assert _exit_code(argv) == 2, argv
        assert "unrecognized arguments" in capsys.readouterr().err
    parsers = [command.parser for command in walk(build_parser())]
    assert len(parsers) > 10
    assert all(not parser.allow_abbrev for parser in parsers)


@pytest.mark.parametrize(
    ("variable", "value", "argv"),
    [
        (settings.LOG_LEVEL, "verbose", ["migrate", "--sql"]),
        (settings.LOG_FORMAT, "xml", ["migrate", "--sql"]),
        (settings.TRANSPORT, "carrier-pigeon", ["producer"]),
    ],
)
def test_a_bad_choice_from_the_environment_is_a_usage_error(
    variable: str,
    value: str,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert f"got {value!r} (from the flag, or from {variable} when the flag is not given)" in err


def test_choices_are_case_insensitive_from_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = build_parser()
    args = parser.parse_args(["--log-level", "debug", "--log-format", "JSON", "migrate"])
    assert (args.log_level, args.log_format) == ("DEBUG", "json")
    monkeypatch.setenv(settings.LOG_LEVEL, "warning")
    monkeypatch.setenv(settings.TRANSPORT, "Postgres")
    args = build_parser().parse_args(["producer"])
    assert (args.log_level, args.transport) == ("WARNING", "postgres")
    assert _exit_code(["--log-level", "loud", "migrate", "--sql"]) == 2


def test_unknown_commands_and_missing_arguments_exit_2() -> None:
    assert _exit_code(["nonsense"]) == 2
    assert _exit_code(["consumer", "--group", "g"]) == 2  # --topic is required
    assert _exit_code(["dead-letters"]) == 2


# -- outbox consumer: its topics, from a registry or --topic -----------------------------------

REGISTRY = """
from outbox import Handlers

handlers = Handlers()


@handlers.handler("orders.created")
def created(message, conn):
    pass


@handlers.handler("orders.cancelled")
def cancelled(message, conn):
    pass
"""


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """MODULE:ATTRIBUTE of a Handlers registry of orders.created and orders.cancelled."""
    (tmp_path / "cli_registry_module.py").write_text(REGISTRY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_registry_module:handlers"


def test_topic_takes_comma_lists_repeated_and_collapses_duplicates() -> None:
    args = build_parser().parse_args(
        ["consumer", "--topic", "a, b", "--topic", "b,c", "--topic=a", "--group", "g"]
    )
    assert args.topics == ["a", "b", "c"]
    assert build_parser().parse_args(["consumer", "--topic", "x.y", "--group", "g"]).topics == [
        "x.y"
    ]


def test_topics_and_group_come_from_the_environment_and_the_flags_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(settings.TOPICS, "x, y,x")
    monkeypatch.setenv(settings.GROUP, "from-env")
    args = build_parser().parse_args(["consumer"])
    assert (args.topics, args.group) == (["x", "y"], "from-env")
    args = build_parser().parse_args(["consumer", "--topic", "z,w", "--group", "g"])
    assert (args.topics, args.group) == (["z", "w"], "g")
    monkeypatch.setenv(settings.TOPICS, "")  # empty: as unset
    assert build_parser().parse_args(["consumer"]).topics is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a,,b", "empty topic name"),
        ("a,", "empty topic name"),
        ("", "empty topic name"),
        ("orders/created", "contains '/'"),
        ("..", "reserved"),
        ("a" * 250, "at most 249"),
    ],
)
def test_a_bad_topic_list_is_a_usage_error_from_the_flag_or_the_variable(
    text: str,
    reason: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exit_code(["consumer", "--topic", text, "--group", "g"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("outbox consumer: error: argument --topic: ") and reason in last
    assert f"from {settings.TOPICS} when the flag is not given" in last
    if text:
        monkeypatch.setenv(settings.TOPICS, text)
        assert _exit_code(["consumer", "--group", "g"]) == 2
        assert reason in capsys.readouterr().err


def test_a_consumer_without_registry_and_topics_is_a_one_line_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exit_code(["consumer", "--group", "g"]) == 2
    assert capsys.readouterr().err == (
        "outbox: error: give the Handlers registry MODULE:ATTRIBUTE whose topics to consume, "
        f"or --topic (or set {settings.TOPICS}) for a consumer without handlers\n"
    )


def test_a_consumer_without_group_is_one_line_and_exit_1(
    registry: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["consumer", "--topic", "t"], ["consumer", registry]):
        assert main(argv) == 1
        assert capsys.readouterr().err == (
            f"outbox: error: --group is required (or set {settings.GROUP})\n"
        )


def test_a_registry_that_does_not_import_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, said in [
        (["consumer", "no_such_module_here:handlers"], "cannot import 'no_such_module_here'"),
        (["consumer", "outbox:Broker"], "not an outbox.Handlers registry"),
        (["consumer", "no-colon"], "must be given as module:attribute"),
    ]:
        assert main([*argv, "--group", "g"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("outbox: error: ") and said in err, err


def test_the_consumer_reads_the_registered_topics_or_exactly_the_listed_ones(
    registry: str,
) -> None:
    from outbox.cli.command import _consumed

    args = build_parser().parse_args(["consumer", registry, "--group", "g"])
    assert _consumed(args) == (
        ["orders.cancelled", "orders.created"],
        ["orders.cancelled", "orders.created"],
    )
    args = build_parser().parse_args(["consumer", registry, "--topic", "orders.created,other"])
    assert _consumed(args) == (
        ["orders.created", "other"],
        ["orders.cancelled", "orders.created"],
    )
    args = build_parser().parse_args(["consumer", "--topic", "t"])
    assert _consumed(args) == (["t"], None)


def test_the_subscription_says_what_does_not_match_the_registry() -> None:
    from outbox.daemons.consumer import Subscription

    def subscription(topics: list[str], handled: list[str] | None) -> Subscription:
        return Subscription(group="g", topics=topics, handled=handled)

    assert subscription(["a", "b"], None).warnings() == []
    assert subscription(["a", "b"], ["b", "a"]).warnings() == []
    warnings = subscription(["a", "b"], ["b", "c"]).warnings()
    assert len(warnings) == 2
    assert warnings[0].startswith("topic 'a' is consumed but no handler") and "dead" in warnings[0]
    assert warnings[1].startswith("topic 'c' has a handler but this consumer does not consume")


# -- help shows the defaults ----------------------------------------------------------------


def test_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    for command in walk(build_parser()):
        formatter = command.parser._get_formatter()
        for action in command.parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if action.default in (None, False, [], "", argparse.SUPPRESS):
                continue
            shown = formatter._expand_help(action)
            assert "default" in shown, (command.name, action.option_strings, shown)
    assert _exit_code(["producer", "--help"]) == 0
    assert "(default: 1000)" in " ".join(capsys.readouterr().out.split())  # --batch-size


def test_help_shows_no_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.DATABASE_URL, "postgresql://app:hunter2@db/app")
    monkeypatch.setenv(settings.CONSOLE_TOKEN, "s3cr3t-token")
    for command in walk(build_parser()):
        text = command.parser.format_help()
        assert "hunter2" not in text and "s3cr3t-token" not in text, command.name


# -- exit 1, 130 ----------------------------------------------------------------------------


def test_a_missing_setting_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 1
    assert capsys.readouterr().err == (
        "outbox: error: --database-url is required (or --databases-file, or set "
        f"{settings.DATABASE_URL})\n"
    )


def test_demo_says_where_it_runs_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """The package does not ship examples/: `outbox demo` is one line pointing at the checkout."""
    for argv in (["demo"], ["demo", "--messages", "5"]):
        assert main(argv) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.count("\n") == 1
        assert err.startswith("outbox: error: the demo runs the example services")
        assert "./run demo" in err and "python -m examples.demo" in err


def test_ctrl_c_outside_a_daemon_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_operator, "run_operator_command", interrupted)
    assert main(["status", "--database-url", "postgresql://h/d"]) == 130


def test_the_exit_codes_table_lists_each_code_tested_here() -> None:
    from outbox.cli.reference import EXIT_CODES

    codes = [line.split("|")[1].strip() for line in EXIT_CODES.splitlines() if line[:2] == "| "]
    assert codes == ["code", "0", "1", "2", "3", "130"]


def test_database_urls_take_sqlalchemys_driver_form_and_refuse_other_databases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from outbox.cli import build_parser

    parser = build_parser()
    one = ["dead-letters", "list", "--database-url"]
    args = parser.parse_args([*one, "postgresql+psycopg://u@h:5/db"])
    assert args.database_url == "postgresql://u@h:5/db"
    args = parser.parse_args([*one, "host=h dbname=db"])
    assert args.database_url == "host=h dbname=db"
    args = parser.parse_args(["status", "--database-url", "a=postgresql+psycopg://u@h:5/db"])
    assert args.database_url == ["a=postgresql://u@h:5/db"]
    args = parser.parse_args(["migrate", "--log-url", "postgres://u@h/log"])
    assert args.log_url == "postgres://u@h/log"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["status", "--database-url", "mysql://u:hunter22@h/db"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "scheme 'mysql' is not a PostgreSQL URL" in err and "hunter22" not in err


def test_python_dash_m_outbox_runs_the_command() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "outbox", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.startswith("outbox "), result.stderr


def test_a_reserved_schema_name_is_refused() -> None:
    from outbox import Broker, ConfigurationError

    for name in ("pg_catalog", "pg_temp", "information_schema"):
        with pytest.raises(ConfigurationError, match="PostgreSQL's own"):
            Broker(schema=name)


def test_a_routing_consumers_bad_settings_are_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before any connection: the databases here do not exist.
    monkeypatch.delenv(settings.ROUTE_HEADER, raising=False)
    monkeypatch.delenv(settings.QUARANTINE_DATABASE, raising=False)
    base = ["consumer", "--topic", "t", "--group", "g", "--kafka-bootstrap", "nowhere:1"]
    two = [
        "--database-url",
        "a=postgresql://u:pw@nowhere/a",
        "--database-url",
        "b=postgresql://nowhere/b",
    ]
    for extra, said in [
        (
            ["--quarantine-database", "c"],
            "--quarantine-database 'c' is not one of the databases served (a, b)",
        ),
        ([], "routing records by tenant needs --quarantine-database NAME"),  # not guessed
        (["--route-header", "content-type"], "tenant header name 'content-type' is not valid"),
        (
            ["--route-header", "outbox-message-id"],
            "tenant header name 'outbox-message-id' is not valid",
        ),
    ]:
        assert main([*base, *two, *extra]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("outbox: error: ") and said in err, err
        assert "pw" not in err
