"""`outbox.testing.sent`: what a block of code sent, read from producer_queue with no relay
running, through the caller's own handle (psycopg or SQLAlchemy, sync or async) in its open
transaction, which it leaves open and uncommitted, or through a URL; payloads decoded as the
receiving handler would, through the Topic; bad bytes reported on the message that has them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import Engine, create_engine, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from examples.contracts import OrderCreated, orders_created
from examples.orders_service import create_schema, place_order
from examples.orders_service.models import Order
from outbox import Broker, Message, Topic
from outbox.core.errors import OutboxError, UnsupportedTransaction
from outbox.core.serializers import JSON, TEXT
from outbox.postgres.migrate import sqlalchemy_url
from outbox.testing import PayloadUndecodable, sent, topic_renamed

broker = Broker()


@dataclass
class Shipped:
    order_id: int
    carrier: str


SHIPPED = Topic("orders.shipped", Shipped, key="order_id")


def _queued(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def engine(outbox_database_url: str) -> Iterator[Engine]:
    create_schema(outbox_database_url)
    engine = create_engine(sqlalchemy_url(outbox_database_url))
    yield engine
    engine.dispose()


@pytest.fixture
async def async_engine(outbox_database_url: str) -> AsyncIterator[AsyncEngine]:
    create_schema(outbox_database_url)
    engine = create_async_engine(sqlalchemy_url(outbox_database_url))
    yield engine
    await engine.dispose()


# -- psycopg ---------------------------------------------------------------------------------


def test_inside_the_callers_transaction_it_reads_what_the_block_wrote_and_commits_nothing(
    outbox_database_url: str,
) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        broker.send(conn, "before", {"n": 0})  # before the block: not the block's
        with sent(conn) as messages:
            shipped_id = broker.send(conn, SHIPPED, Shipped(7, "ups"), headers={"x-a": "1"})
            broker.send(conn, "audit", {"n": 1}, key=b"\x00k")
            broker.send(conn, "files", b"\x89PNG")
            broker.send(conn, "notes", "héllo")
        assert conn.info.transaction_status == TransactionStatus.INTRANS  # still open
        assert _queued(outbox_database_url) == 0  # nothing committed
        conn.rollback()

    assert [m.topic for m in messages] == ["orders.shipped", "audit", "files", "notes"]
    first = messages[0]
    assert first.message_id == shipped_id
    assert first.key == b"7"
    assert first.headers["x-a"] == "1"
    assert first.content_type == JSON
    assert first.payload == {"order_id": 7, "carrier": "ups"}  # no Topic given: the JSON value
    assert first.correlation_id == shipped_id and first.causation_id is None
    assert messages[1].key == b"\x00k" and messages[1].payload == {"n": 1}
    assert messages[2].payload == b"\x89PNG" and messages[2].raw_payload == b"\x89PNG"
    assert messages[3].payload == "héllo" and messages[3].content_type == TEXT
    assert len(messages) == 4 and messages[-1] is not None


def test_given_the_topic_payloads_come_back_typed(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        with sent(conn, SHIPPED) as shipped:
            broker.send(conn, SHIPPED, Shipped(1, "dhl"))
            broker.send(conn, "audit", {"n": 1})
            broker.send_many(conn, [Message(SHIPPED, Shipped(2, "ups")), Message("x", 1)])
    assert shipped.payloads == [Shipped(1, "dhl"), Shipped(2, "ups")]
    assert [m.key for m in shipped] == [b"1", b"2"]


def test_topics_by_name_and_by_list(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        with sent(conn, "audit") as by_name, sent(conn, [SHIPPED, "audit"]) as by_list:
            broker.send(conn, SHIPPED, Shipped(1, "dhl"))
            broker.send(conn, "audit", {"n": 1})
            broker.send(conn, "other", {"n": 2})
        conn.rollback()
    assert by_name.one().payload == {"n": 1}
    assert [m.payload for m in by_list] == [Shipped(1, "dhl"), {"n": 1}]


def test_on_an_idle_connection_it_leaves_no_transaction_of_its_own(
    outbox_database_url: str,
) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        with sent(conn, SHIPPED) as messages:
            assert conn.info.transaction_status == TransactionStatus.IDLE
            with conn.transaction():
                broker.send(conn, SHIPPED, Shipped(3, "ups"))
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert messages.one().payload == Shipped(3, "ups")
    assert _queued(outbox_database_url) == 1  # the block's own commit


def test_an_autocommit_connection(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        with sent(conn) as messages:
            with conn.transaction():
                broker.send(conn, "audit", {"n": 1})
    assert messages.one().topic == "audit"


def test_a_url_reads_what_the_block_committed(outbox_database_url: str) -> None:
    with sent(outbox_database_url, SHIPPED) as messages:
        with psycopg.connect(outbox_database_url) as conn:
            broker.send(conn, SHIPPED, Shipped(1, "dhl"))  # committed at the end of `with`
            with psycopg.connect(outbox_database_url) as other:
                broker.send(other, SHIPPED, Shipped(2, "ups"))
                other.rollback()  # never sent
    assert messages.payloads == [Shipped(1, "dhl")]
    with sent(sqlalchemy_url(outbox_database_url)) as none:
        pass
    assert list(none) == []


# -- SQLAlchemy ------------------------------------------------------------------------------


def test_a_session_in_its_transaction(engine: Engine) -> None:
    with Session(engine) as session:
        with sent(session, orders_created()) as messages:
            order_id, message_id = place_order(session, "ada", Decimal("12.99"))
        assert session.in_transaction()
        session.rollback()
    message = messages.one()
    assert message.payload == OrderCreated(order_id, "ada", Decimal("12.99"))
    assert (message.message_id, message.key) == (message_id, f"order-{order_id}".encode())


def test_a_session_after_its_commit_keeps_its_objects(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session:
        with sent(session, orders_created()) as messages:
            order = Order(customer="ada", total=Decimal("1.00"))
            session.add(order)
            session.flush()
            broker.send(session, orders_created(), OrderCreated(order.id, "ada", order.total))
            session.commit()
        # Read through a connection of its own: no transaction begun in the session, and its
        # objects not expired (an async session would fail to load them again lazily).
        assert not session.in_transaction()
        assert inspect(order).expired_attributes == set()
    assert messages.one().payload.order_id == order.id


def test_a_sqlalchemy_connection(engine: Engine) -> None:
    with engine.connect() as conn:
        with sent(conn) as inside:
            broker.send(conn, "audit", {"n": 1})
        assert conn.in_transaction()
        conn.rollback()
        with sent(conn) as outside:  # not in a transaction: its read is rolled back
            pass
        assert not conn.in_transaction()
    assert inside.one().payload == {"n": 1}
    assert list(outside) == []


async def test_a_psycopg_async_connection(outbox_database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(outbox_database_url) as conn:
        async with sent(conn, SHIPPED) as messages:
            await broker.send_async(conn, SHIPPED, Shipped(5, "ups"))
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        await conn.rollback()
    assert messages.one().payload == Shipped(5, "ups")


async def test_an_async_session_in_and_out_of_its_transaction(
    async_engine: AsyncEngine,
) -> None:
    async with AsyncSession(async_engine, expire_on_commit=False) as session:
        async with sent(session, SHIPPED) as inside:
            async with session.begin():
                await session.execute(text("SELECT 1"))
                await broker.send_async(session, SHIPPED, Shipped(6, "dhl"))
                async with sent(session, SHIPPED) as nested:  # read in the open transaction
                    await broker.send_async(session, SHIPPED, Shipped(7, "dhl"))
        assert not session.in_transaction()
    async with async_engine.connect() as conn:
        async with sent(conn) as on_connection:
            await broker.send_async(conn, "audit", {"n": 1})
        await conn.rollback()
    async with sent(sqlalchemy_url(async_engine.url.render_as_string(False))) as by_url:
        pass
    assert inside.payloads == [Shipped(6, "dhl"), Shipped(7, "dhl")]
    assert nested.payloads == [Shipped(7, "dhl")]
    assert on_connection.one().payload == {"n": 1}
    assert list(by_url) == []


async def test_a_sync_with_on_an_async_handle_is_refused(async_engine: AsyncEngine) -> None:
    async with AsyncSession(async_engine) as session:
        with pytest.raises(UnsupportedTransaction, match="async with sent"):
            with sent(session):
                pass


# -- a per-test topic ------------------------------------------------------------------------


def test_a_renamed_topic_is_read_under_its_per_test_name(outbox_database_url: str) -> None:
    with topic_renamed(SHIPPED) as name, psycopg.connect(outbox_database_url) as conn:
        with sent(conn, SHIPPED) as messages:
            broker.send(conn, SHIPPED, Shipped(1, "dhl"))
            broker.send(conn, "orders.shipped", {"order_id": 2, "carrier": "x"})  # not it
        conn.rollback()
    assert [(m.topic, m.payload) for m in messages] == [(name, Shipped(1, "dhl"))]


# -- what the receiver could not read --------------------------------------------------------


class _Garbage:
    """A serializer that says JSON and writes bytes that are not."""

    content_type = JSON

    def dumps(self, payload: Any) -> bytes:
        return b"\xff\xfe{not json"

    def loads(self, data: bytes) -> Any:
        raise AssertionError("not used")


class _BadText:
    content_type = TEXT

    def dumps(self, payload: Any) -> bytes:
        return b"caf\xe9"  # Latin-1, not UTF-8

    def loads(self, data: bytes) -> Any:
        raise AssertionError("not used")


def test_bad_bytes_are_reported_on_the_message_that_has_them(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        with sent(conn, [SHIPPED, "garbage", "latin"]) as messages:
            good = broker.send(conn, SHIPPED, Shipped(1, "dhl"))
            raw = broker.send(conn, "orders.shipped", b"\x00\xff\xfe")  # bytes on a typed topic
            wrong = broker.send(conn, "orders.shipped", {"order_id": "seven"})
            garbage = Broker(serializer=_Garbage()).send(conn, "garbage", {"n": 1})
            latin = Broker(serializer=_BadText()).send(conn, "latin", 1)
        conn.rollback()

    by_id = {m.message_id: m for m in messages}
    assert by_id[good].payload == Shipped(1, "dhl")
    cases = {
        raw: ["application/octet-stream", "not a valid Shipped", "b'\\x00\\xff\\xfe'"],
        wrong: ["not a valid Shipped", "order_id", "seven"],
        garbage: ["cannot decode the payload as 'application/json'", "not valid JSON"],
        latin: ["cannot decode the payload as 'text/plain", "utf-8"],
    }
    for message_id, fragments in cases.items():
        message = by_id[message_id]
        with pytest.raises(PayloadUndecodable) as error:
            _ = message.payload
        said = str(error.value)
        assert str(message_id) in said, said
        for fragment in fragments:
            assert fragment in said, (fragment, said)
        assert isinstance(error.value, AssertionError)
        assert message.raw_payload  # the bytes stay readable
        assert "undecodable" in repr(message)
    with pytest.raises(PayloadUndecodable):
        _ = messages.payloads


def test_a_long_undecodable_payload_is_shown_cut(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        with sent(conn, SHIPPED) as messages:
            broker.send(conn, "orders.shipped", b"\xff" * 100_000)
        conn.rollback()
    with pytest.raises(PayloadUndecodable) as error:
        _ = messages.one().payload
    assert len(str(error.value)) < 2_000 and "100000 bytes" in str(error.value)


# -- misuse ----------------------------------------------------------------------------------


def test_a_block_that_raises_is_not_read(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        recorder = sent(conn)
        with pytest.raises(psycopg.errors.UndefinedTable):
            with recorder:
                broker.send(conn, "audit", {"n": 1})
                conn.execute("SELECT * FROM no_such_table")
        conn.rollback()
    with pytest.raises(OutboxError, match="after the `with` block"):
        _ = recorder.messages


def test_inside_the_block_and_outside_any_block_it_says_how_to_use_it(
    outbox_database_url: str,
) -> None:
    with pytest.raises(OutboxError, match="as a context manager"):
        _ = sent(outbox_database_url).messages
    with sent(outbox_database_url) as messages:
        with pytest.raises(OutboxError, match="after the `with` block"):
            len(messages)
        assert repr(messages) == "<Sent: the block has not ended>"


def test_one_says_what_was_sent_when_it_is_not_one(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as conn:
        with sent(conn) as two:
            broker.send(conn, "a", {"n": 1})
            broker.send(conn, "b", {"n": 2})
        with sent(conn) as none:
            pass
        conn.rollback()
    with pytest.raises(AssertionError, match="expected one message sent, got 2") as error:
        two.one()
    assert "topic='a'" in str(error.value) and "topic='b'" in str(error.value)
    with pytest.raises(AssertionError, match="got 0"):
        none.one()


def test_what_it_cannot_read_through_is_named(outbox_database_url: str) -> None:
    with pytest.raises(UnsupportedTransaction, match=r"cannot read through a builtins\.object"):
        with sent(object()):
            pass
    with pytest.raises(TypeError, match="takes a Topic, a topic name or a list"):
        sent(outbox_database_url, [1])  # type: ignore[list-item]
    with pytest.raises(OutboxError, match="contains ' '"):
        sent(outbox_database_url, "not a topic")
    with pytest.raises(OutboxError, match="schema"):
        sent(outbox_database_url, schema="Bad-Schema")


def test_another_schema(outbox_database_factory: Any) -> None:
    from outbox.postgres.migrate import upgrade

    url = outbox_database_factory(migrated=False)
    upgrade(url, schema="billing")
    billing = Broker(schema="billing")
    with psycopg.connect(url) as conn:
        with sent(conn, schema="billing") as messages:
            billing.send(conn, "invoices", {"id": str(uuid.UUID(int=1))})
        conn.rollback()
    assert messages.one().topic == "invoices"


# -- a per-test topic through the daemons ------------------------------------------------------


def test_a_renamed_topic_is_sent_relayed_and_handled_under_its_per_test_name(
    engine: Engine,
    outbox_rename_topic: Any,
    outbox_drain: Any,
    outbox_memory_transport: Any,
) -> None:
    from examples.shipping_service import create_schema as create_shipping_schema
    from examples.shipping_service.handlers import handlers
    from examples.shipping_service.models import Shipment

    create_shipping_schema(engine.url.render_as_string(hide_password=False))
    name = outbox_rename_topic(orders_created())
    with Session(engine) as session:
        with sent(session, orders_created()) as messages:
            order_id, _ = place_order(session, "ada", Decimal("3.00"))
        session.commit()
        assert messages.one().topic == name

        result = outbox_drain(handlers)  # the relay, the consumer and the handler, in threads

        assert (result.relayed, result.handled, result.unhandled_topics) == (1, 1, ())
        assert outbox_memory_transport.topics == [name]
        assert session.scalars(select(Shipment.order_id)).all() == [order_id]
    assert orders_created().name == name  # until the test ends (test_topic_renamed.py)
