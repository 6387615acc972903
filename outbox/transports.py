"""The registry of transports: which adapters `--transport NAME` means, never a daemon.

The daemons take factories of `Publisher` and `Subscriber` (outbox.ports) and a probe of the
transport's reachability; these functions make them for Kafka and for the PostgreSQL log. The
composition root (outbox/runtime/) asks the registry for them and builds the daemons.

`--transport NAME` means one entry of the registry (`get`, `names`): a `Transport` says how to
make that transport's publishers, subscribers, probe and lag reader from `TransportSettings`
(the flags), so that the CLI, the console, `outbox run` and the test harness choose a transport
by its name and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox import settings as env
from outbox.core.errors import ConfigurationError
from outbox.core.lag import GroupLag
from outbox.core.redact import redact_url
from outbox.ports import (
    LagReader,
    Publisher,
    PublisherFactory,
    Subscriber,
    SubscriberFactory,
    TransportProbe,
)

# The adapters are imported where they are made: choosing a transport by its name (the CLI's
# flags) imports neither confluent-kafka nor the log.

__all__ = [
    "KAFKA",
    "LOG",
    "Transport",
    "TransportSettings",
    "get",
    "kafka_probe",
    "kafka_publishers",
    "kafka_subscribers",
    "log_publishers",
    "log_subscribers",
    "names",
]


def kafka_probe(settings: Mapping[str, object]) -> TransportProbe:
    """The reachability check of the Kafka cluster of librdkafka `settings`."""
    from outbox.kafka.publisher import check_reachable

    frozen = dict(settings)
    return TransportProbe("kafka", "Kafka", lambda timeout: check_reachable(frozen, timeout))


def kafka_publishers(
    bootstrap: str, extra: Mapping[str, str] | None = None
) -> tuple[PublisherFactory, TransportProbe]:
    """Kafka publishers (idempotent, acks=all), and their cluster's probe."""
    from outbox.kafka.publisher import KafkaPublisher, producer_config

    settings = producer_config(bootstrap, extra)

    def publisher() -> Publisher:
        return KafkaPublisher(settings)

    return publisher, kafka_probe(settings)


def kafka_subscribers(
    bootstrap: str,
    group: str,
    topics: Sequence[str],
    extra: Mapping[str, str] | None = None,
) -> tuple[SubscriberFactory, TransportProbe]:
    """Members of Kafka consumer group `group` reading `topics`, and their cluster's probe."""
    from outbox.kafka.subscriber import KafkaSubscriber, consumer_config

    settings = consumer_config(bootstrap, group, extra)
    topic_list = list(topics)

    def subscriber() -> Subscriber:
        return KafkaSubscriber(settings, topic_list)

    return subscriber, kafka_probe(settings)


def log_publishers(
    url: str, schema: str, *, partitions: int, retention: float | None = None
) -> PublisherFactory:
    """Publishers appending to the PostgreSQL log at `url` (outbox.pglog)."""
    from outbox.pglog import PgLogPublisher

    def publisher() -> Publisher:
        return PgLogPublisher(url, schema, partitions=partitions, retention=retention)

    return publisher


def log_subscribers(
    url: str,
    schema: str,
    topics: Sequence[str],
    group: str,
    *,
    session_timeout: float | None = None,
    rebalance_interval: float | None = None,
) -> SubscriberFactory:
    """Members of log consumer group `group` reading `topics` (outbox.pglog); a member whose
    heartbeat is older than `session_timeout` seconds (default the subscriber's) is evicted;
    each looks at its group's membership every `rebalance_interval` seconds (default the
    subscriber's)."""
    from outbox.pglog import PgLogSubscriber
    from outbox.pglog.subscriber import REBALANCE_INTERVAL, SESSION_TIMEOUT

    topic_list = list(topics)
    timeout = SESSION_TIMEOUT if session_timeout is None else session_timeout
    interval = REBALANCE_INTERVAL if rebalance_interval is None else rebalance_interval

    def subscriber() -> Subscriber:
        return PgLogSubscriber(
            url,
            topic_list,
            group,
            schema,
            session_timeout=timeout,
            rebalance_interval=interval,
        )

    return subscriber


# -- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TransportSettings:
    """The transport of a process (`name`: `--transport`), where it is and how the daemons use
    it, as the flags give it; each transport reads its own fields (Kafka the `kafka_*` ones,
    the log the `log_*` ones)."""

    #: The registered transport's name (`get`).
    name: str = "kafka"
    kafka_bootstrap: str = ""
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    log_url: str = ""
    log_schema: str = "outbox_log"
    log_partitions: int = 8
    #: Seconds the log keeps records every group has read; None: forever.
    log_retention: float | None = None
    #: Seconds after which a log member that does not beat is evicted; None: the default.
    log_session_timeout: float | None = None
    #: Seconds between a log member's looks at its group's membership; None: the default.
    log_rebalance_interval: float | None = None
    #: Where a new consumer group starts (`--start`); None: at the earliest record.
    start: str | None = None
    #: Seconds a request of a lag reader may take.
    lag_timeout: float = 10.0


