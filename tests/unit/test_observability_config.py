"""Observability settings, the no-op metrics path, and the docs and dashboard against METRICS."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from outbox import transports
from outbox.cli import build_parser
from outbox.core.errors import ConfigurationError
from outbox.observability.health import HealthState, Heartbeat
from outbox.observability.metrics import METRICS, HandlerTally, Metrics, PrometheusMetrics
from outbox.runtime import App, Databases, ObservabilityConfig, Settings

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "outbox-dashboard.json"
HOWTO = ROOT / "docs" / "how-to" / "observability.md"
URL = "postgresql://app:s3cret@db/app"


def kafka_producer(**settings: Any) -> Any:
    """A Producer over Kafka at kafka:9092 (never started), as the composition root builds it."""
    where = transports.settings_of(
        "kafka", kafka_bootstrap="kafka:9092", **settings.pop("transport", {})
    )
    return App(Settings(databases=Databases.of(URL), transport=where, **settings)).producer()


def test_metrics_are_off_by_default_and_cost_nothing() -> None:
    relay = kafka_producer()
    assert type(relay.observability.metrics) is Metrics
    relay.observability.metrics.handler_batch(3, HandlerTally())  # accepted, recorded nowhere
    assert relay.observability.metrics_port is None


def test_metrics_without_prometheus_client_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with pytest.raises(ConfigurationError, match=r"prometheus-client.*\[metrics\]"):
        kafka_producer(observability=ObservabilityConfig(metrics_port=0))


def test_each_daemon_has_its_own_registry() -> None:
    first = PrometheusMetrics("handler", {"daemon": "handler"}, progress_age=lambda: 0.0)
    second = PrometheusMetrics("handler", {"daemon": "handler"}, progress_age=lambda: 0.0)
    tally = HandlerTally()
    tally.handled["t"] = 2
    first.handler_batch(2, tally)
    value = first.registry.get_sample_value
    assert value("outbox_handler_messages_handled_total", {"topic": "t"}) == 2
    assert (
        second.registry.get_sample_value("outbox_handler_messages_handled_total", {"topic": "t"})
        is None
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"metrics_port": 70000}, "metrics_port must be a port"),
        ({"health_port": -1}, "health_port must be a port"),
        ({"metrics_port": 9100, "health_port": 9100}, "different ports"),
        ({"liveness_timeout": 0}, "liveness_timeout must be > 0"),
    ],
)
def test_bad_settings_fail_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ObservabilityConfig(**options)


def test_flags_and_variables_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_HEALTH_PORT", "8081")
    monkeypatch.setenv("OUTBOX_LOG_FORMAT", "json")
    args = build_parser().parse_args(
        ["handler", "m:h", "--metrics-port", "9100", "--metrics-host", "127.0.0.1"]
    )
    from outbox.cli.arguments import runtime_config

    config = runtime_config(args)
    assert (config.metrics_port, config.metrics_host) == (9100, "127.0.0.1")
    assert (config.health_port, config.health_host) == (8081, "0.0.0.0")
    assert args.log_format == "json"
    assert build_parser().parse_args(["producer"]).metrics_port is None


def test_the_startup_description_masks_secrets(caplog: pytest.LogCaptureFixture) -> None:
    relay = kafka_producer(
        transport={"kafka_config": {"sasl.password": "kpw", "sasl.username": "bob"}},
        observability=ObservabilityConfig(metrics_port=9100),
    )
    caplog.set_level(logging.INFO, logger="outbox.producer")
    relay.observability._log_startup()
    (record,) = [r for r in caplog.records if getattr(r, "event", "") == "producer.start"]
    described = record.config  # type: ignore[attr-defined]
    assert described["database_url"] == "host=db user=app password=*** dbname=app"
    assert described["kafka_config"]["sasl.password"] == "***"
    assert described["kafka_config"]["sasl.username"] == "bob"
    assert described["kafka_config"]["enable.idempotence"] == "true"  # in force: forced
    assert described["transport"] == "kafka" and described["metrics_port"] == 9100
    assert described["batch_size"] == 1000  # the daemon's own tuning
    assert "s3cret" not in json.dumps(described, default=str)
    assert "kpw" not in json.dumps(described, default=str)


def test_readiness_needs_recent_passing_checks_and_liveness_a_recent_beat() -> None:
    heartbeat = Heartbeat()
    state = HealthState(heartbeat=heartbeat, liveness_timeout=5, check_expiry=10)
    assert state.ready() == (False, "starting")
    state.running = True
    assert state.ready()[0] is False  # not checked yet
    state.record({"postgres": None, "kafka": "Kafka unreachable: timed out"})
    assert state.ready() == (False, "Kafka unreachable: timed out")
    state.record({"postgres": None, "kafka": None})
    assert state.ready() == (True, "ok")
    assert state.checked_at is not None
    state.checked_at -= 11
    assert "have not completed" in state.ready()[1]
    heartbeat.last -= 6
    assert state.live()[0] is False and "no progress" in state.live()[1]


# -- docs and dashboard -------------------------------------------------------------------------

_SUFFIXES = ("_bucket", "_count", "_sum")


def _dashboard_metrics() -> set[str]:
    text = DASHBOARD.read_text(encoding="utf-8")
    dashboard = json.loads(text)
    assert dashboard["title"]
    names = set()
    for expression in re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', text):
        for name in re.findall(r"\boutbox_[a-z_]+", expression):
            for suffix in _SUFFIXES:
                name = name.removesuffix(suffix)
            names.add(name)
    return names


def test_the_dashboard_uses_exactly_the_exported_metrics() -> None:
    exported = {m.name for m in METRICS}
    used = _dashboard_metrics()
    assert used - exported == set(), "the dashboard queries metrics that do not exist"
    assert exported - used == set(), "exported metrics missing from the dashboard"


def test_the_howto_lists_every_metric_with_its_type_and_labels() -> None:
    text = HOWTO.read_text(encoding="utf-8")
    for metric in METRICS:
        rows = [line for line in text.splitlines() if line.startswith(f"| `{metric.name}` |")]
        row = rows[0] if rows else None
        assert row is not None, f"{metric.name} is not in {HOWTO.name}"
        assert metric.type in row, f"{metric.name}: type {metric.type} not in its row"
        for label in metric.labels:
            assert f"`{label}`" in row, f"{metric.name}: label {label} not in its row"
