"""librdkafka's lines in outbox's log: a setting meant for the other kind of client is said at
DEBUG, not as a warning (one OUTBOX_KAFKA_CONFIG_<NAME> serves the relay and the consumer of
`outbox run` alike: `session.timeout.ms` is the consumer's, the relay ignores it)."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer, Producer

from outbox.kafka.publisher import producer_config, rdkafka_log
from outbox.kafka.subscriber import consumer_config

#: No broker listens there: the clients only read their settings and log about them.
NOWHERE = "127.0.0.1:9"


def _lines(caplog: pytest.LogCaptureFixture, instance: Producer | Consumer) -> list[str]:
    """The levels and lines librdkafka logged about settings ignored by `instance`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _about(caplog):
        instance.poll(0.1)  # librdkafka hands its log lines over in poll
    return _about(caplog)


def _about(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.levelname} {r.getMessage().split(': ', 1)[1]}"
        for r in caplog.records
        if r.name == rdkafka_log.name and "will be ignored" in r.getMessage()
    ]


def test_a_consumer_setting_given_to_the_relay_is_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = producer_config(NOWHERE, {"session.timeout.ms": "3000"})
    with caplog.at_level(logging.DEBUG, logger=rdkafka_log.name):
        lines = _lines(caplog, Producer(config))
    assert lines == [
        "DEBUG Configuration property session.timeout.ms is a consumer property and will be "
        "ignored by this producer instance"
    ]


def test_a_relay_setting_given_to_the_consumer_is_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = consumer_config(NOWHERE, "g", {"linger.ms": "1"})
    with caplog.at_level(logging.DEBUG, logger=rdkafka_log.name):
        lines = _lines(caplog, Consumer(config))
    assert lines == [
        "DEBUG Configuration property queue.buffering.max.ms is a producer property and will "
        "be ignored by this consumer instance"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=rdkafka_log.name):
        consumer = Consumer(config)
        consumer.poll(0.5)
        consumer.close()
    assert _about(caplog) == []


def test_other_warnings_of_librdkafka_stay_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=rdkafka_log.name):
        rdkafka_log.warning("CONFWARN [rdkafka#producer-1] [thrd:app]: something else")
        rdkafka_log.warning(
            "CONFWARN [rdkafka#producer-1] [thrd:app]: Configuration property "
            "session.timeout.ms is a consumer property and will be ignored by this producer "
            "instance"
        )
    assert [(r.levelno, r.getMessage().split(": ", 1)[1]) for r in caplog.records] == [
        (logging.WARNING, "something else")
    ]
