"""Kafka's entry in the transport registry (outbox/transports.py): its flags, its options and
how its publishers, subscribers, probe and lag reader are made from them.

Importing this module loads no driver: confluent-kafka is imported where a client is made.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox import settings as env
from outbox.core.errors import ConfigurationError
from outbox.ports import (
    ArgumentAdder,
    ContractTransport,
    FixtureSource,
    LagReader,
    Publisher,
    PublisherFactory,
    Role,
    Subscriber,
    SubscriberFactory,
    Transport,
    TransportProbe,
    TransportSettings,
)

__all__ = ["KAFKA", "KafkaOptions", "add_kafka", "kafka_probe"]


@dataclass(frozen=True)
class KafkaOptions:
    """Where the Kafka cluster is (`--kafka-bootstrap`) and the user's librdkafka settings
    (`--kafka-config`, its variables and its file, merged)."""

    bootstrap: str = ""
    config: Mapping[str, str] = field(default_factory=dict)


def _options(values: Mapping[str, Any]) -> KafkaOptions:
    return KafkaOptions(
        bootstrap=str(values.get("kafka_bootstrap") or ""),
        config=dict(values.get("kafka_config") or {}),
    )


def kafka_setting(text: str) -> tuple[str, str]:
    """Parse one `--kafka-config key=value`."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def _merge(parsed: argparse.Namespace) -> None:
    """`kafka_config` from the file, the variables and the flags, lowest precedence first
    (`outbox.kafka.sources`); a `ConfigurationError` for a file that cannot be read."""
    from outbox.kafka.sources import merged_settings

    parsed.kafka_config = merged_settings(parsed.kafka_config, parsed.kafka_config_file, os.environ)


def add_kafka(parser: ArgumentAdder) -> None:
    """--kafka-bootstrap and the repeatable --kafka-config (and --kafka-config-file), merged
    after parsing by a parser that runs its `finishers` (outbox.cli.arguments.Parser)."""
    parser.add_argument(
        "--kafka-bootstrap",
        default=os.environ.get(env.KAFKA_BOOTSTRAP),
        help=f"Kafka bootstrap servers, host:port[,...] (env {env.KAFKA_BOOTSTRAP})",
    )
    parser.add_argument(
        "--kafka-config",
        action="append",
        type=kafka_setting,
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka setting; repeatable. Each can also come from its variable "
        f"{env.KAFKA_CONFIG} (NAME: the key upper-cased, dots as underscores, e.g. "
        f"{env.KAFKA_CONFIG_PREFIX}SASL_PASSWORD) or from --kafka-config-file; a flag "
        "beats a variable, which beats the file. Give secrets by variable or file: a flag "
        "shows in `ps`",
    )
    parser.add_argument(
        "--kafka-config-file",
        default=os.environ.get(env.KAFKA_CONFIG_FILE) or None,
        metavar="PATH",
        help="properties file of librdkafka settings: key=value lines, # comments "
        f"(env {env.KAFKA_CONFIG_FILE}; default none)",
    )
    finishers = getattr(parser, "finishers", None)
    if isinstance(finishers, list) and _merge not in finishers:
        finishers.append(_merge)


def _add_arguments(parser: ArgumentAdder, role: Role) -> None:
    add_kafka(parser)


def kafka_probe(settings: Mapping[str, object]) -> TransportProbe:
    """The reachability check of the Kafka cluster of librdkafka `settings`."""
    from outbox.kafka.publisher import check_reachable

    frozen = dict(settings)
    return TransportProbe("kafka", "Kafka", lambda timeout: check_reachable(frozen, timeout))


def _publishers(options: KafkaOptions) -> tuple[PublisherFactory, TransportProbe | None]:
    """Kafka publishers (idempotent, acks=all), and their cluster's probe."""
    from outbox.kafka.publisher import KafkaPublisher, producer_config

    settings = producer_config(options.bootstrap, options.config)

    def publisher() -> Publisher:
        return KafkaPublisher(settings)

    return publisher, kafka_probe(settings)


