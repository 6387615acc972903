"""The transport registry (outbox/transports.py): `--transport NAME` is one entry, or one error
naming the registered ones; and the classifications the Consumer stores through
(outbox/core/retriable.py), which know no driver."""

from __future__ import annotations

import pytest

from outbox import transports
from outbox.core.errors import ConfigurationError
from outbox.core.retriable import database_error, refused_for_data


def test_each_registered_transport_is_found_by_its_name() -> None:
    assert transports.names() == ("kafka", "postgres")
    assert [transports.get(name).name for name in transports.names()] == ["kafka", "postgres"]
    assert transports.get("kafka") is transports.KAFKA
    assert transports.get("postgres") is transports.LOG


def test_an_unknown_transport_is_one_error_listing_the_registered_ones() -> None:
    with pytest.raises(ConfigurationError) as raised:
        transports.get("rabbitmq", what="--transport", hint=" (from OUTBOX_TRANSPORT?)")
    assert str(raised.value) == (
        "--transport must be one of kafka, postgres, got 'rabbitmq' (from OUTBOX_TRANSPORT?)"
    )


def test_a_transport_reads_its_own_endpoint() -> None:
    settings = transports.TransportSettings(
        kafka_bootstrap="k:9092", log_url="postgresql://u:secret@h/log"
    )
    assert transports.KAFKA.endpoint(settings) == "k:9092"
    assert transports.LOG.endpoint(settings) == "postgresql://u:secret@h/log"
    assert "secret" not in transports.LOG.shown(transports.LOG.endpoint(settings))


def test_a_transport_says_what_a_daemons_start_up_line_shows() -> None:
    settings = transports.TransportSettings(
        kafka_bootstrap="k:9092",
        kafka_config={"linger.ms": "7"},
        log_url="postgresql://u:secret@h/log",
        start="latest",
    )
    kafka = transports.KAFKA.in_force(settings, "consumer", "billing")
    assert kafka["kafka_bootstrap"] == "k:9092" and kafka["start"] == "latest"
    assert kafka["kafka_config"]["group.id"] == "billing"  # the client's settings in force
    assert kafka["kafka_config"]["enable.auto.commit"] == "false"  # outbox's forced one
    producer = transports.KAFKA.in_force(settings, "producer", "")
    assert producer["kafka_config"]["linger.ms"] == "7" and "start" not in producer
    assert set(transports.LOG.in_force(settings, "producer", "")) == {
        "log_url",
        "log_schema",
        "log_partitions",
        "log_retention",
    }
    assert set(transports.LOG.in_force(settings, "consumer", "g")) == {
        "log_url",
        "log_schema",
        "log_session_timeout",
    }


def test_the_log_refuses_a_start_position_for_its_consumers() -> None:
    with pytest.raises(ConfigurationError, match="--start applies to Kafka only"):
        transports.LOG.check_consumer(transports.TransportSettings(start="latest"))
    transports.KAFKA.check_consumer(transports.TransportSettings(start="latest"))


class _Driver(Exception):
    """A PEP 249 driver's error with a SQLSTATE."""

    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


class Error(Exception):
    """A PEP 249 driver's base class."""


class DataError(Error):
    """A driver refusing a value it cannot send (no SQLSTATE)."""


@pytest.mark.parametrize(
    ("error", "refused", "of_the_database"),
    [
        (_Driver("22021"), True, True),  # invalid byte sequence
        (_Driver("23505"), True, True),  # unique violation
        (_Driver("54000"), True, True),  # program limit (an index row too large)
        (_Driver("42501"), False, True),  # a missing privilege: not the data's
        (_Driver("08006"), False, True),  # a lost connection
        (DataError("NUL byte"), True, True),
        (Error("server closed the connection"), False, True),
        (UnicodeEncodeError("utf-8", "x", 0, 1, "surrogate"), True, False),
        (ValueError("a bug"), False, False),
    ],
)
def test_refused_for_data_and_database_error_know_no_driver(
    error: Exception, refused: bool, of_the_database: bool
) -> None:
    assert refused_for_data(error) is refused
    assert database_error(error) is of_the_database
