"""broker.send with every supported transaction handle, through the relay to a real broker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox import Broker, Message
from outbox.postgres.migrate import sqlalchemy_url

from .relay_helpers import consume, count, header, relay_until_empty

broker = Broker()


class Rollback(Exception):
    pass


def _send_pair_psycopg(url: str, topic: str) -> tuple[uuid.UUID, uuid.UUID]:
    with psycopg.connect(url) as conn:
        with conn.transaction():
            committed = broker.send(
                conn, topic, {"n": 1}, key="k", headers={"h": "v", "raw": b"\x00\x01"}
            )
        with pytest.raises(Rollback), conn.transaction():
            rolled_back = broker.send(conn, topic, {"n": 2}, key="k")
            raise Rollback
    return committed, rolled_back


async def _send_pair_psycopg_async(url: str, topic: str) -> tuple[uuid.UUID, uuid.UUID]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        async with conn.transaction():
            committed = await broker.send_async(
                conn, topic, {"n": 1}, key="k", headers={"h": "v", "raw": b"\x00\x01"}
            )
        with pytest.raises(Rollback):
            async with conn.transaction():
                rolled_back = await broker.send_async(conn, topic, {"n": 2}, key="k")
                raise Rollback
    return committed, rolled_back


def _send_pair_sqlalchemy_session(url: str, topic: str) -> tuple[uuid.UUID, uuid.UUID]:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with Session(engine) as session:
            session.execute(text("CREATE TABLE orders (id int)"))
            committed = broker.send(
                session, topic, {"n": 1}, key="k", headers={"h": "v", "raw": b"\x00\x01"}
            )
            session.execute(text("INSERT INTO orders VALUES (1)"))
            session.commit()
            session.execute(text("INSERT INTO orders VALUES (2)"))
            rolled_back = broker.send(session, topic, {"n": 2}, key="k")
            session.rollback()
            assert session.execute(text("SELECT count(*) FROM orders")).scalar() == 1
    finally:
        engine.dispose()
    return committed, rolled_back


def _send_pair_sqlalchemy_connection(url: str, topic: str) -> tuple[uuid.UUID, uuid.UUID]:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            committed = broker.send(
                conn, topic, {"n": 1}, key="k", headers={"h": "v", "raw": b"\x00\x01"}
            )
            conn.commit()
            with pytest.raises(Rollback), conn.begin():
                rolled_back = broker.send(conn, topic, {"n": 2}, key="k")
                raise Rollback
    finally:
        engine.dispose()
    return committed, rolled_back


async def _send_pair_sqlalchemy_async_session(url: str, topic: str) -> tuple[uuid.UUID, uuid.UUID]:
    engine = create_async_engine(sqlalchemy_url(url))
    try:
        async with AsyncSession(engine) as session:
            committed = await broker.send_async(
                session, topic, {"n": 1}, key="k", headers={"h": "v", "raw": b"\x00\x01"}
            )
            await session.commit()
            rolled_back = await broker.send_async(session, topic, {"n": 2}, key="k")
            await session.rollback()
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))  # an AsyncConnection works as well
            extra = await broker.send_async(conn, topic, {"n": 3}, key="k")
            await conn.rollback()
            assert extra != committed
    finally:
        await engine.dispose()
    return committed, rolled_back


SENDERS: dict[str, Callable[[str, str], Any]] = {
    "psycopg": _send_pair_psycopg,
    "psycopg-async": _send_pair_psycopg_async,
    "sqlalchemy-session": _send_pair_sqlalchemy_session,
    "sqlalchemy-connection": _send_pair_sqlalchemy_connection,
    "sqlalchemy-async-session": _send_pair_sqlalchemy_async_session,
}


@pytest.mark.parametrize("handle", list(SENDERS))
async def test_committed_send_arrives_once_and_rolled_back_send_never(
    handle: str, outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    result = SENDERS[handle](outbox_database_url, outbox_topic)
    if not isinstance(result, tuple):
        result = await result
    committed, rolled_back = result
    assert count(outbox_database_url) == 1

    relay_until_empty(outbox_database_url, outbox_kafka_bootstrap)

    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=1, timeout=10)
    assert len(messages) == 1
    m = messages[0]
    assert header(m, "outbox-message-id") == str(committed).encode()
    assert header(m, "outbox-message-id") != str(rolled_back).encode()
    assert m.key() == b"k"
    assert json.loads(m.value()) == {"n": 1}
    assert header(m, "h") == b"v"
    assert header(m, "raw") == b"\x00\x01"
    assert header(m, "content-type") == b"application/json"
    assert header(m, "outbox-created-at") is not None


def test_send_many_writes_one_batch_and_keeps_its_order(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        ids = broker.send_many(
            conn, [Message(outbox_topic, f"m{i}", key="same") for i in range(50)]
        )
    assert len(set(ids)) == 50
    relay_until_empty(outbox_database_url, outbox_kafka_bootstrap)
    messages = consume(outbox_kafka_bootstrap, outbox_topic, expected=50)
    assert [m.value() for m in messages] == [f"m{i}".encode() for i in range(50)]
    assert [header(m, "outbox-message-id") for m in messages] == [str(i).encode() for i in ids]


def test_send_does_not_commit_or_open_a_connection(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        broker.send(conn, "t.never", b"x")
        # Still inside the caller's (implicit) transaction: nothing is visible elsewhere.
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert count(outbox_database_url) == 0
        pid = conn.info.backend_pid
        with psycopg.connect(outbox_database_url) as other:
            backends = other.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            ).fetchone()
        assert backends == (1,), "send opened a connection of its own"
        assert conn.info.backend_pid == pid
        conn.rollback()
    assert count(outbox_database_url) == 0


def test_the_largest_message_send_accepts_is_delivered_and_one_byte_more_is_refused(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    """With librdkafka's default message.max.bytes, every message `send` accepts is deliverable."""
    from outbox import PayloadTooLarge
    from outbox.core.envelope import DEFAULT_MAX_MESSAGE_BYTES, record_size
    from outbox.core.serializers import BYTES

    url, broker = outbox_database_url, Broker()
    assert broker.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    key, headers = "big-key", {"h": "value", "blob": b"\x00\x01"}
    empty = broker._compose(outbox_topic, b"", key, headers, None)
    room = DEFAULT_MAX_MESSAGE_BYTES - record_size(empty.key, b"", BYTES, empty.headers)
    payload = bytes(range(256)) * (room // 256) + b"x" * (room % 256)
    with psycopg.connect(url) as conn, conn.transaction():
        with pytest.raises(PayloadTooLarge, match=f"{DEFAULT_MAX_MESSAGE_BYTES + 1}-byte"):
            broker.send(conn, outbox_topic, payload + b"x", key=key, headers=headers)
        sent = broker.send(conn, outbox_topic, payload, key=key, headers=headers)
    relay_until_empty(url, outbox_kafka_bootstrap)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.producer_dead").fetchone() == (0,)
    [message] = consume(outbox_kafka_bootstrap, outbox_topic, 1)
    assert message.value() == payload and message.key() == key.encode()
    assert header(message, "outbox-message-id") == str(sent).encode()
    assert header(message, "blob") == b"\x00\x01"
