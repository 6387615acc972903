"""Typed messages end to end: a Topic's payload sent as a dataclass or pydantic model is the same
object in the handler, through the in-memory transport and the log; what cannot be encoded is
refused before anything is written; what does not validate is dead at once with its error."""

from __future__ import annotations

import enum
import json
import math
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pydantic
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outbox import Broker, Handlers, InboxMessage, Message, SerializationError, Topic
from outbox.postgres.migrate import sqlalchemy_url
from outbox.testing.memory import InMemoryTransport
from outbox.testing.plugin import Drain
from tests.typed_support import payloads

from .relay_helpers import count

broker = Broker()


class Status(enum.Enum):
    NEW = "new"
    PAID = "paid"


@dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal
    quantity: int = 1


@dataclass(frozen=True)
class OrderPlaced:
    """Every type the encoding handles, as a dataclass."""

    order_id: UUID
    placed_at: datetime
    ship_on: date
    cutoff: time
    total: Decimal
    status: Status
    lines: list[Line]
    signature: bytes
    tags: tuple[str, ...] = ()
    note: str | None = None
    attributes: dict[str, int] = field(default_factory=dict)


class LineModel(pydantic.BaseModel):
    sku: str
    price: Decimal


class OrderModel(pydantic.BaseModel):
    """The same as a pydantic model."""

    order_id: UUID
    placed_at: datetime
    ship_on: date
    cutoff: time
    total: Decimal
    status: Status
    lines: list[LineModel]
    note: str | None = None


placed = Topic("orders.placed", OrderPlaced, key="order_id")
modelled = Topic("orders.modelled", OrderModel, key=lambda o: str(o.order_id))

WHEN = datetime(2026, 11, 27, 6, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))


def an_order(n: int = 1) -> OrderPlaced:
    return OrderPlaced(
        order_id=uuid4(),
        placed_at=WHEN,
        ship_on=date(2026, 12, 1),
        cutoff=time(17, 30),
        total=Decimal("1234567890.123456789"),  # more digits than a float keeps
        status=Status.PAID,
        lines=[Line("a", Decimal("0.10")), Line("b", Decimal("99.99"), n)],
        signature=b"\x00\xff\xfe",
        tags=("gift", "fragile"),
        attributes={"weight": 3},
    )


def a_model() -> OrderModel:
    return OrderModel(
        order_id=uuid4(),
        placed_at=WHEN,
        ship_on=date(2026, 12, 1),
        cutoff=time(17, 30),
        total=Decimal("0.1000000000000000055511151231257827"),
        status=Status.NEW,
        lines=[LineModel(sku="a", price=Decimal("1.10"))],
    )