def _subscribers(
    options: KafkaOptions, group: str, topics: Sequence[str], start: str | None
) -> tuple[SubscriberFactory, TransportProbe | None]:
    """Members of Kafka consumer group `group` reading `topics`, and their cluster's probe;
    `start` goes in the entry of the settings the subscriber reads."""
    from outbox.kafka.start import START_KEY
    from outbox.kafka.subscriber import KafkaSubscriber, consumer_config

    extra = dict(options.config)
    if start is not None:
        extra[START_KEY] = start
    settings = consumer_config(options.bootstrap, group, extra)
    topic_list = list(topics)

    def subscriber() -> Subscriber:
        return KafkaSubscriber(settings, topic_list)

    return subscriber, kafka_probe(settings)


def _in_force(options: KafkaOptions, kind: str, group: str) -> dict[str, Any]:
    """The librdkafka settings the client of a producer or consumer daemon is made with:
    outbox's defaults, the user's, and the ones outbox forces (the user's alone when the
    client would refuse them: it says why when it is made)."""
    from outbox.kafka.publisher import producer_config
    from outbox.kafka.subscriber import consumer_config

    user = dict(options.config)
    try:
        client = (
            producer_config(options.bootstrap, user)
            if kind == "producer"
            else consumer_config(options.bootstrap, group, user)
        )
    except ConfigurationError:
        client = user
    client.pop("logger", None)
    return {"kafka_bootstrap": options.bootstrap, "kafka_config": client}


def _lag(options: KafkaOptions, timeout: float) -> LagReader:
    from outbox.kafka.lag import LagReader as KafkaLagReader

    return KafkaLagReader(options.bootstrap, options.config, timeout=timeout)


def _servers(options: KafkaOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    from outbox.asyncapi import kafka_servers

    return kafka_servers(options.bootstrap or None, dict(options.config))


def _secrets(options: KafkaOptions) -> Iterable[str]:
    from outbox.core.redact import secrets_of_settings

    return secrets_of_settings(dict(options.config))


def _nothing(options: KafkaOptions, *more: object) -> None:
    """No check of its own: the daemons' probes check the cluster."""


class KafkaUnderTest:
    """Kafka for the contract suite: the session's broker (outbox.testing's fixtures)."""

    name = "kafka"
    settle = 0.3

    def __init__(self, request: FixtureSource) -> None:
        # Through the fixtures only: an adapter imports nothing of outbox.testing.
        self.options = KafkaOptions(bootstrap=request.getfixturevalue("outbox_kafka_bootstrap"))
        self.consumer_options = KafkaOptions(
            bootstrap=self.options.bootstrap,
            config=request.getfixturevalue("outbox_kafka_consumer_settings"),
        )
        self._topics = request.getfixturevalue("outbox_topic_factory")
        self._open: list[Any] = []

    def topic(self, partitions: int = 3) -> str:
        return str(self._topics(partitions))

    def publisher(self) -> Publisher:
        made = _publishers(self.options)[0]()
        self._open.append(made)
        return made

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        made = _subscribers(self.consumer_options, group, topics, None)[0]()
        self._open.append(made)
        return made

    def settings(self) -> TransportSettings:
        return TransportSettings(KAFKA.name, self.consumer_options)

    def close_all(self) -> None:
        for client in reversed(self._open):
            with contextlib.suppress(RuntimeError):  # a client the test closed already
                client.close()


def _contract(request: FixtureSource) -> ContractTransport:
    return KafkaUnderTest(request)


KAFKA: Transport[KafkaOptions] = Transport(
    name="kafka",
    label="Kafka",
    add_arguments=_add_arguments,
    options_of=_options,
    endpoint=lambda options: options.bootstrap,
    endpoint_flag="--kafka-bootstrap",
    endpoint_dest="kafka_bootstrap",
    endpoint_env=env.KAFKA_BOOTSTRAP,
    shown=lambda endpoint: endpoint,
    make_publishers=_publishers,
    make_subscribers=_subscribers,
    probe=lambda options: _publishers(options)[1],
    lag_reader=_lag,
    asyncapi_servers=_servers,
    check=_nothing,
    check_consumer=_nothing,
    lag_note="Lag needs --kafka-bootstrap (and optionally --group).",
    max_lag_needs=f"--max-lag needs --kafka-bootstrap (or {env.KAFKA_BOOTSTRAP}) to read the lag",
    in_force=_in_force,
    secrets=_secrets,
    features=frozenset({"processes", "start"}),
    contract=_contract,
)
