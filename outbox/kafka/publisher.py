"""A `Publisher` on confluent-kafka: idempotent, acks=all, one delivery report per message."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from outbox.core.batches import OutgoingRecord
from outbox.core.errors import ConfigurationError, InvalidHeaders, KafkaUnavailable
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID
from outbox.core.redact import MASK, redact_text, secrets_of_settings
from outbox.core.text import first_line, storable
from outbox.core.wire import WireHeaders
from outbox.ports import DeliveryFailure

log = logging.getLogger("outbox.kafka")
#: librdkafka's own log lines, routed through logging instead of raw stderr.
rdkafka_log = logging.getLogger("outbox.kafka.librdkafka")
#: librdkafka's warning that a setting is for the other kind of client (`session.timeout.ms`
#: given to a producer): expected, since one `--kafka-config` or OUTBOX_KAFKA_CONFIG_<NAME>
#: serves the relay and the consumer of `outbox run` alike.
OTHER_CLIENTS_SETTING = re.compile(
    r"is a (?:consumer|producer) property and will be ignored by this (?:producer|consumer)"
)


class _OtherClientsSettings(logging.Filter):
    """Logs librdkafka's OTHER_CLIENTS_SETTING warnings at DEBUG: the setting is ignored by
    this client and used by the other, as meant."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        if OTHER_CLIENTS_SETTING.search(record.getMessage()) is None:
            return True
        if not rdkafka_log.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


#: What varies between two lines librdkafka repeats: "(after 0ms in state CONNECT)".
_REPEAT_NOISE = re.compile(r"\(after \d+ms in state \w+\)")


class _Repeats(logging.Filter):
    """Lets one line of each kind through per `interval` seconds, and says how many were held
    when the next goes out: with its broker gone, a consumer's librdkafka logs "Connect to ...
    failed" about 20 times a second (its coordinator queries skip the reconnect backoff), an
    ERROR flood in the daemons' log for as long as the outage lasts."""

    def __init__(self, interval: float = 10.0, kinds: int = 256) -> None:
        super().__init__()
        self.interval = interval
        self.kinds = kinds
        self._lock = threading.Lock()
        #: a line's kind -> (when one was last let through, how many were held since)
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        text = record.getMessage()
        kind = (record.levelno, _REPEAT_NOISE.sub("", text))
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(kind, (None, 0))
            if last is not None and now - last < self.interval:
                self._seen[kind] = (last, held + 1)
                return False
            self._seen.pop(kind, None)
            if len(self._seen) >= self.kinds:  # the oldest kind goes: memory stays bounded
                self._seen.pop(next(iter(self._seen)))
            self._seen[kind] = (now, 0)
        if held and last is not None:
            record.msg, record.args = (
                f"{text} (repeated {held} times in the last {now - last:.0f}s)",
                None,
            )
        return True


rdkafka_log.addFilter(_OtherClientsSettings())
rdkafka_log.addFilter(_Repeats())