class Received:
    """What the handlers were called with (they run in the drain's threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[InboxMessage[Any]] = []

    def add(self, message: InboxMessage[Any]) -> None:
        with self.lock:
            self.messages.append(message)

    @property
    def payloads(self) -> list[Any]:
        return [m.payload for m in self.messages]


def typed_handlers(received: Received) -> Handlers:
    handlers = Handlers()

    @handlers.handler(placed)
    def on_placed(message: InboxMessage[OrderPlaced], conn: Any) -> None:
        received.add(message)

    @handlers.handler(modelled)
    def on_modelled(message: InboxMessage[OrderModel], conn: Any) -> None:
        received.add(message)

    return handlers


def send(url: str, topic: str | Topic[Any], *payloads: Any, **options: Any) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        for payload in payloads:
            broker.send(conn, topic, payload, **options)


def consumer_rows(url: str) -> list[tuple[str, int, bool, str | None]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT topic, attempts, dead_at IS NOT NULL, last_error FROM outbox.consumer_queue "
            "ORDER BY id"
        ).fetchall()


@pytest.mark.parametrize("transport", ["memory", "log"])
def test_every_encodable_type_round_trips_to_the_handler(
    outbox_database_url: str, outbox_drain: Drain, outbox_log_url: str, transport: str
) -> None:
    received = Received()
    order, model = an_order(), a_model()
    send(outbox_database_url, placed, order)
    send(outbox_database_url, modelled, model)
    options = {"transport": outbox_log_url} if transport == "log" else {}
    result = outbox_drain(typed_handlers(received), **options)
    assert result.dead == (), "\n".join(map(str, result.dead))
    assert sorted(received.payloads, key=lambda p: type(p).__name__) == [model, order]
    by_topic = {m.topic: m for m in received.messages}
    assert isinstance(by_topic["orders.placed"].payload, OrderPlaced)
    assert by_topic["orders.placed"].payload.total == Decimal("1234567890.123456789")
    assert by_topic["orders.placed"].payload.placed_at.utcoffset() == timedelta(hours=2)
    # The key comes from the declaration: the attribute, or the function.
    assert by_topic["orders.placed"].key == str(order.order_id).encode()
    assert by_topic["orders.modelled"].key == str(model.order_id).encode()


def test_the_wire_form_is_documented_json(outbox_database_url: str) -> None:
    """Decimal as a string, bytes as base64, datetime in ISO 8601 with its offset, Enum by value:
    what a consumer in another language reads."""
    order = an_order()
    send(outbox_database_url, placed, order)
    with psycopg.connect(outbox_database_url) as conn:
        row = conn.execute(
            "SELECT convert_from(payload, 'UTF8')::jsonb, content_type FROM outbox.producer_queue"
        ).fetchone()
    assert row is not None
    body, content_type = row
    assert content_type == "application/json"
    assert body["total"] == "1234567890.123456789"
    assert body["signature"] == "AP/+"
    assert body["placed_at"] == "2026-11-27T06:30:15.123456+02:00"
    assert body["ship_on"] == "2026-12-01" and body["cutoff"] == "17:30:00"
    assert body["status"] == "paid" and body["order_id"] == str(order.order_id)
    assert body["lines"][1] == {"sku": "b", "price": "99.99", "quantity": 1}


def test_send_many_sqlalchemy_and_plain_topics_share_the_encoding(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    received = Received()
    handlers = typed_handlers(received)

    @handlers.handler("orders.plain")
    def on_plain(message: InboxMessage[Any], conn: Any) -> None:
        received.add(message)

    orders = [an_order(n) for n in range(3)]
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        broker.send_many(conn, [Message(placed, o) for o in orders[:2]])
    engine = create_engine(sqlalchemy_url(outbox_database_url))
    try:
        with Session(engine) as session, session.begin():
            broker.send(session, placed, orders[2], key="given")
            # A string topic takes a model too; its handler reads the JSON, as today.
            broker.send(session, "orders.plain", orders[2])
    finally:
        engine.dispose()
    result = outbox_drain(handlers)
    assert result.dead == ()
    typed = [m for m in received.messages if m.topic == "orders.placed"]
    assert sorted(m.payload.lines[1].quantity for m in typed) == [0, 1, 2]
    assert {m.key for m in typed} == {str(o.order_id).encode() for o in orders[:2]} | {b"given"}
    (plain,) = [m.payload for m in received.messages if m.topic == "orders.plain"]
    assert plain["order_id"] == str(orders[2].order_id) and plain["total"] == "1234567890.123456789"


@pytest.mark.parametrize(
    ("topic", "payload", "fragment"),
    [
        (placed, {"order_id": "x"}, "topic 'orders.placed' carries OrderPlaced; got a dict"),
        (placed, a_model(), "carries OrderPlaced; got a OrderModel"),
        (
            "orders.plain",
            {"items": [1, 2, {"price": object()}]},
            "payload.items[2].price: object of type object is not JSON-encodable",
        ),
        ("orders.plain", {"at": datetime(2026, 1, 1)}, "payload.at: a naive datetime"),
        ("orders.plain", {"tags": {"a", "b"}}, "payload.tags: a set is refused in JSON"),
        ("orders.plain", {"n": {float("nan"): 1}}, "payload.n: key nan is not a JSON number"),
        (
            placed,
            OrderPlaced(**{**an_order().__dict__, "placed_at": datetime(2026, 1, 1)}),
            "payload.placed_at: a naive datetime",
        ),
    ],
)
def test_what_cannot_be_sent_is_refused_before_anything_is_written(
    outbox_database_url: str, topic: str | Topic[Any], payload: Any, fragment: str
) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        with pytest.raises(SerializationError) as info:
            broker.send(conn, topic, payload)
        assert fragment in str(info.value)
        # The transaction is not aborted: the caller can go on.
        broker.send(conn, "orders.plain", {"ok": True})
    assert count(outbox_database_url) == 1


@pytest.mark.parametrize("topic", [placed, modelled])
def test_a_payload_that_does_not_validate_is_dead_at_once_with_its_error(
    outbox_database_url: str, outbox_drain: Drain, topic: Topic[Any]
) -> None:
    """A producer that does not use the declaration sends a payload without `order_id` and
    with a bad `total`: dead after one attempt (not retried), the error names the fields."""
    received = Received()
    bad = {"placed_at": WHEN.isoformat(), "total": "lots", "lines": []}
    send(outbox_database_url, topic.name, bad)
    result = outbox_drain(typed_handlers(received), wait_for_retries=True)
    assert received.messages == []
    assert [d.topic for d in result.dead] == [topic.name]
    # The summary (drain's, `outbox dead-letters list`'s) names the topic and the type.
    assert f"the payload of topic {topic.name!r} is not a valid {topic.payload.__name__}: " in (
        result.dead[0].error
    )
    ((name, attempts, dead, error),) = consumer_rows(outbox_database_url)
    assert (name, attempts, dead) == (topic.name, 1, True)
    assert error is not None
    if topic is placed:
        assert "is not a valid OrderPlaced: payload.order_id: OrderPlaced field is missing" in error
        assert "payload.total: expected a Decimal as a string, got str 'lots'" not in error
        assert "payload.total: expected Decimal, got str 'lots'" in error
    else:  # pydantic's own text
        assert "is not a valid OrderModel: 5 validation errors for OrderModel\n" in error
        assert "order_id\n  Field required" in error
        assert "total\n  Input should be a valid decimal" in error


def test_batch_handlers_and_annotated_handlers_get_typed_payloads(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    received = Received()
    handlers = Handlers()

    @handlers.batch_handler("orders.batched")
    def on_batch(messages: list[InboxMessage[OrderPlaced]], conn: Any) -> None:
        for message in messages:
            received.add(message)

    @handlers.handler("orders.annotated")
    def on_annotated(message: InboxMessage[OrderModel], conn: Any) -> None:
        received.add(message)

    orders, model = [an_order(n) for n in range(3)], a_model()
    send(outbox_database_url, "orders.batched", *orders)
    send(outbox_database_url, "orders.annotated", model)
    result = outbox_drain(handlers)
    assert result.dead == ()
    batched = [m.payload for m in received.messages if m.topic == "orders.batched"]
    assert sorted(batched, key=lambda o: o.lines[1].quantity) == orders
    assert [m.payload for m in received.messages if m.topic == "orders.annotated"] == [model]


# -- compatibility: producers and consumers upgraded at different times ----------------------


@dataclass
class ShippedV1:
    order_id: UUID
    carrier: str


@dataclass
class ShippedV2:
    order_id: UUID
    carrier: str
    tracking: str | None = None  # added, optional


class ShippedModelV1(pydantic.BaseModel):
    order_id: UUID
    carrier: str


class ShippedModelV2(pydantic.BaseModel):
    order_id: UUID
    carrier: str
    tracking: str | None = None


@pytest.mark.parametrize(("old", "new"), [(ShippedV1, ShippedV2), (ShippedModelV1, ShippedModelV2)])
def test_an_older_and_a_newer_producer_are_read_by_the_other_version(
    outbox_database_url: str, outbox_drain: Drain, old: Any, new: Any
) -> None:
    received = Received()
    handlers = Handlers()

    @handlers.handler(Topic("shipped.by.old", new))  # a newer consumer, an older producer
    def newer(message: InboxMessage[Any], conn: Any) -> None:
        received.add(message)

    @handlers.handler(Topic("shipped.by.new", old))  # an older consumer, a newer producer
    def older(message: InboxMessage[Any], conn: Any) -> None:
        received.add(message)

    order_id = uuid4()
    send(outbox_database_url, Topic("shipped.by.old", old), old(order_id=order_id, carrier="x"))
    send(
        outbox_database_url,
        Topic("shipped.by.new", new),
        new(order_id=order_id, carrier="y", tracking="T-1"),
    )
    result = outbox_drain(handlers)
    assert result.dead == (), "\n".join(map(str, result.dead))
    by_topic = {m.topic: m.payload for m in received.messages}
    assert by_topic["shipped.by.old"] == new(order_id=order_id, carrier="x", tracking=None)
    assert by_topic["shipped.by.new"] == old(order_id=order_id, carrier="y")


def test_a_timezone_of_utc_survives_too(outbox_database_url: str, outbox_drain: Drain) -> None:
    received = Received()
    order = OrderPlaced(**{**an_order().__dict__, "placed_at": datetime.now(UTC)})
    send(outbox_database_url, placed, order)
    outbox_drain(typed_handlers(received))
    assert received.payloads == [order]


def test_an_invalid_payload_in_a_batch_is_dead_alone(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    received = Received()
    handlers = Handlers()

    @handlers.batch_handler(Topic("points", Line), max_attempts=5)
    def on_batch(messages: list[InboxMessage[Line]], conn: Any) -> None:
        for message in messages:
            received.add(message)

    good = [Line("a", Decimal("1")), Line("b", Decimal("2"))]
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        broker.send(conn, "points", good[0], key="k")
        broker.send(conn, "points", {"sku": "bad", "price": [1]}, key="k2")
        broker.send(conn, "points", good[1], key="k")
    result = outbox_drain(handlers, wait_for_retries=True)
    assert sorted(received.payloads, key=lambda line: line.sku) == good
    assert len(result.dead) == 1
    dead = [row for row in consumer_rows(outbox_database_url) if row[2]]
    assert [
        (attempts, "payload.price: expected a Decimal as a string, got list [1]" in (error or ""))
        for _, attempts, _, error in dead
    ] == [(1, True)]


async def test_send_async_and_async_handlers_are_typed_too(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    received = Received()
    handlers = Handlers()

    @handlers.handler(placed)
    async def on_placed(message: InboxMessage[OrderPlaced], conn: Any) -> None:
        received.add(message)

    orders = [an_order(n) for n in range(2)]
    async with await psycopg.AsyncConnection.connect(outbox_database_url) as conn:
        async with conn.transaction():
            await broker.send_async(conn, placed, orders[0])
            await broker.send_many_async(conn, [Message(placed, orders[1])])
    result = outbox_drain(handlers)
    assert result.dead == ()
    assert sorted(received.payloads, key=lambda o: o.lines[1].quantity) == orders


# -- mapping keys: JSON object keys are text, read back as their declared type --------------


@dataclass(frozen=True)
class Counted:
    counts: dict[int, str]
    ratios: dict[float, int] = field(default_factory=dict)
    flags: dict[bool, list[dict[UUID, Status]]] = field(default_factory=dict)
    days: dict[date, Decimal] | None = None


class CountedModel(pydantic.BaseModel):
    counts: dict[int, str]
    flags: dict[bool, list[dict[UUID, Status]]] = {}


counted = Topic("counted", Counted)
counted_model = Topic("counted.model", CountedModel)


def a_counted() -> Counted:
    return Counted(
        counts={1: "one", -2: "minus two", 10**30: "big"},
        ratios={0.1: 1, -0.0: 2, 1e16: 3},
        flags={True: [{uuid4(): Status.PAID}], False: []},
        days={date(2026, 12, 1): Decimal("1.10")},
    )


def counted_handlers(received: Received) -> Handlers:
    handlers = Handlers()

    @handlers.handler(counted)
    def on_counted(message: InboxMessage[Counted], conn: Any) -> None:
        received.add(message)

    @handlers.handler(counted_model)
    def on_model(message: InboxMessage[CountedModel], conn: Any) -> None:
        received.add(message)

    return handlers


@pytest.mark.parametrize("transport", ["memory", "log"])
def test_mapping_keys_reach_the_handler_as_their_declared_type(
    outbox_database_url: str, outbox_drain: Drain, outbox_log_url: str, transport: str
) -> None:
    """A dict[int, str] was sent with keys "1", "-2"... and every such message was dead on
    arrival (`payload.counts: expected an integer, got str '1'`)."""
    received = Received()
    sent = a_counted()
    model = CountedModel(counts={7: "seven"}, flags={False: [{uuid4(): Status.NEW}]})
    send(outbox_database_url, counted, sent)
    send(outbox_database_url, counted_model, model)
    options = {"transport": outbox_log_url} if transport == "log" else {}
    result = outbox_drain(counted_handlers(received), **options)
    assert result.dead == (), "\n".join(map(str, result.dead))
    by_topic = {m.topic: m.payload for m in received.messages}
    assert by_topic == {"counted": sent, "counted.model": model}
    got = by_topic["counted"]
    assert [type(k) for k in got.counts] == [int, int, int]
    assert math.copysign(1.0, list(got.ratios)[1]) == -1.0
    (wire,) = [json.loads(m.raw_payload) for m in received.messages if m.topic == "counted"]
    assert wire["counts"] == {"1": "one", "-2": "minus two", str(10**30): "big"}
    assert wire["ratios"] == {"0.1": 1, "-0.0": 2, "1e+16": 3}
    assert wire["days"] == {"2026-12-01": "1.10"}


def test_a_message_stored_before_keys_were_read_as_their_type_is_handled(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    """A message written (or dead-lettered, then requeued) before: its keys are the text
    json.dumps wrote for int, float and bool keys, the very text send writes now."""
    received = Received()
    old = {"counts": {"1": "one"}, "ratios": {"2.5": 1}, "flags": {"false": []}}
    send(outbox_database_url, "counted", old)
    result = outbox_drain(counted_handlers(received))
    assert result.dead == (), "\n".join(map(str, result.dead))
    assert received.payloads == [Counted(counts={1: "one"}, ratios={2.5: 1}, flags={False: []})]


@pytest.mark.parametrize(
    ("topic", "payload", "fragment"),
    [
        (counted, Counted(counts={True: "yes"}), "payload.counts: key True (bool) would be"),
        (counted, Counted(counts={}, ratios={math.inf: 1}), "payload.ratios: key inf is not"),
        (
            counted,
            Counted(counts={}, flags={True: [{uuid4(): Status.NEW}, {"x": Status.NEW}]}),
            "payload.flags.true[1]: key 'x' (str) would be written 'x', which the declared key",
        ),
        (counted, Counted(counts={}, days={datetime(2026, 1, 1): 1}), "payload.days: key"),
        (
            counted_model,
            CountedModel(counts={1: "a"}, flags={True: [{"0" * 32: Status.NEW}]}),
            "",  # pydantic made a UUID of it: sent, and read back the same
        ),
    ],
)
def test_a_key_that_would_not_read_back_is_refused_before_anything_is_written(
    outbox_database_url: str, outbox_drain: Drain, topic: Topic[Any], payload: Any, fragment: str
) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        if fragment:
            with pytest.raises(SerializationError) as info:
                broker.send(conn, topic, payload)
            assert fragment in str(info.value)
            assert str(info.value).startswith(f"payload for topic {topic.name!r}: payload")
        else:
            broker.send(conn, topic, payload)
        broker.send(conn, "orders.plain", {"ok": True})  # the transaction goes on
    assert count(outbox_database_url) == (1 if fragment else 2)


# -- values read back as they were sent (issue 31): models with aliases, strict models, ------
# -- unions, Enums and mappings of dataclasses --------------------------------------------------


class Pair(enum.Enum):
    ORIGIN = (0, 0)
    UNIT = (1, 1)


class AliasedOrder(pydantic.BaseModel):
    order_id: UUID = pydantic.Field(alias="orderId")
    placed_at: datetime = pydantic.Field(alias="placedAt")
    lines: list[LineModel] = []


class StrictOrder(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)
    order_id: UUID
    placed_at: datetime
    total: Decimal
    status: Status


@dataclass(frozen=True)
class Mixed:
    id_or_name: UUID | str
    pair: Pair
    ordered: OrderedDict[int, Decimal]
    tags: frozenset[str]
    model: StrictOrder | None = None


aliased = Topic("orders.aliased", AliasedOrder)
strict = Topic("orders.strict", StrictOrder)
mixed = Topic("mixed", Mixed)


def faithful_handlers(received: Received) -> Handlers:
    handlers = Handlers()
    for topic in (aliased, strict, mixed):
        handlers.handler(topic)(lambda message, conn: received.add(message))
    return handlers


@pytest.mark.parametrize("transport", ["memory", "log"])
def test_aliased_and_strict_models_and_mixed_values_reach_the_handler_unchanged(
    outbox_database_url: str, outbox_drain: Drain, outbox_log_url: str, transport: str
) -> None:
    """A model with field aliases (written by name, read by alias) and a strict model (whose
    Python-mode validation refuses a UUID's text) were dead on arrival; a tuple-valued Enum and
    an OrderedDict were refused by the handler."""
    received = Received()
    strict_order = StrictOrder(
        order_id=uuid4(), placed_at=WHEN, total=Decimal("1.10"), status=Status.PAID
    )
    sent = {
        "orders.aliased": AliasedOrder(
            orderId=uuid4(), placedAt=WHEN, lines=[LineModel(sku="\x00", price=Decimal(1))]
        ),
        "orders.strict": strict_order,
        "mixed": Mixed(
            id_or_name=uuid4(),
            pair=Pair.UNIT,
            ordered=OrderedDict([(2, Decimal("2.50")), (1, Decimal("1"))]),
            tags=frozenset({"b", "a"}),
            model=strict_order,
        ),
    }
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        for topic in (aliased, strict, mixed):
            broker.send(conn, topic, sent[topic.name])
    options = {"transport": outbox_log_url} if transport == "log" else {}
    result = outbox_drain(faithful_handlers(received), **options)
    assert result.dead == (), "\n".join(map(str, result.dead))
    assert {m.topic: m.payload for m in received.messages} == sent
    wire = {m.topic: json.loads(m.raw_payload) for m in received.messages}
    assert set(wire["orders.aliased"]) == {"orderId", "placedAt", "lines"}
    assert wire["mixed"]["pair"] == [1, 1] and wire["mixed"]["tags"] == ["a", "b"]
    got = {m.topic: m.payload for m in received.messages}["mixed"]
    assert type(got.id_or_name) is UUID and got.pair is Pair.UNIT
    assert type(got.ordered) is OrderedDict and list(got.ordered) == [2, 1]


def test_a_model_message_stored_by_field_name_is_handled(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    """Written by field name before models were written by alias (or requeued from the dead
    letters): read by name too."""
    received = Received()
    order_id = uuid4()
    old = {"order_id": str(order_id), "placed_at": WHEN.isoformat(), "lines": []}
    send(outbox_database_url, "orders.aliased", old)
    result = outbox_drain(faithful_handlers(received))
    assert result.dead == (), "\n".join(map(str, result.dead))
    assert received.payloads == [AliasedOrder(orderId=order_id, placedAt=WHEN)]


@pytest.mark.parametrize(
    ("topic", "payload", "fragment"),
    [
        (
            mixed,
            Mixed(id_or_name=str(uuid4()), pair=Pair.UNIT, ordered=OrderedDict(), tags=frozenset()),
            "payload.id_or_name: '",
        ),
        (
            mixed,
            Mixed(id_or_name="x", pair=(1, 1), ordered=OrderedDict(), tags=frozenset()),
            "payload.pair: (1, 1) (tuple) would be written [1,1] and read back as <Pair.UNIT",
        ),
        (
            strict,
            StrictOrder(
                order_id=uuid4(),
                placed_at=datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=30))),
                total=Decimal(1),
                status=Status.NEW,
            ),
            "payload.placed_at: the offset +00:00:30 of 2026-01-01T00:00:00+00:00:30 has seconds",
        ),
    ],
)
def test_a_value_the_handler_would_not_read_back_is_refused_before_anything_is_written(
    outbox_database_url: str, topic: Topic[Any], payload: Any, fragment: str
) -> None:
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        with pytest.raises(SerializationError) as info:
            broker.send(conn, topic, payload)
        assert str(info.value).startswith(f"payload for topic {topic.name!r}: {fragment}")
        broker.send(conn, "orders.plain", {"ok": True})  # the transaction goes on
    assert count(outbox_database_url) == 1


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no "explain": slow
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one database for the test, emptied per example
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    batch=st.lists(
        payloads(hostile=True) | payloads(hostile=True, models=True), min_size=1, max_size=3
    )
)
def test_generated_payloads_are_refused_at_send_or_handled_unchanged(
    outbox_database_url: str, outbox_drain: Drain, batch: list[tuple[type[Any], Any]]
) -> None:
    """Generated dataclasses and models (tests/typed_support.py), sent in one transaction:
    each is refused by send, writing nothing, or handled as an equal value."""
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM outbox.producer_queue")
        conn.execute("DELETE FROM outbox.consumer_queue")
    received = Received()
    handlers = Handlers()
    expected: dict[str, Any] = {}
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        for payload_type, payload in batch:
            topic = Topic(f"generated.{uuid.uuid4().hex}", payload_type)
            handlers.handler(topic)(lambda message, conn: received.add(message))
            try:
                broker.send(conn, topic, payload)
            except SerializationError as exc:
                assert str(exc).startswith(f"payload for topic {topic.name!r}: payload"), exc
                event("refused at send")
                continue
            event("sent")
            expected[topic.name] = payload
    assert count(outbox_database_url) == len(expected)
    result = outbox_drain(handlers, transport=InMemoryTransport())
    assert result.dead == (), "\n".join(map(str, result.dead))
    assert {m.topic: m.payload for m in received.messages} == expected
