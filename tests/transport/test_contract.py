"""The transport contract: what the Producer and the Consumer rely on, for every transport.

The calls are the daemons' own: `publish` of outgoing records (with the relay's `meanwhile`),
`poll` of an `InboxBatch`, `commit` of that batch.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import psycopg

from outbox.core.batches import InboxBatch, OutgoingRecord, outgoing
from outbox.core.envelope import InboxRow, StoredMessage
from outbox.core.ids import uuid7
from outbox.core.partitioning import partition_for
from outbox.ports import Publisher, Subscriber

from .conftest import TransportUnderTest


def message(
    topic: str,
    payload: bytes = b"{}",
    *,
    key: bytes | None = None,
    headers: dict[str, str | bytes] | None = None,
    content_type: str = "application/json",
) -> StoredMessage:
    """A row of producer_queue as the relay hands it to a publisher."""
    return StoredMessage(
        id=0,
        message_id=uuid7(),
        topic=topic,
        key=key,
        payload=payload,
        content_type=content_type,
        headers=headers or {},
        created_at=datetime.now(UTC),
        attempts=0,
    )


def publish(publisher: Publisher, messages: list[StoredMessage]) -> list[object]:
    """Publish as the relay does: outgoing records, fetching the next batch `meanwhile`."""
    called: list[bool] = []
    results = publisher.publish([outgoing(m) for m in messages], lambda: called.append(True))
    assert called == [True], "meanwhile is called exactly once"
    return list(results)


class Received(list[InboxRow]):
    """The rows received, and the batches they came in (to commit them as the Consumer does)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[InboxBatch] = []


def receive(
    transport: TransportUnderTest, subscriber: Subscriber, expected: int, timeout: float = 30.0
) -> Received:
    """Poll until `expected` rows arrived, then a little longer to catch unexpected extras."""
    received = Received()

    def poll(wait: float) -> None:
        batch = subscriber.poll(100, wait)
        assert isinstance(batch, InboxBatch)
        if batch:
            received.batches.append(batch)
            received.extend(batch.rows())

    deadline = time.monotonic() + timeout
    while len(received) < expected and time.monotonic() < deadline:
        poll(0.2)
    poll(transport.settle)
    return received


def ids(rows: list[InboxRow]) -> list[uuid.UUID]:
    return [r.message_id for r in rows]


def test_publish_returns_one_outcome_per_message_in_order(transport: TransportUnderTest) -> None:
    topic = transport.topic()
    batch = [
        message(topic, b'{"n": 1}', key=b"a"),
        message(topic, b"x" * 2_000_000, key=b"a"),  # larger than any broker accepts by default
        message(topic, b'{"n": 3}', key=b"b"),
    ]
    results = publish(transport.publisher(), batch)
    assert len(results) == 3
    assert results[0] is None and results[2] is None
    failure = results[1]
    assert failure is not None and failure.permanent, failure
    assert "MSG_SIZE_TOO_LARGE" in failure.error
    rows = receive(transport, transport.subscriber([topic], f"g-{uuid.uuid4().hex[:8]}"), 2)
    assert sorted(ids(rows)) == sorted([batch[0].message_id, batch[2].message_id])


def test_order_per_key_is_kept_in_the_partition_kafka_would_choose(
    transport: TransportUnderTest,
) -> None:
    topic = transport.topic(partitions=3)
    keys = [f"order-{i}".encode() for i in range(5)]
    publisher = transport.publisher()
    sent: dict[uuid.UUID, tuple[bytes, int]] = {}
    for start in range(0, 20, 5):  # four batches, keys interleaved within each
        batch = [
            message(topic, str(n).encode(), key=k) for n in range(start, start + 5) for k in keys
        ]
        assert publish(publisher, batch) == [None] * len(batch)
        sent.update({m.message_id: (m.key or b"", int(m.payload)) for m in batch})
    rows = receive(transport, transport.subscriber([topic], f"g-{uuid.uuid4().hex[:8]}"), len(sent))
    assert sorted(ids(rows)) == sorted(sent)
    sequence: dict[bytes, list[int]] = defaultdict(list)
    partitions: dict[bytes, set[int]] = defaultdict(set)
    for row in rows:
        key, n = sent[row.message_id]
        assert row.key == key
        sequence[key].append(n)
        partitions[key].add(row.partition)
    for key in keys:
        assert sequence[key] == sorted(sequence[key]) == list(range(20)), key
        assert partitions[key] == {partition_for(key, 3)}, key


def test_keys_values_and_headers_round_trip(transport: TransportUnderTest) -> None:
    topic = transport.topic()
    sent = [
        message(topic, b"\x00\xff binary", key=None, content_type="application/octet-stream"),
        message(
            topic,
            b'{"a": 1}',
            key=b"k\xff",
            headers={
                "text": "h\u00e9llo",
                "binary": b"\xff\x00\xfe",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            },
        ),
        message(topic, b"", key=b"empty"),
    ]
    assert publish(transport.publisher(), sent) == [None, None, None]
    rows = {
        r.message_id: r for r in receive(transport, transport.subscriber([topic], "g-round"), 3)
    }
    assert set(rows) == {m.message_id for m in sent}
    for m in sent:
        row = rows[m.message_id]
        assert (row.topic, row.key, row.payload) == (m.topic, m.key, m.payload)
        assert row.headers == m.headers
        assert row.content_type == m.content_type
        assert row.created_at == m.created_at
        assert row.offset >= 0 and row.partition in range(3)


