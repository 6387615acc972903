"""docker-compose.yml runs the commands and variables the code accepts (no Docker needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deployment_checks import (
    DAEMONS,
    check_handlers,
    check_kafka_settings,
    check_no_secret,
    check_python_module,
    check_required,
    check_variables,
    parse_outbox,
)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    result: dict[str, dict[str, Any]] = document["services"]
    return result


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=VALUE", ...]
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _depends(service: dict[str, Any]) -> dict[str, str]:
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return dict.fromkeys(depends, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in depends.items()}


def _outbox_services(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {
        name: service["command"][1:]
        for name, service in services.items()
        if isinstance(service.get("command"), list) and service["command"][:1] == ["outbox"]
    }


def test_every_outbox_command_parses_with_what_it_needs(
    services: dict[str, dict[str, Any]],
) -> None:
    commands = _outbox_services(services)
    kinds = {
        parse_outbox(argv, _env(services[name]), name).command for name, argv in commands.items()
    }
    assert kinds == {"migrate", "producer", "consumer", "handler"}
    for name, argv in commands.items():
        args = parse_outbox(argv, _env(services[name]), name)
        check_required(args, name)
        check_kafka_settings(args, name)


def test_every_outbox_variable_is_one_the_package_reads(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        check_variables(_env(service), name)


def test_every_daemon_waits_for_the_migration_of_its_database(
    services: dict[str, dict[str, Any]],
) -> None:
    commands = _outbox_services(services)
    migrations = {
        _env(services[name])["OUTBOX_DATABASE_URL"]: name
        for name, argv in commands.items()
        if argv[0] == "migrate"
    }
    assert len(migrations) == 2, "one migrate service per database"
    for name, argv in commands.items():
        args = parse_outbox(argv, _env(services[name]), name)
        if args.command not in DAEMONS:
            continue
        url = args.database_url
        if isinstance(url, list):  # a command of many databases; each here serves one
            (url,) = url
        migrate = migrations.get(url)
        assert migrate, f"{name}: no migrate service for {url}"
        assert _depends(services[name]).get(migrate) == "service_completed_successfully", (
            f"{name} must depend on {migrate} with condition service_completed_successfully"
        )


def test_daemon_healthchecks_ask_their_health_port(services: dict[str, dict[str, Any]]) -> None:
    for name, argv in _outbox_services(services).items():
        args = parse_outbox(argv, _env(services[name]), name)
        if args.command not in DAEMONS:
            continue
        assert args.health_port, f"{name}: no --health-port / OUTBOX_HEALTH_PORT"
        probe = " ".join(services[name]["healthcheck"]["test"])
        assert f":{args.health_port}/readyz" in probe, f"{name}: healthcheck misses the port"


def test_dependencies_exist_and_can_be_waited_for(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for target, condition in _depends(service).items():
            assert target in services, f"{name} depends on a service that does not exist: {target}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no healthcheck"
            if condition == "service_completed_successfully":
                assert services[target].get("restart", "no") == "no", f"{target} is one-shot"


def test_kafka_is_apache_kafka_in_kraft_mode_advertised_to_the_daemons(
    services: dict[str, dict[str, Any]],
) -> None:
    kafka = services["kafka"]
    env = _env(kafka)
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in env["KAFKA_PROCESS_ROLES"]
    advertised = {
        address.split("://", 1)[1] for address in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    }
    bootstraps = {
        _env(service)["OUTBOX_KAFKA_BOOTSTRAP"]
        for service in services.values()
        if "OUTBOX_KAFKA_BOOTSTRAP" in _env(service)
    }
    assert bootstraps and bootstraps <= advertised


def test_handlers_and_example_modules_import(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the image's working directory holds examples/, as here
    handled: set[str] = set()
    for name, argv in _outbox_services(services).items():
        args = parse_outbox(argv, _env(services[name]), name)
        if args.command == "handler":
            handled.update(check_handlers(args.handlers, name))
    assert handled, "no handler service"
    for name, service in services.items():
        command = service.get("command")
        if isinstance(command, list) and command[:2] == ["python", "-m"]:
            check_python_module(command, name)


def test_the_consumed_topics_are_created_and_handled(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    created = {
        command[command.index("--topic") + 1]
        for service in services.values()
        if isinstance(command := service.get("command"), list)
        and "kafka-topics.sh" in " ".join(command)
    }
    consumed: set[str] = set()
    handled: set[str] = set()
    for name, argv in _outbox_services(services).items():
        args = parse_outbox(argv, _env(services[name]), name)
        if args.command == "consumer":
            # --topic (or OUTBOX_TOPICS) when given, else the registered topics of MODULE:ATTR.
            consumed.update(args.topics or check_handlers(args.handlers, name))
        if args.command == "handler":
            handled.update(check_handlers(args.handlers, name))
    assert consumed and consumed <= created
    assert consumed <= handled


def test_the_image_is_built_from_the_dockerfile_with_the_examples() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "FROM python:3.12-slim" in dockerfile
    assert "ARG EXTRAS=sqlalchemy\n" in dockerfile
    assert 'RUN pip install ".[${EXTRAS}]"' in dockerfile
    assert "COPY examples ./examples" in dockerfile
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for needed in ("!pyproject.toml", "!README.md", "!outbox/", "!migrations/", "!examples/"):
        assert needed in ignore


def test_no_secret_is_on_a_command_line(services: dict[str, dict[str, Any]]) -> None:
    """Secrets come from `environment` or an `env_file`, never from `command` or `entrypoint`,
    which `ps` shows (and `docker compose config` prints)."""
    for name, service in services.items():
        for key in ("command", "entrypoint"):
            words = service.get(key) or []
            check_no_secret(words.split() if isinstance(words, str) else words, f"{name}.{key}")
