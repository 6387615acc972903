"""Flags shared by the `outbox` subcommands, each with its environment variable."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from outbox import settings
from outbox.core.errors import ConfigurationError
from outbox.core.numbers import flag_type

if TYPE_CHECKING:
    from outbox.observability.runtime import ObservabilityConfig

ENV_DATABASE_URL = settings.DATABASE_URL
ENV_KAFKA_BOOTSTRAP = settings.KAFKA_BOOTSTRAP
ENV_SCHEMA = settings.SCHEMA
ENV_LOG_URL = settings.LOG_URL
TRANSPORTS = ("kafka", "postgres")


def kafka_setting(text: str) -> tuple[str, str]:
    """Parse one `--kafka-config key=value`."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def add_database(parser: argparse.ArgumentParser) -> None:
    """--database-url and --schema."""
    parser.add_argument(
        "--database-url",
        default=os.environ.get(ENV_DATABASE_URL),
        help=f"PostgreSQL URL (env {ENV_DATABASE_URL})",
    )
    parser.add_argument(
        "--schema",
        default=os.environ.get(ENV_SCHEMA, "outbox"),
        help=f"schema of the outbox tables (env {ENV_SCHEMA}; default outbox)",
    )


def add_kafka(parser: argparse.ArgumentParser) -> None:
    """--kafka-bootstrap and the repeatable --kafka-config."""
    parser.add_argument(
        "--kafka-bootstrap",
        default=os.environ.get(ENV_KAFKA_BOOTSTRAP),
        help=f"Kafka bootstrap servers, host:port[,...] (env {ENV_KAFKA_BOOTSTRAP})",
    )
    parser.add_argument(
        "--kafka-config",
        action="append",
        type=kafka_setting,
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka setting; repeatable",
    )


def add_log(parser: argparse.ArgumentParser) -> None:
    """--log-url and --log-schema: where the PostgreSQL log is."""
    parser.add_argument(
        "--log-url",
        default=os.environ.get(ENV_LOG_URL),
        help=f"PostgreSQL URL of the log database, for --transport postgres (env {ENV_LOG_URL})",
    )
    parser.add_argument(
        "--log-schema",
        default=os.environ.get(settings.LOG_SCHEMA, "outbox_log"),
        help=f"schema of the log tables (env {settings.LOG_SCHEMA}; default outbox_log)",
    )


def add_transport(parser: argparse.ArgumentParser) -> None:
    """--transport, and where the PostgreSQL log is."""
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=os.environ.get(settings.TRANSPORT, "kafka"),
        help=f"kafka, or postgres for the log kept in PostgreSQL at --log-url "
        f"(env {settings.TRANSPORT}; default kafka)",
    )
    add_log(parser)


def env_groups() -> list[str]:
    """The consumer groups of OUTBOX_LAG_GROUPS (comma-separated)."""
    return [g.strip() for g in os.environ.get(settings.LAG_GROUPS, "").split(",") if g.strip()]


def add_groups(parser: argparse.ArgumentParser) -> None:
    """The repeatable --group of the commands that show lag."""
    parser.add_argument(
        "--group",
        dest="groups",
        action="append",
        default=None,
        metavar="GROUP",
        help=f"consumer group whose lag is shown; repeatable (env {settings.LAG_GROUPS}, "
        "comma-separated; default every group of the cluster)",
    )


def require(value: str | None, flag: str, env: str) -> str:
    """The value of a required setting, or a ConfigurationError naming its flag and variable."""
    if not value:
        raise ConfigurationError(f"{flag} is required (or set {env})")
    return value


def add_logging(parser: argparse.ArgumentParser) -> None:
    """The global --log-level and --log-format."""
    parser.add_argument(
        "--log-level",
        default=os.environ.get(settings.LOG_LEVEL, "INFO"),
        help=f"DEBUG, INFO, WARNING or ERROR (env {settings.LOG_LEVEL}; default INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=os.environ.get(settings.LOG_FORMAT, "text"),
        help=f"text, or json for one JSON object per line (env {settings.LOG_FORMAT}; "
        "default text)",
    )


def add_runtime(parser: argparse.ArgumentParser) -> None:
    """Metrics and health servers of a daemon: --metrics-port/-host, --health-port/-host."""
    parser.add_argument(
        "--metrics-port",
        type=flag_type("port", settings.METRICS_PORT),
        default=os.environ.get(settings.METRICS_PORT),
        help=f"serve Prometheus metrics on this port at /metrics (env {settings.METRICS_PORT}; "
        "default off; needs the `metrics` extra)",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get(settings.METRICS_HOST, "0.0.0.0"),
        help=f"address the metrics server binds (env {settings.METRICS_HOST}; default 0.0.0.0, "
        "every interface)",
    )
    parser.add_argument(
        "--health-port",
        type=flag_type("port", settings.HEALTH_PORT),
        default=os.environ.get(settings.HEALTH_PORT),
        help=f"serve /livez and /readyz on this port (env {settings.HEALTH_PORT}; default off)",
    )
    parser.add_argument(
        "--health-host",
        default=os.environ.get(settings.HEALTH_HOST, "0.0.0.0"),
        help=f"address the health server binds (env {settings.HEALTH_HOST}; default 0.0.0.0, "
        "every interface)",
    )
    parser.add_argument(
        "--liveness-timeout",
        type=flag_type("seconds", settings.LIVENESS_TIMEOUT),
        default=os.environ.get(settings.LIVENESS_TIMEOUT, "120"),
        help="seconds without progress of the main loop before /livez answers 503 "
        f"(env {settings.LIVENESS_TIMEOUT}; default 120)",
    )
    parser.add_argument(
        "--wait-for-database",
        type=flag_type("seconds_or_zero", settings.WAIT_FOR_DATABASE),
        default=os.environ.get(settings.WAIT_FOR_DATABASE, "0"),
        help="at start, wait up to this many seconds for PostgreSQL to accept connections, "
        "retrying with backoff and a WARNING per attempt, then exit 1 "
        f"(env {settings.WAIT_FOR_DATABASE}; default 0: exit 1 at once, for a supervisor "
        "to restart)",
    )


def runtime_config(args: argparse.Namespace) -> ObservabilityConfig:
    """The metrics and health settings of a daemon from its parsed flags."""
    from outbox.observability.runtime import ObservabilityConfig

    return ObservabilityConfig(
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        health_port=args.health_port,
        health_host=args.health_host,
        liveness_timeout=args.liveness_timeout,
        wait_for_database=args.wait_for_database,
    )
