"""Foreign Kafka records (Hypothesis): whatever another producer writes into a handled topic,
the Consumer and the Handler stay up, and every record is handled exactly once or quarantined.

Each example produces a batch of raw records with confluent-kafka (random keys, values and
headers, missing or garbage outbox headers, any content type), then a sentinel message sent
through outbox, and drains (the real Producer, Consumer and HandlerRunner, on the session's
broker). The topic has one partition, so the sentinel comes after the batch: once it is handled
the Consumer has read every record. Invariant, per offset: one row in consumer_queue (none only
for a record whose outbox message id an earlier record of the batch already had), either
handled exactly once (the handler's effect committed once, with the record's key and value) or
dead with an error; a row the Consumer quarantined keeps the record's headers in raw_headers.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from outbox import Broker, Handlers, InboxMessage
from outbox.testing import DrainResult, drain
from outbox.testing.plugin import TANSU_CONSUMER_SETTINGS, TopicFactory
from outbox.testing.servers import Servers, TansuBroker

broker = Broker()

SEEN = """
CREATE TABLE IF NOT EXISTS seen (
    message_id uuid, source_partition integer, source_offset bigint, key bytea, payload bytea
)
"""

# -- strategies ----------------------------------------------------------------------------------

#: Header names: confluent-kafka encodes them as UTF-8, so no lone surrogates; NUL and the rest
#: are fair game (librdkafka takes a name up to its first NUL).
name_chars = st.one_of(
    st.sampled_from(["\x00", "é", "€", "\U0010ffff", "-", " "]),
    st.characters(exclude_categories=("Cs",)),
)
RESERVED = [
    "outbox-message-id",
    "outbox-created-at",
    "content-type",
    "Content-Type",
    "outbox-correlation-id",
    "outbox-causation-id",
    "traceparent",
]
odd_bytes = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"\x00", b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x00b", b"\\u0000"]),
)
ids = st.one_of(
    st.uuids().map(lambda u: str(u).encode()),
    st.uuids().map(lambda u: str(u).upper().encode()),
    st.uuids().map(lambda u: f"{{{u}}}".encode()),
    st.uuids().map(lambda u: u.bytes),  # 16 raw bytes, not the text form
    st.sampled_from([b"not-a-uuid", b"\x00" * 36, b"00000000-0000-0000-0000-00000000000\x00"]),
    odd_bytes,
    st.none(),
)
times = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda t: t.isoformat().encode()),
    st.sampled_from(
        [
            b"2026-01-01T00:00:00+00:00",
            b"2026-01-01",
            b"9999-12-31T23:59:59-14:00",
            b"0001-01-01T00:00:00+14:00",
            b"yesterday",
            b"\x00",
        ]
    ),
    odd_bytes,
    st.none(),
)
content_types = st.one_of(
    st.sampled_from(
        [
            b"application/json",
            b"text/plain; charset=utf-8",
            b"application/octet-stream",
            b"application/json\x00",
            b"\x00",
            b"",
            b"text/html",
        ]
    ),
    odd_bytes,
    st.none(),
)
other_header = st.tuples(
    st.one_of(
        st.text(name_chars, max_size=12),
        st.sampled_from(["traceparent", "outbox-correlation-id", "x"]),
    ),
    st.one_of(odd_bytes, st.none()),
)
header = st.one_of(
    other_header,
    other_header,
    st.tuples(st.just("outbox-message-id"), ids),
    st.tuples(st.just("outbox-created-at"), times),
    st.tuples(st.sampled_from(["content-type", "Content-Type"]), content_types),
)
values = st.one_of(
    st.none(),
    odd_bytes,
    st.sampled_from([b"{}", b'{"a": 1}', b'"\\u0000"', b"[1,", b"null", b"\xff\xfe"]),
)


@dataclass
class Record:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


records = st.builds(
    Record,
    key=st.one_of(st.none(), odd_bytes),
    value=values,
    headers=st.lists(header, max_size=6),
)

# -- what the consumer is expected to make of a record -------------------------------------------


def wire_name(name: str) -> str:
    """A header name as a consumer reads it back: librdkafka stops at the first NUL."""
    return name.split("\x00", 1)[0]


def outbox_id(record: Record) -> uuid.UUID | None:
    """The message id the record carries (the last outbox-message-id header), if it parses."""
    raw = None
    for name, value in record.headers:
        if wire_name(name) == "outbox-message-id":
            raw = value
    if raw is None:
        return None
    try:
        return uuid.UUID(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None


def expected_rows(batch: list[Record]) -> list[int]:
    """Rows expected per record: 1, or 0 for a repeat of an earlier record's message id."""
    seen: set[uuid.UUID] = set()
    counts = []
    for record in batch:
        mid = outbox_id(record)
        counts.append(0 if mid is not None and mid in seen else 1)
        if mid is not None:
            seen.add(mid)
    return counts


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- fixtures ------------------------------------------------------------------------------------


