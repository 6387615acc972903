"""Messages delivered later, end to end on both transports (decision 21): a message sent with
`delay` in a committed transaction reaches the transport after its due time and not before; a
cancelled one never does; a rolled-back one never exists. Order per key with due times, on
several relays."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from outbox import Broker, Message
from outbox.core.lanes import lane_for

from .relay_helpers import RelayTransport, consume, count, header, running, wait_for

broker = Broker()
DELAY = timedelta(seconds=2)


class Rollback(Exception):
    pass


def _db_now(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def _due(url: str) -> dict[uuid.UUID, datetime]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT message_id, deliver_at FROM outbox.producer_scheduled")
        return {r[0]: r[1] for r in rows}


def _arrivals(transport: RelayTransport, topic: str, expected: int) -> dict[str, datetime]:
    """message id -> when the transport took the record (Kafka's create time, set by the relay
    as it produces; the log's append time), every record of `topic`."""
    if not transport.is_log:
        out = {}
        for m in consume(transport.endpoint, topic, expected):
            message_id = (header(m, "outbox-message-id") or b"").decode()
            out[message_id] = datetime.fromtimestamp(m.timestamp()[1] / 1000, UTC)
        return out
    from outbox.pglog.log import decode_headers

    with psycopg.connect(transport.endpoint) as conn:
        rows = conn.execute(
            "SELECT r.headers, r.created_at FROM outbox_log.log_records r "
            "JOIN outbox_log.log_partitions p ON p.id = r.partition_id "
            "JOIN outbox_log.log_topics t ON t.id = p.topic_id WHERE t.name = %s",
            (topic,),
        ).fetchall()
    result = {}
    for headers, created_at in rows:
        ids = [v for k, v in decode_headers(headers) if k == "outbox-message-id"]
        result[ids[0].decode()] = created_at
    return result


def test_a_delayed_message_arrives_after_its_due_time_and_a_cancelled_one_never(
    outbox_database_url: str, relay_transport: RelayTransport
) -> None:
    url = outbox_database_url
    topic = relay_transport.topic(3)
    with psycopg.connect(url) as conn:
        with conn.transaction():
            later = broker.send(conn, topic, {"n": "later"}, key="k", delay=DELAY)
            cancelled = broker.send(conn, topic, {"n": "cancelled"}, key="k", delay=DELAY)
            now = broker.send(conn, topic, {"n": "now"}, key="k")
        with pytest.raises(Rollback), conn.transaction():
            broker.send(conn, topic, {"n": "rolled back"}, key="k", delay=timedelta(0.5))
            raise Rollback
        with conn.transaction():
            assert broker.cancel(conn, cancelled) is True
    due = _due(url)
    assert set(due) == {later}  # the rolled-back one never existed, the cancelled one is gone
    with running(relay_transport.producer(url, poll_interval=0.5)):
        wait_for(lambda: count(url) == 0, 30, "the message due now to leave")
        # Until it is due the later one stays where the relay does not fetch it.
        while _db_now(url) < due[later] - timedelta(milliseconds=100):
            assert set(_due(url)) == {later}
            time.sleep(0.05)
        wait_for(
            lambda: count(url, "producer_scheduled") == 0 and count(url) == 0,
            30,
            "the delayed message to leave",
        )
        time.sleep(0.5)  # a cancelled message would have been due with it
    arrivals = _arrivals(relay_transport, topic, 2)
    assert set(arrivals) == {str(later), str(now)}
    assert arrivals[str(later)] >= due[later]
    assert arrivals[str(now)] < due[later]


def _labels_per_key(transport: RelayTransport, topic: str, expected: int) -> dict[str, list[str]]:
    """The labels of `topic`'s records per key, in the order of their partition."""
    import json

    if not transport.is_log:
        per_key: dict[str, list[str]] = {}
        records = sorted(consume(transport.endpoint, topic, expected), key=lambda m: m.offset())
        for m in records:
            per_key.setdefault(m.key().decode(), []).append(json.loads(m.value())["label"])
        return per_key
    with psycopg.connect(transport.endpoint) as conn:
        rows = conn.execute(
            "SELECT r.key, r.value FROM outbox_log.log_records r "
            "JOIN outbox_log.log_partitions p ON p.id = r.partition_id "
            "JOIN outbox_log.log_topics t ON t.id = p.topic_id WHERE t.name = %s "
            "ORDER BY p.partition, r.log_offset",
            (topic,),
        ).fetchall()
    result: dict[str, list[str]] = {}
    for key, value in rows:
        result.setdefault(bytes(key).decode(), []).append(json.loads(bytes(value))["label"])
    return result


@pytest.mark.parametrize(
    ("relays", "start_late"), [(1, False), (3, False), (3, True)], ids=["1", "3", "3-after-due"]
)
def test_order_per_key_is_the_order_messages_fall_due(
    outbox_database_url: str,
    relay_transport: RelayTransport,
    relays: int,
    start_late: bool,
) -> None:
    """Within a key: a delayed message never holds back a later one due sooner; messages
    leave in due-time order, also when the relays start after all of them fell due (they are
    moved in one pass); those due at the same time keep their send order; a message due now
    goes before the ones due later (docs/guarantees.md)."""
    url = outbox_database_url
    topic = relay_transport.topic(3)
    keys = [f"key-{n}" for n in range(6)]
    assert len({lane_for(k.encode(), uuid.uuid4()) for k in keys}) > 1  # several lanes
    with psycopg.connect(url) as conn, conn.transaction():
        for key in keys:
            # One statement, one now(): "same-1" and "same-2" are due at the same moment.
            broker.send_many(
                conn,
                [
                    Message(topic, {"label": "late"}, key=key, delay=timedelta(seconds=3)),
                    Message(topic, {"label": "soon"}, key=key, delay=timedelta(seconds=1)),
                    Message(topic, {"label": "same-1"}, key=key, delay=timedelta(seconds=2)),
                    Message(topic, {"label": "same-2"}, key=key, delay=timedelta(seconds=2)),
                    Message(topic, {"label": "now"}, key=key),
                ],
            )
    if start_late:
        time.sleep(3.2)
    producers = [relay_transport.producer(url, poll_interval=0.3) for _ in range(relays)]
    with _all_running(producers):
        wait_for(
            lambda: count(url, "producer_scheduled") == 0 and count(url) == 0,
            30,
            "every message to leave",
        )
    per_key = _labels_per_key(relay_transport, topic, 5 * len(keys))
    assert per_key == {key: ["now", "soon", "same-1", "same-2", "late"] for key in keys}


def _all_running(daemons: list[Any]) -> Any:
    from contextlib import ExitStack

    stack = ExitStack()
    for daemon in daemons:
        stack.enter_context(running(daemon))
    return stack
