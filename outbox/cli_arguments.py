"""Flags shared by the `outbox` subcommands, each with its environment variable."""

from __future__ import annotations

import argparse
import os

from outbox.core.errors import ConfigurationError

ENV_DATABASE_URL = "OUTBOX_DATABASE_URL"
ENV_KAFKA_BOOTSTRAP = "OUTBOX_KAFKA_BOOTSTRAP"
ENV_SCHEMA = "OUTBOX_SCHEMA"


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


def require(value: str | None, flag: str, env: str) -> str:
    """The value of a required setting, or a ConfigurationError naming its flag and variable."""
    if not value:
        raise ConfigurationError(f"{flag} is required (or set {env})")
    return value
