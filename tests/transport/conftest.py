"""The transports under test: every contract test runs against each (watermill's pattern).

`memory` needs no server; `kafka` is the session's real broker (Tansu locally, or Kafka from
OUTBOX_TEST_KAFKA_BOOTSTRAP / testcontainers), through the same adapters the daemons use;
`postgres` is the PostgreSQL log (outbox.pglog) in a fresh database of the session's server.
Both are made as the daemons get them: by the transport registry (outbox/transports.py).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from outbox import transports
from outbox.memory import InMemoryTransport
from outbox.pglog import PgLog
from outbox.pglog.log import upgrade as upgrade_log
from outbox.ports import Publisher, Subscriber
from outbox.testing.plugin import TANSU_CONSUMER_SETTINGS, TopicFactory
from outbox.testing.servers import TansuBroker


class TransportUnderTest:
    """Makes topics, publishers and subscribers of one transport; closes them afterwards."""

    name: str
    #: How long to keep polling after the expected messages arrived, to catch extras.
    settle: float

    def __init__(self) -> None:
        self._open: list[Any] = []

    def topic(self, partitions: int = 3) -> str:
        """A new topic unique to the test."""
        raise NotImplementedError

    def publisher(self) -> Publisher:
        raise NotImplementedError

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        raise NotImplementedError

    def _keep(self, client: Any) -> Any:
        self._open.append(client)
        return client

    def close_all(self) -> None:
        for client in reversed(self._open):
            with contextlib.suppress(RuntimeError):  # a consumer the test closed already
                client.close()


class Memory(TransportUnderTest):
    name = "memory"
    settle = 0.02  # everything published is there at once

    def __init__(self) -> None:
        super().__init__()
        self.transport = InMemoryTransport()
        self._names = itertools.count()

    def topic(self, partitions: int = 3) -> str:
        name = f"topic-{next(self._names)}"
        self.transport.create_topic(name, partitions)
        return name

    def publisher(self) -> Publisher:
        return self._keep(self.transport.publisher())  # type: ignore[no-any-return]

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        return self._keep(self.transport.subscriber(topics, group))  # type: ignore[no-any-return]


class Kafka(TransportUnderTest):
    name = "kafka"
    settle = 0.3

    def __init__(self, bootstrap: str, topics: TopicFactory, consumer_settings: dict[str, str]):
        super().__init__()
        self.bootstrap = bootstrap
        self._topics = topics
        self._consumer_settings = consumer_settings

    def topic(self, partitions: int = 3) -> str:
        return self._topics(partitions)

    def publisher(self) -> Publisher:
        settings = transports.TransportSettings(kafka_bootstrap=self.bootstrap)
        publishers, _ = transports.KAFKA.make_publishers(settings)
        return self._keep(publishers())  # type: ignore[no-any-return]

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        settings = transports.TransportSettings(
            kafka_bootstrap=self.bootstrap, kafka_config=self._consumer_settings
        )
        subscribers, _ = transports.KAFKA.make_subscribers(settings, group, topics)
        return self._keep(subscribers())  # type: ignore[no-any-return]


class PostgresLog(TransportUnderTest):
    name = "postgres"
    settle = 0.3

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.log = PgLog(url)
        self._names = itertools.count()

    def topic(self, partitions: int = 3) -> str:
        name = f"topic-{next(self._names)}"
        self.log.create_topic(name, partitions)
        return name

    def publisher(self) -> Publisher:
        publishers, _ = transports.LOG.make_publishers(
            transports.TransportSettings(log_url=self.url)
        )
        return self._keep(publishers())  # type: ignore[no-any-return]

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        settings = transports.TransportSettings(log_url=self.url)
        subscribers, _ = transports.LOG.make_subscribers(settings, group, topics)
        return self._keep(subscribers())  # type: ignore[no-any-return]


@pytest.fixture(params=["memory", "kafka", "postgres"])
def transport(request: pytest.FixtureRequest) -> Iterator[TransportUnderTest]:
    """Each transport in turn."""
    under_test: TransportUnderTest
    if request.param == "memory":
        under_test = Memory()
    elif request.param == "postgres":
        url = request.getfixturevalue("outbox_database_factory")(migrated=False)
        upgrade_log(url)
        under_test = PostgresLog(url)
    else:
        servers = request.getfixturevalue("outbox_servers")
        settings = TANSU_CONSUMER_SETTINGS if isinstance(servers.kafka, TansuBroker) else {}
        under_test = Kafka(
            request.getfixturevalue("outbox_kafka_bootstrap"),
            request.getfixturevalue("outbox_topic_factory"),
            settings,
        )
    try:
        yield under_test
    finally:
        under_test.close_all()