@dataclass(frozen=True)
class Transport:
    """A transport `--transport NAME` selects, and how its parts are made from the settings.

    `make_publishers` and `make_subscribers` return factories for the daemons, with the probe
    the daemon's readiness checks (None: the transport has none of its own); `check` is the
    start-up check of the transport (waiting up to `wait` seconds for a database it lives in),
    raising an `OutboxError` with one line; `check_consumer` refuses, with a
    `ConfigurationError`, consumer settings the transport cannot honour.
    """

    name: str
    label: str
    #: The setting that says where the transport is: its field of `TransportSettings`, flag
    #: and environment variable.
    endpoint_field: str
    endpoint_flag: str
    endpoint_env: str
    #: The endpoint as logs and pages may show it (a URL's password masked).
    shown: Callable[[str], str]
    make_publishers: Callable[[TransportSettings], tuple[PublisherFactory, TransportProbe | None]]
    #: (settings, group, topics): members of `group` reading `topics`.
    make_subscribers: Callable[
        [TransportSettings, str, Sequence[str]], tuple[SubscriberFactory, TransportProbe | None]
    ]
    probe: Callable[[TransportSettings], TransportProbe | None]
    lag_reader: Callable[[TransportSettings], LagReader]
    #: The AsyncAPI `servers` of a service on this transport, and the security schemes they
    #: use (outbox.asyncapi).
    asyncapi_servers: Callable[[TransportSettings], tuple[dict[str, Any], dict[str, Any]]]
    check: Callable[[TransportSettings, float], None]
    check_consumer: Callable[[TransportSettings], None]
    #: What the operator tools say when the endpoint is not given: the console's lag note, and
    #: why `outbox status --max-lag` cannot be checked.
    lag_note: str
    max_lag_needs: str
    #: (settings, kind, group): the settings in force a daemon of `kind` ("producer" or
    #: "consumer") on this transport shows in its start-up line, not masked (the line masks).
    in_force: Callable[[TransportSettings, str, str], dict[str, Any]]

    def endpoint(self, settings: TransportSettings) -> str:
        """Where the transport is, as given ("" when not given)."""
        value = getattr(settings, self.endpoint_field)
        return str(value or "")


def _kafka_publishers(
    settings: TransportSettings,
) -> tuple[PublisherFactory, TransportProbe | None]:
    return kafka_publishers(settings.kafka_bootstrap, settings.kafka_config)


def _kafka_subscribers(
    settings: TransportSettings, group: str, topics: Sequence[str]
) -> tuple[SubscriberFactory, TransportProbe | None]:
    return kafka_subscribers(settings.kafka_bootstrap, group, topics, _with_start(settings))


def _with_start(settings: TransportSettings) -> dict[str, str]:
    """The consumer's librdkafka settings, with `--start` in the entry the subscriber reads."""
    from outbox.kafka.start import START_KEY

    found = dict(settings.kafka_config)
    if settings.start is not None:
        found[START_KEY] = settings.start
    return found


def _kafka_in_force(settings: TransportSettings, kind: str, group: str) -> dict[str, Any]:
    """The librdkafka settings the client of a producer or consumer daemon is made with:
    outbox's defaults, the user's, and the ones outbox forces (the user's alone when the
    client would refuse them: it says why when it is made); and `--start`."""
    from outbox.kafka.publisher import producer_config
    from outbox.kafka.subscriber import consumer_config

    user = dict(settings.kafka_config)
    try:
        client = (
            producer_config(settings.kafka_bootstrap, user)
            if kind == "producer"
            else consumer_config(settings.kafka_bootstrap, group, user)
        )
    except ConfigurationError:
        client = user
    client.pop("logger", None)
    shown: dict[str, Any] = {"kafka_bootstrap": settings.kafka_bootstrap, "kafka_config": client}
    if kind == "consumer" and settings.start is not None:
        shown["start"] = settings.start
    return shown


def _log_in_force(settings: TransportSettings, kind: str, group: str) -> dict[str, Any]:
    """The log's settings a producer or consumer daemon uses."""
    shown: dict[str, Any] = {"log_url": settings.log_url, "log_schema": settings.log_schema}
    if kind == "producer":
        shown["log_partitions"] = settings.log_partitions
        shown["log_retention"] = settings.log_retention
    else:
        shown["log_session_timeout"] = settings.log_session_timeout
    return shown


