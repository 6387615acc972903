"""The PostgreSQL log's entry in the transport registry (outbox/transports.py): its flags, its
options and how its publishers, subscribers and lag reader are made from them.

Importing this module loads no driver: psycopg is imported where the log is reached.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from outbox import settings as env
from outbox.core.databases import postgres_url_type, validate_schema
from outbox.core.lag import GroupLag
from outbox.core.numbers import flag_type
from outbox.core.redact import redact_url
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

__all__ = ["LOG", "LogOptions", "add_log"]

DEFAULT_SCHEMA = "outbox_log"


@dataclass(frozen=True)
class LogOptions:
    """Where the log is (`--log-url`, `--log-schema`) and how the daemons use it."""

    url: str = ""
    schema: str = DEFAULT_SCHEMA
    #: Partitions of a topic created on first publish.
    partitions: int = 8
    #: Seconds the log keeps records every group has read; None: forever.
    retention: float | None = None
    #: Seconds after which a member that does not beat is evicted; None: the default.
    session_timeout: float | None = None
    #: Seconds between a member's looks at its group's membership; None: the default.
    rebalance_interval: float | None = None

    def __post_init__(self) -> None:
        validate_schema(self.schema)


def _options(values: Mapping[str, Any]) -> LogOptions:
    return LogOptions(
        url=str(values.get("log_url") or ""),
        schema=str(values.get("log_schema") or DEFAULT_SCHEMA),
        partitions=int(values.get("log_partitions") or 8),
        retention=values.get("log_retention") or None,
        session_timeout=values.get("log_session_timeout"),
        rebalance_interval=values.get("log_rebalance_interval"),
    )


def add_log(parser: ArgumentAdder) -> None:
    """--log-url and --log-schema: where the PostgreSQL log is."""
    parser.add_argument(
        "--log-url",
        type=postgres_url_type(env.LOG_URL),
        default=os.environ.get(env.LOG_URL),
        help=f"PostgreSQL URL of the log database, for --transport postgres (env {env.LOG_URL})",
    )
    parser.add_argument(
        "--log-schema",
        default=os.environ.get(env.LOG_SCHEMA, DEFAULT_SCHEMA),
        help=f"schema of the log tables (env {env.LOG_SCHEMA}; default outbox_log)",
    )


def _add_arguments(parser: ArgumentAdder, role: Role) -> None:
    add_log(parser)
    if role == "producer":
        parser.add_argument(
            "--log-partitions",
            type=flag_type("count", env.LOG_PARTITIONS),
            default=os.environ.get(env.LOG_PARTITIONS, "8"),
            help="partitions of a log topic created on first publish "
            f"(env {env.LOG_PARTITIONS}; default 8)",
        )
        parser.add_argument(
            "--log-retention",
            type=flag_type("seconds_or_zero", env.LOG_RETENTION),
            default=os.environ.get(env.LOG_RETENTION, "604800"),
            help="seconds the log keeps a record that every consumer group has read; 0 keeps "
            f"everything (env {env.LOG_RETENTION}; default 604800, 7 days)",
        )
    elif role == "consumer":
        parser.add_argument(
            "--log-session-timeout",
            type=flag_type("seconds", env.LOG_SESSION_TIMEOUT),
            default=os.environ.get(env.LOG_SESSION_TIMEOUT, "10"),
            help="with --transport postgres: seconds this consumer's heartbeat may age before "
            "the other members of its group evict it and take its partitions (a frozen "
            "process); use one value for a group. Kafka's is session.timeout.ms "
            f"(--kafka-config) (env {env.LOG_SESSION_TIMEOUT}; default 10, at least 1)",
        )
    elif role == "run":
        for flag, kind, variable, default, text in (
            (
                "--log-partitions",
                "count",
                env.LOG_PARTITIONS,
                "8",
                "as `outbox producer --log-partitions`",
            ),
            (
                "--log-retention",
                "seconds_or_zero",
                env.LOG_RETENTION,
                "604800",
                "as `outbox producer --log-retention`",
            ),
            (
                "--log-session-timeout",
                "seconds",
                env.LOG_SESSION_TIMEOUT,
                "10",
                "as `outbox consumer --log-session-timeout`",
            ),
        ):
            parser.add_argument(
                flag,
                type=flag_type(kind, variable),  # type: ignore[arg-type]
                default=os.environ.get(variable, default),
                help=f"{text} (env {variable}; default {default})",
            )


def _publishers(options: LogOptions) -> tuple[PublisherFactory, TransportProbe | None]:
    """Publishers appending to the log; its readiness is its database's (`check` verifies at
    start that it is reachable and migrated)."""
    from outbox.pglog.publisher import PgLogPublisher

    def publisher() -> Publisher:
        return PgLogPublisher(
            options.url,
            options.schema,
            partitions=options.partitions,
            retention=options.retention or None,
        )

    return publisher, None


def _subscribers(
    options: LogOptions, group: str, topics: Sequence[str], start: str | None
) -> tuple[SubscriberFactory, TransportProbe | None]:
    """Members of log consumer group `group` reading `topics` (a new group starts at the
    earliest record: `check_consumer` refused another start)."""
    from outbox.pglog.subscriber import REBALANCE_INTERVAL, SESSION_TIMEOUT, PgLogSubscriber

    topic_list = list(topics)
    timeout = SESSION_TIMEOUT if options.session_timeout is None else options.session_timeout
    interval = (
        REBALANCE_INTERVAL if options.rebalance_interval is None else options.rebalance_interval
    )

    def subscriber() -> Subscriber:
        return PgLogSubscriber(
            options.url,
            topic_list,
            group,
            options.schema,
            session_timeout=timeout,
            rebalance_interval=interval,
        )

    return subscriber, None


def _in_force(options: LogOptions, kind: str, group: str) -> dict[str, Any]:
    """The log's settings a producer or consumer daemon uses."""
    shown: dict[str, Any] = {"log_url": options.url, "log_schema": options.schema}
    if kind == "producer":
        shown["log_partitions"] = options.partitions
        shown["log_retention"] = options.retention
    else:
        shown["log_session_timeout"] = options.session_timeout
    return shown


