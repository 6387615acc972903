"""A `Publisher` on confluent-kafka: idempotent, acks=all, one delivery report per message."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from outbox.core.envelope import StoredMessage
from outbox.core.errors import ConfigurationError, KafkaUnavailable
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID
from outbox.ports import DeliveryFailure

log = logging.getLogger("outbox.kafka")
#: librdkafka's own log lines, routed through logging instead of raw stderr.
rdkafka_log = logging.getLogger("outbox.kafka.librdkafka")

#: Settings the delivery guarantee depends on; a user override that weakens them is refused.
REQUIRED = {"enable.idempotence": "true", "acks": "all"}
DEFAULTS: dict[str, Any] = {
    "linger.ms": 5,
    # The Java client's partitioner, so that a key lands in the same partition whichever
    # language produced it.
    "partitioner": "murmur2_random",
    "message.timeout.ms": 30000,
    "socket.keepalive.enable": True,
}
# Errors after which this client's producer identity is unusable (fenced, or its epoch or
# sequence lost, as after an outage that timed messages out): a new client gets a new one.
IDENTITY_LOST = {
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    KafkaError.INVALID_PRODUCER_ID_MAPPING,
    KafkaError._FATAL,
}
# Errors that a retry of the same message cannot fix; such a row goes dead at once.
PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.INVALID_RECORD,
    KafkaError._INVALID_ARG,
}


def merge_settings(
    base: Mapping[str, Any],
    extra: Mapping[str, str] | None,
    required: Mapping[str, str],
    consequence: str,
) -> dict[str, Any]:
    """librdkafka settings: `base`, then the user's `extra`, then `required` (never weakened).

    A user setting that contradicts a required one is refused with an error that says what
    it would break (`consequence`).
    """
    bootstrap = base.get("bootstrap.servers")
    if not bootstrap:
        raise ConfigurationError("kafka bootstrap servers are not set (--kafka-bootstrap)")
    config: dict[str, Any] = {**base, "logger": rdkafka_log}
    for key, value in (extra or {}).items():
        if key in required and str(value).lower() != required[key]:
            raise ConfigurationError(
                f"kafka setting {key}={value} would {consequence}; outbox requires "
                f"{key}={required[key]}"
            )
        config[key] = value
    config.update(required)
    return config


def producer_config(bootstrap: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """librdkafka settings for the relay: defaults, then the user's, then the required ones."""
    return merge_settings(
        {"bootstrap.servers": bootstrap, **DEFAULTS}, extra, REQUIRED, "weaken delivery"
    )


def check_reachable(config: Mapping[str, Any], timeout: float = 10.0) -> None:
    """Raise `KafkaUnavailable` unless a broker answers a metadata request within `timeout`."""
    admin_config = {
        k: v
        for k, v in config.items()
        if k.startswith(("bootstrap.", "security.", "sasl.", "ssl.", "client."))
    }
    # Quiet: the outcome is reported once, below, not as one librdkafka line per retry.
    admin_config["log_level"] = 0
    try:
        AdminClient(admin_config).list_topics(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0]
        reason = error.str() if isinstance(error, KafkaError) else str(error)
        raise KafkaUnavailable(
            f"no Kafka broker answered at {config.get('bootstrap.servers')} "
            f"within {timeout:g}s: {reason}"
        ) from None


def kafka_headers(message: StoredMessage) -> list[tuple[str, str | bytes | None]]:
    """Kafka headers of a message: outbox's own, then the user's (str values as UTF-8)."""
    headers: list[tuple[str, str | bytes | None]] = [
        (MESSAGE_ID, str(message.message_id).encode()),
        (CREATED_AT, message.created_at.isoformat().encode()),
        (CONTENT_TYPE, message.content_type.encode()),
    ]
    headers.extend(
        (name, value.encode() if isinstance(value, str) else value)
        for name, value in message.headers.items()
    )
    return headers


def _failure(error: KafkaError) -> DeliveryFailure:
    return DeliveryFailure(
        error=f"{error.name()}: {error.str()}", permanent=error.code() in PERMANENT
    )


class KafkaPublisher:
    """Publishes batches through one long-lived confluent-kafka `Producer`."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._producer = Producer(self._config)

    def publish(self, messages: Sequence[StoredMessage]) -> list[DeliveryFailure | None]:
        results: list[DeliveryFailure | None] = [None] * len(messages)
        pending = 0
        fatal: list[KafkaError] = []

        def report(index: int) -> Any:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                nonlocal pending
                pending -= 1
                if err is not None:
                    results[index] = _failure(err)
                    if err.fatal() or err.code() in IDENTITY_LOST:
                        fatal.append(err)

            return on_delivery

        for index, message in enumerate(messages):
            while True:
                try:
                    self._producer.produce(
                        message.topic,
                        value=message.payload,
                        key=message.key,
                        headers=kafka_headers(message),
                        on_delivery=report(index),
                    )
                    pending += 1
                    break
                except BufferError:
                    # The local queue is full: serve delivery reports to make room.
                    self._producer.poll(0.05)
                except KafkaException as exc:
                    results[index] = _failure(exc.args[0])
                    break
        # Every produced message gets exactly one delivery report, success or failure, at the
        # latest after message.timeout.ms; wait for all of them.
        deadline = time.monotonic() + 600
        while pending > 0:
            self._producer.poll(0.1)
            if time.monotonic() > deadline:  # pragma: no cover - librdkafka contract broken
                raise RuntimeError(f"{pending} delivery reports never arrived")
        if fatal:
            # The client is poisoned; the failed rows are retried through a new one.
            log.error("kafka producer lost its identity, recreating it: %s", fatal[0].str())
            self._producer.flush(0)
            self._producer = Producer(self._config)
        return results

    def close(self) -> None:
        self._producer.flush(30)