def drain_alone(handlers: Handlers, database_url: str, servers: Servers) -> DrainResult:
    """`drain` through the session's broker, as a consumer group of its own.

    Through Tansu, a drain whose Consumer never received a record (nothing relayed, or the
    only message dead in producer_queue) leaves its group unable to receive in the following
    drains: a group per example keeps one example from failing the next.
    """
    settings = TANSU_CONSUMER_SETTINGS if isinstance(servers.kafka, TansuBroker) else None
    return drain(
        handlers,
        database_url,
        servers.kafka.bootstrap,
        group=f"props-{uuid.uuid4().hex}",
        consumer_kafka_config=settings,
    )


@pytest.fixture
def producer(outbox_kafka_bootstrap: str) -> Iterator[Producer]:
    client = Producer({"bootstrap.servers": outbox_kafka_bootstrap, "linger.ms": 0})
    yield client
    client.flush(10)


def produce(producer: Producer, topic: str, batch: list[Record]) -> list[int]:
    """Produce the records in order and return their offsets."""
    offsets: list[int | None] = [None] * len(batch)
    errors: list[Any] = []

    def delivered(index: int) -> Any:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                errors.append(error)
            else:
                offsets[index] = message.offset()

        return report

    for index, record in enumerate(batch):
        producer.produce(
            topic,
            value=record.value,
            key=record.key,
            headers=record.headers,
            on_delivery=delivered(index),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    assert None not in offsets
    return [o for o in offsets if o is not None]


# The inbox's rows of the offsets: those still in consumer_queue (dead ones), and the handled
# ones (consumer_processed, which keeps no offset: found through what the handler saw).
ROWS = """
SELECT source_offset, false, dead_at IS NOT NULL, last_error, raw_headers, handled_count,
       message_id
FROM outbox.consumer_queue WHERE source_partition = 0 AND source_offset = ANY(%(offsets)s)
UNION ALL
SELECT s.source_offset, true, false, NULL, NULL, p.handled_count, p.message_id
FROM outbox.consumer_processed p
JOIN (SELECT DISTINCT message_id, source_partition, source_offset FROM seen) s
  ON s.message_id = p.message_id
WHERE s.source_partition = 0 AND s.source_offset = ANY(%(offsets)s)
"""


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(records, min_size=1, max_size=20))
def test_foreign_records_are_handled_once_or_quarantined(
    outbox_database_url: str,
    outbox_servers: Servers,
    outbox_topic_factory: TopicFactory,
    producer: Producer,
    batch: list[Record],
) -> None:
    # A topic per example: records that crashed the Consumer stay uncommitted, and must not
    # be read again by the next example (it would fail for the previous one's records).
    topic = outbox_topic_factory(partitions=1)  # one partition: the sentinel comes last
    with psycopg.connect(outbox_database_url, autocommit=True) as admin:
        admin.execute(SEEN)
        admin.execute("DELETE FROM seen")
        admin.execute("DELETE FROM outbox.consumer_queue")
        admin.execute("DELETE FROM outbox.consumer_processed")
        admin.execute("DELETE FROM outbox.producer_queue")

    offsets = produce(producer, topic, batch)
    with psycopg.connect(outbox_database_url) as conn:
        sentinel = broker.send(conn, topic, {"sentinel": True})

    handlers = Handlers()

    @handlers.handler(topic, max_attempts=1)
    def record(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO seen VALUES (%s, %s, %s, %s, %s)",
            (message.id, message.partition, message.offset, message.key, message.raw_payload),
        )

    # A daemon that dies raises its error here; a record never stored makes this time out.
    drain_alone(handlers, outbox_database_url, outbox_servers)

    with psycopg.connect(outbox_database_url) as conn:
        handled = conn.execute(
            "SELECT source_offset, key, payload, message_id FROM seen"
        ).fetchall()
        rows = conn.execute(ROWS, {"offsets": offsets}).fetchall()
    assert [mid for *_, mid in handled].count(sentinel) == 1, "the sentinel was not handled once"

    by_offset: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_offset.setdefault(row[0], []).append(row)
    effects: dict[int, list[tuple[Any, ...]]] = {}
    for offset, key, payload, _mid in handled:
        effects.setdefault(offset, []).append((key, payload))

    for record, offset, want in zip(batch, offsets, expected_rows(batch), strict=True):
        found = by_offset.get(offset, [])
        assert len(found) == want, f"offset {offset}: {len(found)} rows, expected {want}"
        if not found:
            continue
        (_o, processed, dead, last_error, raw_headers, handled_count, _mid) = found[0]
        if processed:
            assert not dead and handled_count == 1
            got = effects.get(offset, [])
            assert len(got) == 1, f"offset {offset} handled {len(got)} times"
            key, payload = got[0]
            assert (bytes(key) if key is not None else None) == record.key
            assert bytes(payload) == (record.value or b"")
        else:
            assert dead, f"offset {offset} is neither handled nor dead"
            assert last_error, f"offset {offset} is dead without an error"
            assert offset not in effects
            if raw_headers is not None:  # quarantined by the Consumer: the headers as they came
                assert raw_headers == [
                    [b64(wire_name(n).encode()), None if v is None else b64(v)]
                    for n, v in record.headers
                ]
