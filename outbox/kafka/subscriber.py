"""A `Subscriber` on a confluent-kafka consumer group, with manual commits."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import Consumer as KafkaConsumer

from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.errors import ConfigurationError
from outbox.core.wire import (
    FOREIGN_NAMESPACE,
    RawHeaders,
    UnreadableHeaders,
    decode,
    decode_record,
    foreign_id,
)
from outbox.kafka.continuity import Continuity
from outbox.kafka.publisher import client, merge_settings
from outbox.kafka.start import JoinWatch, split_start, subscribe_callbacks

__all__ = [
    "FOREIGN_NAMESPACE",
    "InboxRow",
    "KafkaSubscriber",
    "consumer_config",
    "decode_record",
    "foreign_id",
    "inbox_batch",
    "to_inbox_row",
]

log = logging.getLogger("outbox.consumer")

REQUIRED = {"enable.auto.commit": "false"}
DEFAULTS: dict[str, Any] = {
    # How long a fetch may wait for data. Kafka answers as soon as data arrives; brokers that
    # answer only at this deadline (the local Tansu) would add up to it to every message's
    # latency. 25 ms costs an idle consumer about 40 small fetches a second.
    "fetch.wait.max.ms": 25,
    "auto.offset.reset": "earliest",
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": False,
    # How soon a subscribed topic that did not exist yet is noticed once it does (a Consumer
    # started before the first message of its topic was ever produced). librdkafka's default,
    # 5 minutes, held that first message as long; a metadata request every 5 s costs nothing.
    "topic.metadata.refresh.interval.ms": 5000,
}


def consumer_config(
    bootstrap: str, group: str, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """librdkafka settings of an inbox consumer; offsets are committed by outbox only."""
    if not group:
        raise ConfigurationError("a consumer group is required (--group)")
    return merge_settings(
        {"bootstrap.servers": bootstrap, "group.id": group, **DEFAULTS},
        extra,
        REQUIRED,
        "commit offsets before the inbox has the messages",
    )


class KafkaSubscriber:
    """A `Subscriber` on a confluent-kafka consumer group; offsets move only by `commit`."""

    def __init__(self, config: Mapping[str, Any], topics: Sequence[str]) -> None:
        settings, start = split_start(config)  # `--start` rides in the settings: take it out
        # Commits are asynchronous (see `commit`); their outcome arrives in a later poll.
        self._consumer = client(KafkaConsumer, {**settings, "on_commit": _committed})
        #: A partition's records must follow each other; a jump is read again (see there).
        self.continuity = Continuity()
        #: Says what the consumer waits for until its group assigns it partitions.
        self.joining = JoinWatch(settings)
        self._consumer.subscribe(
            list(topics), **subscribe_callbacks(settings, start, self.continuity, self.joining)
        )
        self.joining.begin()

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        """Wait for one record, then take what else is already there, up to `max_records`."""
        return inbox_batch(self._poll(max_records, timeout))

    def _poll(self, max_records: int, timeout: float) -> Sequence[Message]:
        """Wait for one record, then take what else is already there, up to `max_records`.

        `consume(n, timeout)` alone would hold the first record until n arrived or the timeout
        passed, adding the whole timeout to every message's latency at low rates.
        """
        first = self._consumer.poll(timeout)
        self.joining.waiting()
        if first is None:
            return []
        batch = [first]
        if max_records > 1:
            batch.extend(self._consumer.consume(max_records - 1, 0))
        records, seek = self.continuity.admit(self._records(batch))
        for (topic, partition), offset in seek.items():
            self._read_again(topic, partition, offset)
        return records

    def _read_again(self, topic: str, partition: int, offset: int) -> None:
        """Seek `partition` back to `offset`, the first record missing before a jump.

        A partition no longer assigned needs nothing (its next owner starts at the committed
        offset, which is not past `offset`). Otherwise a seek that fails would leave the hole
        behind the records to come: the error stops the Consumer, and the records are read
        again from the committed offset when it is restarted.
        """
        where = TopicPartition(topic, partition, offset)
        log.debug("%s[%d]: offsets jumped past %d; reading again from it", topic, partition, offset)
        try:
            self._consumer.seek(where)
        except KafkaException as exc:
            assigned = {(p.topic, p.partition) for p in self._consumer.assignment()}
            if (topic, partition) not in assigned:
                return
            raise KafkaException(
                f"cannot read {topic}[{partition}] again from offset {offset} after a jump "
                f"in its offsets: {exc}"
            ) from exc

    @staticmethod
    def _records(batch: list[Message]) -> list[Message]:
        """The records of a batch; a fatal error is raised, others are logged and skipped."""
        records = []
        for message in batch:
            error = message.error()
            if error is None:
                records.append(message)
            elif error.fatal():
                raise KafkaException(error)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("kafka: %s", error.str())
        return records

    def commit(self, batch: InboxBatch) -> None:
        """Commit the offsets after `batch` (it is stored), without waiting for the broker.

        Asynchronous on purpose: a synchronous commit can hang in librdkafka while the group
        coordinator is lost (confluent-kafka-python issue 1801); the hung consumer kept its
        partitions through its background heartbeat and stopped reading them (the chaos soak
        found it after broker freezes). A commit still goes out only after the inbox stored
        the batch, commits are sent in order, and `close` waits for the outstanding ones; one
        that fails is logged (`_committed`) and only means a redelivery, which the inbox's
        dedup absorbs.
        """
        offsets = [TopicPartition(t, p, o) for (t, p), o in batch.next_offsets().items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:  # refused at once (no assignment, say)
            log.warning("offset commit failed (the batch will be redelivered): %s", exc)

    def close(self) -> None:
        """Leave the group (its partitions go to the other members) and close the client."""
        self._consumer.close()


def _committed(error: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """librdkafka's report of an asynchronous commit: a failure is logged, never raised."""
    failed = [p for p in partitions if p.error is not None]
    if error is not None or failed:
        log.warning(
            "offset commit failed (the records will be redelivered, and deduplicated): %s",
            error.str() if error is not None else failed[0].error,
        )


def kafka_millis(message: Message) -> int | None:
    """A confluent-kafka record's own timestamp in milliseconds, or None (a `TimestampOf`)."""
    kind, millis = message.timestamp()
    return millis if kind != TIMESTAMP_NOT_AVAILABLE and millis > 0 else None


def inbox_batch(messages: Sequence[Message]) -> InboxBatch:
    """confluent-kafka records as an `InboxBatch` (the Consumer's path: no object per record)."""
    batch = InboxBatch(kafka_millis)
    add = batch.add
    for m in messages:
        add(*_fields(m), m)
    return batch


def _fields(
    message: Message,
) -> tuple[str, int, int, bytes | None, bytes, RawHeaders]:
    """A confluent-kafka record as the first arguments of `InboxBatch.add`."""
    key = message.key()
    value = message.value()
    headers: Any
    try:
        headers = message.headers() or ()
    except Exception as exc:  # a header the client cannot convert: quarantine the record
        headers = UnreadableHeaders.because(exc)
    return (
        message.topic() or "",
        message.partition() or 0,
        message.offset() or 0,
        key.encode() if isinstance(key, str) else key,
        value if isinstance(value, bytes) else value.encode() if isinstance(value, str) else b"",
        headers,
    )


def to_inbox_row(message: Message) -> InboxRow:
    """Convert a Kafka record; records from foreign producers get a deterministic id."""
    return decode(*_fields(message), message, kafka_millis)