#: Settings the delivery guarantee depends on; a user override that weakens them is refused.
REQUIRED = {"enable.idempotence": "true", "acks": "all"}
DEFAULTS: dict[str, Any] = {
    "linger.ms": 5,
    # The Java client's partitioner, so that a key lands in the same partition whichever
    # language produced it.
    "partitioner": "murmur2_random",
    "message.timeout.ms": 30000,
    "socket.keepalive.enable": True,
    # Connect to the brokers as soon as the metadata names them, so that the idempotent
    # producer id is acquired before the first batch (see KafkaPublisher._new_client).
    "enable.sparse.connections": False,
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


def client(factory: Callable[[dict[str, Any]], Any], config: Mapping[str, Any]) -> Any:
    """`factory(config)` (a librdkafka Producer, Consumer or AdminClient); settings librdkafka
    refuses (an unknown name, a value of the wrong kind) raise `ConfigurationError` saying so,
    instead of a bare KafkaException."""
    try:
        return factory(dict(config))
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
            raise ConfigurationError(
                "librdkafka refused a Kafka setting (--kafka-config, an "
                f"OUTBOX_KAFKA_CONFIG_<NAME> variable or --kafka-config-file): {error.str()}"
            ) from None
        raise


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
        if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
            # librdkafka refused a setting (a certificate that is not PEM, a file that cannot
            # be read) before any broker was asked: no retry can fix it, and "no broker
            # answered" would send the operator to the network.
            for secret in sorted(secrets_of_settings(config), key=len, reverse=True):
                reason = reason.replace(secret, MASK)
            raise ConfigurationError(
                f"librdkafka refused the Kafka settings: {redact_text(reason)}"
            ) from None
        raise KafkaUnavailable(
            f"no Kafka broker answered at {config.get('bootstrap.servers')} "
            f"within {timeout:g}s: {reason}"
        ) from None


def _failure(error: KafkaError) -> DeliveryFailure:
    return DeliveryFailure(
        error=storable(f"{error.name()}: {error.str()}"), permanent=error.code() in PERMANENT
    )


#: A record as produce() takes it: topic, key, value, headers.
_Record = tuple[str, bytes | None, bytes, WireHeaders]


def _record(row: OutgoingRecord) -> _Record | DeliveryFailure:
    """The record of an outgoing record, or the permanent failure of one that cannot be one."""
    if row.headers is None:  # the usual case: outbox's headers only
        headers: WireHeaders = [
            (MESSAGE_ID, row.message_id),
            (CREATED_AT, row.created_at),
            (CONTENT_TYPE, row.content_type),
        ]
    else:
        try:
            headers = row.wire_headers()
        except InvalidHeaders as exc:
            return DeliveryFailure(error=storable(str(exc)), permanent=True)
    return (row.topic, row.key, row.payload, headers)


def _produce_error(exc: Exception) -> KafkaError | DeliveryFailure:
    """The outcome of a record whose produce() raised `exc` (not BufferError)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    # TypeError, ValueError, ...: the record itself is wrong, trying again cannot help.
    return DeliveryFailure(
        error=f"produce() refused the record: {type(exc).__name__}: {first_line(exc)}",
        permanent=True,
    )


#: Seconds a new producer client waits for the cluster's metadata before its first batch.
WARM_UP_TIMEOUT = 5.0

#: A message not yet reported on (the initial state of each slot in a batch's results).
_PENDING: Any = object()


class _Outcomes:
    """The outcome of each message of the batch in hand: _PENDING, None (acknowledged), the
    KafkaError of its delivery report (or of produce()), or the DeliveryFailure of a record that
    could not be produced. One per client, so that a report a
    discarded client might still serve cannot land in a later batch."""

    __slots__ = ("slots",)

    def __init__(self) -> None:
        self.slots: list[Any] = []


class KafkaPublisher:
    """Publishes batches through one long-lived confluent-kafka `Producer`.

    Each message of a batch gets its own delivery report callback, which records the outcome
    in the batch's slot of that message; the callbacks are made once and reused, so a message
    costs no Python object beyond its header list. `flush` sends at once (it does not wait for
    `linger.ms`) and returns when every report was served.

    `publish` calls the caller's `meanwhile` between producing and waiting, so that the caller
    can do other work (the relay fetches its next batch) while the batch is on its way.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._new_client()

    def _new_client(self) -> None:
        self._producer = client(Producer, self._config)
        self._outcomes = _Outcomes()
        self._held: dict[bytes, DeliveryFailure] = {}
        self._callbacks: list[Callable[[KafkaError | None, Message], None]] = []
        # Warm up: with the metadata in hand the client connects to the brokers and acquires
        # its idempotent producer id now. Otherwise the first produce often found no broker up
        # and the id was retried on a 500 ms timer: the first batch took 0.5-1 s.
        try:
            self._producer.list_topics(timeout=WARM_UP_TIMEOUT)
        except KafkaException as exc:  # the first batch will wait for the broker instead
            log.warning("kafka producer warm-up: %s", exc)

    @staticmethod
    def _callback(outcomes: _Outcomes, index: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            outcomes.slots[index] = err

        return on_delivery

    def publish(
        self,
        records: Sequence[OutgoingRecord],
        meanwhile: Callable[[], None] | None = None,
    ) -> list[DeliveryFailure | None]:
        """Hand the batch to the client, call `meanwhile`, then wait for every report."""
        self._produce_records(records)
        if meanwhile is not None:
            meanwhile()
        return self.wait()

    def _produce_records(self, records: Sequence[OutgoingRecord]) -> None:
        """Hand a batch to the client; `wait` returns their outcomes. A record that cannot be
        made a Kafka record (headers not in outbox's form) fails permanently."""
        self._produce((_record(row) for row in records), len(records))

    def _produce(self, records: Iterable[_Record | DeliveryFailure], count: int) -> None:
        """Produce `count` records (topic, key, value, headers), each with its report slot; an
        entry that is a DeliveryFailure is that record's outcome, and is not produced.

        Whatever produce() raises for one record is that record's outcome (the rest of the batch
        goes on): a KafkaError as for a delivery report, any other error a permanent failure.
        """
        if len(self._producer):
            # An earlier batch was left with reports due (its caller's `meanwhile` raised: the
            # relay's database went away, say). They are served now, into that batch's slots:
            # otherwise they would land in this batch's, a message of it taken as acknowledged
            # for another's report, or a report past its end.
            self._serve_outstanding()
        self._outcomes.slots = outcomes = [_PENDING] * count
        # Keys of which a record failed at produce() with an error a retry may fix: their later
        # records of the batch are not produced (they would overtake it) but fail with it.
        self._held = {}
        while len(self._callbacks) < count:
            self._callbacks.append(self._callback(self._outcomes, len(self._callbacks)))
        callbacks = self._callbacks
        producer = self._producer
        produce = producer.produce
        held = self._held
        for index, record in enumerate(records):
            if isinstance(record, DeliveryFailure):
                outcomes[index] = record
                continue
            topic, key, value, headers = record
            if held and key in held:
                outcomes[index] = held[key]
                continue
            while True:
                try:
                    produce(topic, value, key, on_delivery=callbacks[index], headers=headers)
                    break
                except BufferError:
                    if len(producer) == 0:  # nothing queued, yet no room: it can never fit
                        outcomes[index] = DeliveryFailure(
                            error="message larger than the producer's local queue "
                            "(queue.buffering.max.kbytes)",
                            permanent=True,
                        )
                        break
                    # The local queue is full: serve delivery reports to make room.
                    producer.poll(0.05)
                except Exception as exc:
                    outcome = outcomes[index] = _produce_error(exc)
                    if (
                        key is not None
                        and isinstance(outcome, KafkaError)
                        and outcome.code() not in PERMANENT
                    ):
                        held[key] = DeliveryFailure(
                            error=storable(
                                "not produced: an earlier message of its key failed "
                                f"({outcome.name()}: {outcome.str()})"
                            )
                        )
                    break

    def _serve_outstanding(self) -> None:
        """Serve every report still due (each arrives, at the latest after message.timeout.ms),
        into the slots of the batch in hand, which nobody reads any more."""
        deadline = time.monotonic() + 600
        while self._producer.flush(0.5) > 0:
            if time.monotonic() > deadline:  # pragma: no cover - librdkafka contract broken
                raise RuntimeError("delivery reports never arrived")

    def wait(self) -> list[DeliveryFailure | None]:
        """The outcome of each message of the batch last produced, once all are known."""
        outcomes = self._outcomes.slots
        # Every produced message gets exactly one delivery report, success or failure, at the
        # latest after message.timeout.ms; flush() serves them all (and sends without waiting
        # for linger.ms).
        self._serve_outstanding()
        # (Compare by identity only: KafkaError's == raises when compared with None.)
        for outcome in outcomes:
            if outcome is not None:
                break
        else:
            return outcomes  # every message acknowledged: the common case
        results: list[DeliveryFailure | None] = []
        fatal: list[KafkaError] = []
        for outcome in outcomes:
            if outcome is None:
                results.append(None)
            elif outcome is _PENDING:  # pragma: no cover - librdkafka contract broken
                results.append(DeliveryFailure(error="no delivery report"))
            elif isinstance(outcome, DeliveryFailure):
                results.append(outcome)
            else:
                results.append(_failure(outcome))
                if outcome.fatal() or outcome.code() in IDENTITY_LOST:
                    fatal.append(outcome)
        if fatal:
            # The client is poisoned; the failed rows are retried through a new one.
            log.error("kafka producer lost its identity, recreating it: %s", fatal[0].str())
            self._producer.flush(0)
            self._new_client()
        return results

    def close(self) -> None:
        self._producer.flush(30)