class _LogLag:
    """The log's `LagReader`: `PgLog.lag`, one connection per read."""

    def __init__(self, url: str, schema: str) -> None:
        from outbox.pglog.log import PgLog

        self._log = PgLog(url, schema)

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        return self._log.lag(groups)

    def close(self) -> None:
        """Nothing is kept open between reads."""


def _lag(options: LogOptions, timeout: float) -> LagReader:
    return _LogLag(options.url, options.schema)


def _servers(options: LogOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    from outbox.asyncapi import log_servers

    return log_servers(options.url or None, options.schema), {}


def _check(options: LogOptions, wait: float) -> None:
    from outbox.pglog.log import check_log

    check_log(options.url, options.schema, wait=wait)


def _check_consumer(options: LogOptions) -> None:
    from outbox.pglog.subscriber import check_session_timeout

    if options.session_timeout is not None:
        check_session_timeout(options.session_timeout)


def _secrets(options: LogOptions) -> Iterable[str]:
    from outbox.core.redact import secrets_of_url

    return secrets_of_url(options.url) if options.url else set()


class LogUnderTest:
    """The log for the contract suite: a fresh migrated log database of the session's server
    (outbox.testing's fixtures)."""

    name = "postgres"
    settle = 0.3

    def __init__(self, request: FixtureSource) -> None:
        from outbox.pglog.log import PgLog, upgrade

        url = request.getfixturevalue("outbox_database_factory")(migrated=False)
        upgrade(url)
        self.options = LogOptions(url=url, rebalance_interval=0.2)
        self.log = PgLog(url)
        self._count = 0
        self._open: list[Any] = []

    def topic(self, partitions: int = 3) -> str:
        self._count += 1
        name = f"topic-{self._count}"
        self.log.create_topic(name, partitions)
        return name

    def publisher(self) -> Publisher:
        made = _publishers(self.options)[0]()
        self._open.append(made)
        return made

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        made = _subscribers(self.options, group, topics, None)[0]()
        self._open.append(made)
        return made

    def settings(self) -> TransportSettings:
        return TransportSettings(LOG.name, self.options)

    def close_all(self) -> None:
        for client in reversed(self._open):
            with contextlib.suppress(RuntimeError):  # a client the test closed already
                client.close()


def _contract(request: FixtureSource) -> ContractTransport:
    return LogUnderTest(request)


LOG: Transport[LogOptions] = Transport(
    name="postgres",
    label="the PostgreSQL log",
    add_arguments=_add_arguments,
    options_of=_options,
    endpoint=lambda options: options.url,
    endpoint_flag="--log-url",
    endpoint_dest="log_url",
    endpoint_env=env.LOG_URL,
    shown=redact_url,
    make_publishers=_publishers,
    make_subscribers=_subscribers,
    # Its readiness is its database's; `check` verifies it is reachable and migrated at start.
    probe=lambda options: None,
    lag_reader=_lag,
    asyncapi_servers=_servers,
    check=_check,
    check_consumer=_check_consumer,
    lag_note="Lag of the log needs --log-url (and optionally --group).",
    max_lag_needs=(
        f"--max-lag with --transport postgres needs --log-url (or {env.LOG_URL}) to read "
        "the log's lag"
    ),
    in_force=_in_force,
    secrets=_secrets,
    features=frozenset({"processes"}),
    contract=_contract,
)