def test_a_group_resumes_after_its_last_committed_offset(transport: TransportUnderTest) -> None:
    topic = transport.topic(partitions=1)
    publisher = transport.publisher()
    first = [message(topic, str(n).encode()) for n in range(6)]
    assert publish(publisher, first) == [None] * 6
    subscriber = transport.subscriber([topic], "g-resume")
    rows = receive(transport, subscriber, 6)
    assert ids(rows) == [m.message_id for m in first]
    assert len(rows.batches) >= 1
    # Commit as the Consumer does, a whole batch: the first four records as a batch of their own.
    subscriber.commit(InboxBatch.of(rows[:4]))
    subscriber.close()

    later = [message(topic, str(n).encode()) for n in range(6, 8)]
    assert publish(publisher, later) == [None, None]
    rows = receive(transport, transport.subscriber([topic], "g-resume"), 4)
    assert ids(rows) == [m.message_id for m in first[4:] + later]


def test_uncommitted_messages_are_delivered_again_after_a_restart(
    transport: TransportUnderTest,
) -> None:
    topic = transport.topic()
    sent = [message(topic, str(n).encode(), key=f"k{n}".encode()) for n in range(5)]
    assert publish(transport.publisher(), sent) == [None] * 5
    subscriber = transport.subscriber([topic], "g-restart")
    assert sorted(ids(receive(transport, subscriber, 5))) == sorted(m.message_id for m in sent)
    subscriber.close()  # no commit

    again = receive(transport, transport.subscriber([topic], "g-restart"), 5)
    assert sorted(ids(again)) == sorted(m.message_id for m in sent)


def test_two_groups_each_receive_every_message(transport: TransportUnderTest) -> None:
    topic = transport.topic()
    sent = [message(topic, str(n).encode(), key=f"k{n % 4}".encode()) for n in range(12)]
    assert publish(transport.publisher(), sent) == [None] * 12
    expected = sorted(m.message_id for m in sent)
    for group in ("g-billing", "g-shipping"):
        subscriber = transport.subscriber([topic], group)
        rows = receive(transport, subscriber, 12)
        assert sorted(ids(rows)) == expected, group
        for batch in rows.batches:
            subscriber.commit(batch)


def test_a_record_whose_stored_headers_are_not_outbox_form_fails_alone(
    transport: TransportUnderTest,
) -> None:
    topic = transport.topic()
    good = [outgoing(message(topic, str(n).encode(), key=b"k")) for n in range(2)]
    bad = OutgoingRecord(*good[0][:7], '{"h": {"nope": 1}}', 0)._replace(message_id=str(uuid7()))
    results = transport.publisher().publish([good[0], bad, good[1]])
    assert results[0] is None and results[2] is None
    failure = results[1]
    assert failure is not None and failure.permanent and "outbox's form" in failure.error
    rows = receive(transport, transport.subscriber([topic], f"g-{uuid.uuid4().hex[:8]}"), 2)
    assert sorted(r.message_id for r in rows) == sorted(uuid.UUID(r.message_id) for r in good)


def test_an_error_of_the_callers_meanwhile_leaves_the_next_batch_its_own_outcomes(
    transport: TransportUnderTest,
) -> None:
    """The relay's next fetch runs during a publish (`meanwhile`); when its database goes away,
    that error comes out of `publish`, and the batch's reports, still due, must not land in the
    next batch's results (a soak once met a relay stopped by a report past its batch's end)."""
    topic = transport.topic()
    publisher = transport.publisher()
    first = [message(topic, str(n).encode(), key=str(n).encode()) for n in range(50)]

    class RelayDatabaseGone(psycopg.OperationalError):
        pass

    def meanwhile() -> None:
        raise RelayDatabaseGone

    try:
        publisher.publish([outgoing(m) for m in first], meanwhile)
    except RelayDatabaseGone:
        pass
    else:
        raise AssertionError("publish swallowed its caller's error")
    too_large = message(topic, b"x" * 2_000_000, key=b"big")
    second = [message(topic, b'{"n": 1}', key=b"3"), too_large]
    results = publish(publisher, second)
    assert results[0] is None, results
    assert results[1] is not None and "MSG_SIZE_TOO_LARGE" in results[1].error, results
    # The second batch's good message arrives; the first batch's, if published, only once each.
    rows = receive(transport, transport.subscriber([topic], f"g-{uuid.uuid4().hex[:8]}"), 51, 10)
    received = ids(rows)
    assert second[0].message_id in received
    assert len(received) == len(set(received))
    assert set(received) <= {m.message_id for m in first} | {second[0].message_id}
