"""Wiring: the transport a daemon runs on, chosen here (and by the CLI), not in the daemons.

The daemons take factories of `Publisher` and `Subscriber` (outbox.ports) and a probe of the
transport's reachability; these functions make them for Kafka and for the PostgreSQL log, and
build the daemons on Kafka as their configs describe it (`kafka_producer`, `kafka_consumer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from outbox.daemons.consumer import Consumer, ConsumerConfig
from outbox.daemons.producer import Producer, ProducerConfig
from outbox.kafka.publisher import KafkaPublisher, check_reachable, producer_config
from outbox.kafka.subscriber import KafkaSubscriber, consumer_config
from outbox.ports import (
    Publisher,
    PublisherFactory,
    RelayStores,
    Subscriber,
    SubscriberFactory,
    TransportProbe,
)

__all__ = [
    "kafka_consumer",
    "kafka_probe",
    "kafka_producer",
    "kafka_publishers",
    "kafka_subscribers",
    "log_publishers",
    "log_subscribers",
]


def kafka_probe(settings: Mapping[str, object]) -> TransportProbe:
    """The reachability check of the Kafka cluster of librdkafka `settings`."""
    frozen = dict(settings)
    return TransportProbe("kafka", "Kafka", lambda timeout: check_reachable(frozen, timeout))


def kafka_publishers(
    bootstrap: str, extra: Mapping[str, str] | None = None
) -> tuple[PublisherFactory, TransportProbe]:
    """Kafka publishers (idempotent, acks=all), and their cluster's probe."""
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
) -> SubscriberFactory:
    """Members of log consumer group `group` reading `topics` (outbox.pglog); a member whose
    heartbeat is older than `session_timeout` seconds (default the subscriber's) is evicted."""
    from outbox.pglog import PgLogSubscriber
    from outbox.pglog.subscriber import SESSION_TIMEOUT

    topic_list = list(topics)
    timeout = SESSION_TIMEOUT if session_timeout is None else session_timeout

    def subscriber() -> Subscriber:
        return PgLogSubscriber(url, topic_list, group, schema, session_timeout=timeout)

    return subscriber


def kafka_producer(config: ProducerConfig, stores: RelayStores | None = None) -> Producer:
    """A Producer relaying to the Kafka cluster of `config` (kafka_bootstrap, kafka_config)
    from its queue in `stores` (PostgreSQL's unless given)."""
    publishers, probe = kafka_publishers(config.kafka_bootstrap, config.kafka_config)
    return Producer(config, publishers, probe, stores)


def kafka_consumer(config: ConsumerConfig) -> Consumer:
    """A Consumer reading `config.topics` from the Kafka cluster of `config` as `config.group`."""
    subscribers, probe = kafka_subscribers(
        config.kafka_bootstrap, config.group, config.topics, config.kafka_config
    )
    return Consumer(config, subscribers, probe)
