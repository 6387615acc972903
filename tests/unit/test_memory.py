"""The in-memory transport's own behaviour (the shared contract is in tests/transport/)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime

import pytest

from outbox.core.batches import OutgoingRecord, outgoing
from outbox.core.envelope import StoredMessage
from outbox.memory import InMemoryTransport, murmur2, partition_for
from outbox.ports import DeliveryFailure


def message(topic: str, key: bytes | None = None) -> OutgoingRecord:
    return outgoing(
        StoredMessage(
            id=0,
            message_id=uuid.uuid4(),
            topic=topic,
            key=key,
            payload=b"{}",
            content_type="application/json",
            headers={},
            created_at=datetime.now(UTC),
            attempts=0,
        )
    )


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # the Java client's own test vectors (UtilsTest.testMurmur2), as signed ints
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected & 0xFFFFFFFF


def test_partition_for_is_positive_modulo() -> None:
    assert partition_for(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert {partition_for(f"k{n}".encode(), 3) for n in range(50)} == {0, 1, 2}


def test_topics_are_created_on_first_publish_and_refused_twice() -> None:
    transport = InMemoryTransport(default_partitions=2)
    assert transport.publisher().publish([message("auto.created")]) == [None]
    assert transport.partitions("auto.created") == 2
    transport.create_topic("explicit", partitions=5)
    assert transport.topics == ["auto.created", "explicit"]
    with pytest.raises(ValueError, match="already exists"):
        transport.create_topic("explicit")


def test_a_topic_can_be_made_to_fail() -> None:
    transport = InMemoryTransport()
    failure = DeliveryFailure("REQUEST_TIMED_OUT: broker gone")
    transport.fail_topic("orders", failure)
    assert transport.publisher().publish([message("orders"), message("other")]) == [failure, None]
    transport.fail_topic("orders", None)
    assert transport.publisher().publish([message("orders")]) == [None]
    assert len(transport.records("orders")) == 1


def test_members_of_a_group_share_the_partitions_and_take_over_on_leave() -> None:
    transport = InMemoryTransport()
    transport.create_topic("t", partitions=4)
    keys = [f"k{n}".encode() for n in range(40)]
    transport.publisher().publish([message("t", k) for k in keys])
    a, b = transport.subscriber(["t"], "g"), transport.subscriber(["t"], "g")
    batch_a, batch_b = a.poll(1000, 0), b.poll(1000, 0)
    rows_a, rows_b = batch_a.rows(), batch_b.rows()
    assert len(rows_a) + len(rows_b) == 40
    assert {r.partition for r in rows_a}.isdisjoint({r.partition for r in rows_b})
    a.commit(batch_a)
    assert transport.lag("g", ["t"]) == len(rows_b)
    b.close()  # b never committed: a takes its partitions over from the committed offsets
    assert sorted(r.message_id for r in a.poll(1000, 0).rows()) == sorted(
        r.message_id for r in rows_b
    )
    with pytest.raises(RuntimeError, match="closed"):
        b.poll(1, 0)


def test_poll_waits_for_a_record_and_sees_topics_created_later() -> None:
    transport = InMemoryTransport()
    subscriber = transport.subscriber(["later"], "g")
    assert not subscriber.poll(10, 0.05)
    timer = threading.Timer(0.1, lambda: transport.publisher().publish([message("later")]))
    timer.start()
    started = time.monotonic()
    rows = subscriber.poll(10, 5.0)
    assert len(rows) == 1 and time.monotonic() - started < 2.0
    timer.join()


def test_keyless_records_spread_over_partitions() -> None:
    transport = InMemoryTransport()
    transport.publisher().publish([message("t") for _ in range(60)])
    assert {r.partition for r in transport.records("t")} == {0, 1, 2}
