"""The databases a command serves: `[NAME[/SCHEMA]=]URL` entries from flags, a file or the env."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from outbox.cli.arguments import add_databases, databases_of
from outbox.core.databases import Database, check_distinct, gather, parse_entry, read_file
from outbox.core.errors import ConfigurationError


def test_an_entry_is_named_or_named_after_its_database() -> None:
    assert parse_entry("postgresql://u:p@h/orders", "outbox") == Database(
        "orders", "postgresql://u:p@h/orders", "outbox"
    )
    assert parse_entry("acme=postgresql://u@h/t1", "outbox") == Database(
        "acme", "postgresql://u@h/t1", "outbox"
    )
    assert parse_entry("acme/billing=postgresql://u@h/t1", "outbox") == Database(
        "acme", "postgresql://u@h/t1", "billing"
    )
    assert parse_entry("host=h dbname=shop", "outbox").name == "shop"
    assert parse_entry("eu=host=h dbname=shop", "outbox") == Database(
        "eu", "host=h dbname=shop", "outbox"
    )
    assert parse_entry("host=h", "outbox", index=2).name == "database3"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("not a url", "NAME=URL"),
        ("acme=", "NAME=URL"),
        ("a" * 64 + "=postgresql://h/d", "database name"),
        ("-x=postgresql://h/d", "database name"),
        ("acme/Bad=postgresql://h/d", "schema 'Bad'"),
        ("acme/pg_x=postgresql://h/d", "PostgreSQL's own"),
        ("acme/" + "s" * 64 + "=postgresql://h/d", "not valid"),
    ],
)
def test_a_bad_entry_is_one_clear_error(entry: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_entry(entry, "outbox")


def test_a_bad_entry_never_shows_its_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_entry("Bad Name=postgresql://u:s3cretpw@h/d", "outbox")
    assert "s3cretpw" not in str(caught.value)


def test_names_and_queues_are_distinct() -> None:
    a = Database("a", "postgresql://h/d", "outbox")
    with pytest.raises(ConfigurationError, match="given twice"):
        check_distinct([a, Database("a", "postgresql://h/e", "outbox")])
    with pytest.raises(ConfigurationError, match="same database and schema"):
        check_distinct([a, Database("b", "postgresql://h/d", "outbox")])
    assert len(check_distinct([a, Database("b", "postgresql://h/d", "other")])) == 2


def test_a_databases_file_skips_comments_and_names_the_bad_line(tmp_path: Path) -> None:
    file = tmp_path / "tenants.txt"
    file.write_text("# tenants\n\nacme=postgresql://h/acme\n  globex/gx=postgresql://h/g  \n")
    assert read_file(file, "outbox") == [
        Database("acme", "postgresql://h/acme", "outbox"),
        Database("globex", "postgresql://h/g", "gx"),
    ]
    file.write_text("acme=postgresql://h/acme\nbad entry\n")
    with pytest.raises(ConfigurationError, match=r"line 2 of tenants\.txt"):
        read_file(file, "outbox")
    file.write_bytes(b"acme=postgresql://h/\xff\n")
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        read_file(file, "outbox")
    with pytest.raises(ConfigurationError, match="cannot read"):
        read_file(tmp_path / "missing.txt", "outbox")


def test_flags_then_file_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_DATABASES_FILE", raising=False)
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql://h/fallback")
    parser = argparse.ArgumentParser()
    add_databases(parser)
    file = tmp_path / "more.txt"
    file.write_text("c=postgresql://h/c\n")
    args = parser.parse_args(
        [
            "--database-url",
            "a=postgresql+psycopg://h/a",
            "--database-url",
            "b/s=postgresql://h/b",
            "--databases-file",
            str(file),
        ]
    )
    assert databases_of(args) == [
        Database("a", "postgresql://h/a", "outbox"),
        Database("b", "postgresql://h/b", "s"),
        Database("c", "postgresql://h/c", "outbox"),
    ]
    assert databases_of(parser.parse_args([])) == [
        Database("fallback", "postgresql://h/fallback", "outbox")
    ]
    monkeypatch.delenv("OUTBOX_DATABASE_URL")
    with pytest.raises(ConfigurationError, match="--database-url is required"):
        databases_of(parser.parse_args([]))
    assert gather([], "outbox") == []


def test_a_command_of_one_database_refuses_a_second_and_reads_a_named_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from outbox.cli.arguments import single_database
    from outbox.cli.command import build_parser

    parser = build_parser()
    for command in (["spark", "consumer"], ["dead-letters", "list"]):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(
                [
                    *command,
                    "--database-url",
                    "postgresql://h/a",
                    "--database-url",
                    "b=postgresql://h/b",
                ]
            )
        assert exited.value.code == 2
        assert "given more than once" in capsys.readouterr().err
    args = parser.parse_args(
        ["dead-letters", "list", "--database-url", "acme/billing=postgresql://h/a"]
    )
    single_database(args)
    assert (args.database_url, args.schema) == ("postgresql://h/a", "billing")
    args = parser.parse_args(
        ["dead-letters", "list", "--database-url", "host=h dbname=a password=x=y"]
    )
    single_database(args)
    assert args.database_url == "host=h dbname=a password=x=y"  # libpq's to judge, as before