def _kafka_lag(settings: TransportSettings) -> LagReader:
    from outbox.kafka.lag import LagReader as KafkaLagReader

    return KafkaLagReader(
        settings.kafka_bootstrap, settings.kafka_config, timeout=settings.lag_timeout
    )


def _kafka_servers(settings: TransportSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    from outbox.asyncapi import kafka_servers

    return kafka_servers(settings.kafka_bootstrap or None, dict(settings.kafka_config))


def _log_servers(settings: TransportSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    from outbox.asyncapi import log_servers

    return log_servers(settings.log_url or None, settings.log_schema), {}


def _nothing(settings: TransportSettings, *more: object) -> None:
    """No check of its own: the daemons' probes check the cluster."""


def _log_publishers(
    settings: TransportSettings,
) -> tuple[PublisherFactory, TransportProbe | None]:
    factory = log_publishers(
        settings.log_url,
        settings.log_schema,
        partitions=settings.log_partitions,
        retention=settings.log_retention or None,
    )
    return factory, None


def _log_subscribers(
    settings: TransportSettings, group: str, topics: Sequence[str]
) -> tuple[SubscriberFactory, TransportProbe | None]:
    factory = log_subscribers(
        settings.log_url,
        settings.log_schema,
        topics,
        group,
        session_timeout=settings.log_session_timeout,
        rebalance_interval=settings.log_rebalance_interval,
    )
    return factory, None


class _LogLag:
    """The log's `LagReader`: `PgLog.lag`, one connection per read."""

    def __init__(self, url: str, schema: str) -> None:
        from outbox.pglog import PgLog

        self._log = PgLog(url, schema)

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        return self._log.lag(groups)

    def close(self) -> None:
        """Nothing is kept open between reads."""


def _log_check(settings: TransportSettings, wait: float) -> None:
    from outbox.pglog import check_log

    check_log(settings.log_url, settings.log_schema, wait=wait)


def _log_check_consumer(settings: TransportSettings) -> None:
    from outbox.pglog.subscriber import check_session_timeout

    if settings.start not in (None, "earliest"):
        raise ConfigurationError("--start applies to Kafka only (not to --transport postgres)")
    if settings.log_session_timeout is not None:
        check_session_timeout(settings.log_session_timeout)


KAFKA = Transport(
    name="kafka",
    label="Kafka",
    endpoint_field="kafka_bootstrap",
    endpoint_flag="--kafka-bootstrap",
    endpoint_env=env.KAFKA_BOOTSTRAP,
    shown=lambda endpoint: endpoint,
    make_publishers=_kafka_publishers,
    make_subscribers=_kafka_subscribers,
    probe=lambda settings: _kafka_publishers(settings)[1],
    lag_reader=_kafka_lag,
    asyncapi_servers=_kafka_servers,
    check=_nothing,
    check_consumer=_nothing,
    lag_note="Lag needs --kafka-bootstrap (and optionally --group).",
    max_lag_needs=f"--max-lag needs --kafka-bootstrap (or {env.KAFKA_BOOTSTRAP}) to read the lag",
    in_force=_kafka_in_force,
)

LOG = Transport(
    name="postgres",
    label="the PostgreSQL log",
    endpoint_field="log_url",
    endpoint_flag="--log-url",
    endpoint_env=env.LOG_URL,
    shown=redact_url,
    make_publishers=_log_publishers,
    make_subscribers=_log_subscribers,
    # Its readiness is its database's; `check` verifies it is reachable and migrated at start.
    probe=lambda settings: None,
    lag_reader=lambda settings: _LogLag(settings.log_url, settings.log_schema),
    asyncapi_servers=_log_servers,
    check=_log_check,
    check_consumer=_log_check_consumer,
    lag_note="Lag of the log needs --log-url (and optionally --group).",
    max_lag_needs=(
        f"--max-lag with --transport postgres needs --log-url (or {env.LOG_URL}) to read "
        "the log's lag"
    ),
    in_force=_log_in_force,
)

_REGISTRY: dict[str, Transport] = {t.name: t for t in (KAFKA, LOG)}


def names() -> tuple[str, ...]:
    """The registered transports' names, in the order they are offered."""
    return tuple(_REGISTRY)


def get(name: str, *, what: str = "transport", hint: str = "") -> Transport:
    """The transport registered as `name`; one `ConfigurationError` naming the registered ones
    otherwise (`what` names the setting in it, `hint` is appended)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigurationError(
            f"{what} must be one of {', '.join(names())}, got {name!r}{hint}"
        ) from None
