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


def test_a_consumer_without_its_broker_says_so_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With its broker gone, a consumer's librdkafka logs "Connect to ... failed" about 20
    # times a second: an ERROR flood for as long as the outage lasts.
    consumer = Consumer(consumer_config(NOWHERE, "g"))
    consumer.subscribe(["t"])
    with caplog.at_level(logging.INFO, logger=rdkafka_log.name):
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            consumer.poll(0.1)
    consumer.close()
    refused = [
        r for r in caplog.records if r.name == rdkafka_log.name and "Connect to" in r.getMessage()
    ]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    assert refused[0].levelno == logging.ERROR


def test_a_repeated_line_goes_out_again_with_its_count() -> None:
    from outbox.kafka.publisher import _Repeats

    logger = logging.getLogger("test.repeats")
    records: list[logging.LogRecord] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Kept()
    logger.addHandler(handler)
    logger.addFilter(_Repeats(interval=0.3))
    try:
        for after in (0, 1, 2, 0):
            logger.error("FAIL: refused (after %dms in state CONNECT)", after)
        logger.error("FAIL: another line")
        time.sleep(0.35)
        logger.error("FAIL: refused (after 5ms in state CONNECT)")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "FAIL: refused (after 0ms in state CONNECT)",
        "FAIL: another line",
        "FAIL: refused (after 5ms in state CONNECT) (repeated 3 times in the last 0s)",
    ]
