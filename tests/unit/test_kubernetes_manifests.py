"""The manifests of docs/how-to/kubernetes.md run commands and variables the code accepts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deployment_checks import (
    DAEMONS,
    check_handlers,
    check_kafka_settings,
    check_no_secret,
    check_required,
    check_variables,
    parse_outbox,
)

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "docs" / "how-to" / "kubernetes").glob("*.yaml"))


@dataclass
class Container:
    """One container of a Deployment or Job, with the environment it would see."""

    where: str
    kind: str
    spec: dict[str, Any]
    pod: dict[str, Any]
    env: dict[str, str]

    @property
    def argv(self) -> list[str]:
        """command + args, with Kubernetes' $(VAR) expansion."""
        words = [*self.spec.get("command", []), *self.spec.get("args", [])]
        return [
            re.sub(r"\$\((\w+)\)", lambda m: self.env.get(m.group(1), m.group(0)), str(w))
            for w in words
        ]


def _containers() -> list[Container]:
    documents = [
        (path.name, doc)
        for path in MANIFESTS
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    ]
    secrets = {
        doc["metadata"]["name"]: {k: str(v) for k, v in doc.get("stringData", {}).items()}
        for _, doc in documents
        if doc["kind"] == "Secret"
    }
    found = []
    for filename, doc in documents:
        if doc["kind"] not in {"Deployment", "Job"}:
            continue
        pod = doc["spec"]["template"]["spec"]
        for spec in pod["containers"]:
            env: dict[str, str] = {}
            for source in spec.get("envFrom", []):
                name = source["secretRef"]["name"]
                assert name in secrets, f"{filename}: no Secret {name} in the manifests"
                env.update(secrets[name])
            for item in spec.get("env", []):
                if "valueFrom" in item:
                    ref = item["valueFrom"]["secretKeyRef"]
                    assert ref["key"] in secrets.get(ref["name"], {}), (
                        f"{filename}: {item['name']} refers to no key {ref['key']} of a Secret "
                        f"{ref['name']} in the manifests"
                    )
                    env[item["name"]] = secrets[ref["name"]][ref["key"]]
                else:
                    env[item["name"]] = str(item["value"])
            where = f"{filename} {doc['kind']} {doc['metadata']['name']}/{spec['name']}"
            found.append(Container(where, doc["kind"], spec, pod, env))
    return found


CONTAINERS = _containers()


def test_there_are_manifests_for_a_migrate_job_and_each_daemon() -> None:
    kinds = {
        (c.kind, parse_outbox(c.argv[1:], c.env, c.where).command)
        for c in CONTAINERS
        if c.argv[:1] == ["outbox"]
    }
    assert kinds == {
        ("Job", "migrate"),
        ("Deployment", "producer"),
        ("Deployment", "consumer"),
        ("Deployment", "handler"),
    }


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.where)
def test_command_parses_with_the_settings_it_needs(
    container: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert container.argv[:1] == ["outbox"], f"{container.where}: not an outbox command"
    args = parse_outbox(container.argv[1:], container.env, container.where)
    check_required(args, container.where)
    check_variables(container.env, container.where)
    check_kafka_settings(args, container.where)
    if args.command in ("handler", "consumer") and args.handlers is not None:
        monkeypatch.chdir(ROOT)  # the example image's working directory holds examples/
        check_handlers(args.handlers, container.where)


@pytest.mark.parametrize("container", CONTAINERS, ids=lambda c: c.where)
def test_no_secret_is_on_a_command_line(container: Container) -> None:
    """Secrets come from the environment (a Secret by envFrom or secretKeyRef), never from
    `command` or `args`, which Kubernetes expands `$(VAR)` into and `ps` shows."""
    words = [*container.spec.get("command", []), *container.spec.get("args", [])]
    check_no_secret([str(w) for w in words], container.where)


def test_the_consumer_takes_its_kafka_password_from_a_secret() -> None:
    """The SASL example: every librdkafka setting by variable, the password by secretKeyRef."""
    (consumer,) = [c for c in CONTAINERS if c.argv[:2] == ["outbox", "consumer"]]
    args = parse_outbox(consumer.argv[1:], consumer.env, consumer.where)
    settings = dict(args.kafka_config)
    assert settings["security.protocol"] == "SASL_SSL"
    assert settings["sasl.password"] == "change-me-too"
    (item,) = [i for i in consumer.spec["env"] if i["name"] == "OUTBOX_KAFKA_CONFIG_SASL_PASSWORD"]
    assert "secretKeyRef" in item["valueFrom"]


@pytest.mark.parametrize(
    "container", [c for c in CONTAINERS if c.kind == "Deployment"], ids=lambda c: c.where
)
def test_daemons_are_probed_on_their_health_port(container: Container) -> None:
    args = parse_outbox(container.argv[1:], container.env, container.where)
    assert args.command in DAEMONS
    ports = {p["name"]: p["containerPort"] for p in container.spec.get("ports", [])}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        get = container.spec[probe]["httpGet"]
        assert get["path"] == path, f"{container.where}: {probe} should GET {path}"
        assert ports.get(get["port"], get["port"]) == args.health_port, (
            f"{container.where}: {probe} port is not --health-port {args.health_port}"
        )
    assert args.metrics_port in ports.values(), f"{container.where}: metrics port not exposed"
    # SIGTERM finishes the batch in hand: give it more than Kubernetes' default 30 s where a
    # batch can take that long (the relay waits up to message.timeout.ms for delivery reports).
    assert container.pod["terminationGracePeriodSeconds"] >= 30


def test_every_daemon_database_has_a_migrate_job() -> None:
    migrated = {
        c.env["OUTBOX_DATABASE_URL"]
        for c in CONTAINERS
        if c.kind == "Job" and c.argv[:2] == ["outbox", "migrate"]
    }
    for c in CONTAINERS:
        if c.kind == "Deployment":
            assert c.env["OUTBOX_DATABASE_URL"] in migrated, f"{c.where}: no migrate Job"
