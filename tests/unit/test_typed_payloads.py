"""The typed-payload core without servers: the JSON encoding of models and the types users send,
its refusals, decoding into dataclasses and models, `Topic`, and payload types of handlers."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import pydantic
import pytest

from outbox import (
    Broker,
    ConfigurationError,
    Handlers,
    InboxMessage,
    InvalidKey,
    InvalidTopic,
    JsonSerializer,
    SerializationError,
    Topic,
)
from outbox.core.codecs import PayloadInvalid, decoder

if TYPE_CHECKING:
    import psycopg  # only for annotations: a handler's other annotations are not resolved

ROOT = Path(__file__).resolve().parents[2]
json_serializer = JsonSerializer()


class Colour(enum.Enum):
    RED = "red"
    BLUE = 2


@dataclass
class Point:
    x: int
    y: float = 0.0


@dataclass
class Shape:
    id: UUID
    at: datetime
    colour: Colour
    points: list[Point]
    price: Decimal
    day: date | None = None
    clock: time | None = None
    blob: bytes = b""
    labels: dict[str, Point] = field(default_factory=dict)
    pair: tuple[int, str] = (0, "")


class Model(pydantic.BaseModel):
    id: UUID
    price: Decimal
    colour: Colour


def encode(payload: Any) -> Any:
    return json.loads(json_serializer.dumps(payload))


def a_shape() -> Shape:
    return Shape(
        id=uuid4(),
        at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5))),
        colour=Colour.BLUE,
        points=[Point(1, 2.5), Point(3)],
        price=Decimal("10.000000000000000001"),
        day=date(2026, 1, 2),
        clock=time(3, 4, 5, 6),
        blob=b"\x00\x01",
        labels={"origin": Point(0)},
        pair=(7, "seven"),
    )


# -- encoding --------------------------------------------------------------------------------


def test_plain_json_encodes_exactly_as_before() -> None:
    payload = {"a": [1, 2.5, None, True, "é"], "b": {"c": (1, 2)}}
    assert (
        json_serializer.dumps(payload)
        == json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    )


def test_each_type_has_its_documented_form() -> None:
    shape = a_shape()
    assert encode(shape) == {
        "id": str(shape.id),
        "at": "2026-01-02T03:04:05-05:00",
        "colour": 2,
        "points": [{"x": 1, "y": 2.5}, {"x": 3, "y": 0.0}],
        "price": "10.000000000000000001",
        "day": "2026-01-02",
        "clock": "03:04:05.000006",
        "blob": "AAE=",
        "labels": {"origin": {"x": 0, "y": 0.0}},
        "pair": [7, "seven"],
    }
    model = Model(id=shape.id, price=Decimal("0.10"), colour=Colour.RED)
    assert encode(model) == {"id": str(shape.id), "price": "0.10", "colour": "red"}
    assert encode({"nested": [model]}) == {"nested": [encode(model)]}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"items": [1, 2, {"price": object()}]},
            "payload.items[2].price: object of type object is not JSON-encodable",
        ),
        ({"at": datetime(2026, 1, 1)}, "payload.at: a naive datetime (no time zone) is refused"),
        ([Point(1, float("nan"))], "payload[0].y: nan is not a JSON number"),
        ({"s": frozenset({1})}, "payload.s: a frozenset is refused in JSON"),
        ({uuid4().hex: {Colour.RED: 1}}, "key <Colour.RED: 'red'> of type Colour is refused"),
        ({"m": Model}, "payload.m: object of type ModelMetaclass is not JSON-encodable"),
    ],
)
def test_refusals_name_the_path_and_the_reason(payload: Any, message: str) -> None:
    with pytest.raises(SerializationError) as info:
        json_serializer.dumps(payload)
    assert message in str(info.value)


def test_a_circular_value_is_refused() -> None:
    loop: list[Any] = []
    loop.append({"again": loop})
    with pytest.raises(SerializationError, match=r"payload\[0\]\.again: circular reference"):
        json_serializer.dumps(loop)

    @dataclass
    class Node:
        next: Any = None

    node = Node()
    node.next = node
    with pytest.raises(SerializationError, match=r"payload\.next: circular reference"):
        json_serializer.dumps(node)


# -- decoding --------------------------------------------------------------------------------


def test_a_dataclass_round_trips_through_its_json() -> None:
    shape = a_shape()
    assert decoder(Shape)(encode(shape)) == shape
    assert decoder(Shape) is decoder(Shape)  # cached per type


def test_unknown_fields_are_ignored_and_missing_optional_fields_take_their_defaults() -> None:
    data = {**encode(a_shape()), "added_later": {"x": 1}}
    del data["day"], data["labels"]
    decoded = decoder(Shape)(data)
    assert decoded.day is None and decoded.labels == {}
    model = decoder(Model)({"id": str(uuid4()), "price": "1", "colour": 2, "extra": 1})
    assert model.colour is Colour.BLUE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": None}, "payload.id: Shape field is missing"),
        ({"at": "2026-01-02T03:04:05"}, "payload.at: expected a datetime with a time zone"),
        ({"colour": "green"}, "payload.colour: expected a Colour ('red', 2), got str 'green'"),
        ({"points": [{"x": 1}, {"y": 1}]}, "payload.points[1].x: Point field is missing"),
        ({"points": [{"x": "1"}]}, "payload.points[0].x: expected an integer, got str '1'"),
        ({"price": "ten"}, "payload.price: expected Decimal, got str 'ten'"),
        ({"blob": "not base64!"}, "payload.blob: expected a bytes"),
        ({"pair": [1]}, "payload.pair: expected an array of 2 items"),
        ({"labels": {"o": 3}}, "payload.labels.o: expected an object for Point, got int 3"),
        ({"day": "Tuesday"}, "payload.day: expected a date (Invalid isoformat string"),
    ],
)
def test_a_dataclass_that_does_not_validate_names_the_field(
    change: dict[str, Any], message: str
) -> None:
    data = encode(a_shape())
    for name, value in change.items():
        if value is None:
            del data[name]
        else:
            data[name] = value
    with pytest.raises(PayloadInvalid) as info:
        decoder(Shape)(data)
    assert message in str(info.value)


def test_every_problem_of_a_dataclass_is_reported() -> None:
    with pytest.raises(PayloadInvalid) as info:
        decoder(Point)({"y": "far"})
    assert str(info.value) == (
        "payload.x: Point field is missing; payload.y: expected a number, got str 'far'"
    )
    with pytest.raises(PayloadInvalid, match="payload: expected an object for Point, got list"):
        decoder(Point)([1, 2])


def test_a_model_that_does_not_validate_gives_pydantics_error() -> None:
    with pytest.raises(PayloadInvalid) as info:
        decoder(Model)({"id": "nope", "price": "1"})
    text = str(info.value)
    assert text.startswith("2 validation errors for Model\nid\n")
    assert "colour\n  Field required" in text


# -- Topic -----------------------------------------------------------------------------------


def test_a_topic_checks_its_declaration() -> None:
    with pytest.raises(InvalidTopic):
        Topic("a b", Point)
    with pytest.raises(ConfigurationError, match="payload type must be a dataclass or a pydantic"):
        Topic("t", dict)
    with pytest.raises(ConfigurationError, match="key 'z' is not a field of Point"):
        Topic("t", Point, key="z")
    with pytest.raises(ConfigurationError, match="key must be an attribute name, a function"):
        Topic("t", Point, key=3)  # type: ignore[arg-type]
    topic = Topic("t", Point, key="x", description="points")
    assert (topic.name, topic.payload, topic.content_type, topic.description) == (
        "t",
        Point,
        "application/json",
        "points",
    )
    assert repr(topic) == "Topic('t', Point)"
    assert repr(Topic("t")) == "Topic('t', any JSON)"


def test_key_of_derives_the_key_from_the_payload() -> None:
    shape = a_shape()
    assert Topic("t", Shape, key="id").key_of(shape) == str(shape.id).encode()
    assert Topic("t", Point, key="x").key_of(Point(42)) == b"42"
    assert Topic("t", Point, key=lambda p: f"p-{p.x}").key_of(Point(1)) == b"p-1"
    assert Topic("t", Point, key=lambda p: b"\x00").key_of(Point(1)) == b"\x00"
    assert Topic("t", Point).key_of(Point(1)) is None
    with pytest.raises(InvalidKey, match="key derived from the payload is a float"):
        Topic("t", Point, key="y").key_of(Point(1, 2.0))
    with pytest.raises(InvalidKey, match="has no attribute 'nope'"):
        Topic("t", key="nope").key_of({"nope": 1})

    def broken(point: Point) -> str:
        raise RuntimeError("boom")

    # A key function that raises is an outbox error naming the topic and the function, not a
    # bare exception out of `send`.
    with pytest.raises(InvalidKey, match=r"its key function .*broken raised RuntimeError"):
        Topic("t", Point, key=broken).key_of(Point(1))


def test_a_topic_refuses_a_payload_of_another_type() -> None:
    topic = Topic("t", Point)
    topic.check(Point(1))
    with pytest.raises(SerializationError, match="topic 't' carries Point; got a dict"):
        topic.check({"x": 1})
    Topic("t").check({"anything": 1})


# -- handlers --------------------------------------------------------------------------------


def test_the_payload_type_comes_from_the_topic_or_the_annotation() -> None:
    handlers = Handlers()
    points = Topic("points", Point)

    @handlers.handler(points)
    def from_topic(message, conn):  # type: ignore[no-untyped-def]
        pass

    @handlers.handler("models")
    async def from_annotation(message: InboxMessage[Model], conn: psycopg.Connection) -> None:
        pass

    @handlers.batch_handler("shapes")
    def batch(messages: list[InboxMessage[Shape]], conn: Any) -> None:
        pass

    @handlers.handler("plain")
    def plain(message: InboxMessage[dict[str, Any]], conn: Any) -> None:
        pass

    @handlers.handler("bare")
    def bare(message: InboxMessage, conn: Any) -> None:  # type: ignore[type-arg]
        pass

    types = {spec.topic: (spec.payload_type, spec.declared) for spec in handlers}
    assert types == {
        "points": (Point, points),
        "models": (Model, None),
        "shapes": (Shape, None),
        "plain": (None, None),
        "bare": (None, None),
    }


def test_an_annotation_that_cannot_be_resolved_is_an_error_naming_the_function() -> None:
    handlers = Handlers()
    with pytest.raises(ConfigurationError) as info:

        @handlers.handler("t")
        def on_thing(message: InboxMessage[Missing], conn: Any) -> None:  # type: ignore[name-defined]  # noqa: F821
            pass

    text = str(info.value)
    assert "@handler('t') on" in text and "on_thing" in text
    assert "NameError" in text and "Missing" in text


def test_a_topic_and_an_annotation_must_agree() -> None:
    handlers = Handlers()
    with pytest.raises(ConfigurationError, match="the topic carries Point but the callback is"):

        @handlers.handler(Topic("t", Point))
        def on(message: InboxMessage[Shape], conn: Any) -> None:
            pass

    with pytest.raises(ConfigurationError, match="payload type must be a dataclass"):

        @handlers.handler("u")
        def on_int(message: InboxMessage[UUID], conn: Any) -> None:
            pass


def test_sent_topics_are_declared_once() -> None:
    handlers, other = Handlers(), Handlers()
    a, b = Topic("a", Point), Topic("b")
    handlers.sends(b, a)
    handlers.sends(a)
    assert handlers.sent_topics == (a, b)
    other.sends(Topic("c"))
    handlers.include(other)
    assert [t.name for t in handlers.sent_topics] == ["a", "b", "c"]
    with pytest.raises(ConfigurationError, match="already declared as sent by another Topic"):
        handlers.sends(Topic("a", Point))
    with pytest.raises(ConfigurationError, match=r"takes outbox\.Topic declarations"):
        handlers.sends("a")  # type: ignore[arg-type]


# -- without pydantic ------------------------------------------------------------------------


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_importing_outbox_does_not_import_pydantic() -> None:
    assert run_python("import sys, outbox; print('pydantic' in sys.modules)").strip() == "False"


def test_dataclasses_work_without_pydantic() -> None:
    out = run_python(
        """
        import sys
        sys.modules["pydantic"] = None  # as if not installed: importing it raises ImportError
        from dataclasses import dataclass
        from decimal import Decimal
        from uuid import UUID, uuid4
        from outbox import Handlers, InboxMessage, JsonSerializer, Topic
        from outbox.core.codecs import decoder

        @dataclass
        class Paid:
            id: UUID
            amount: Decimal

        topic = Topic("paid", Paid, key="id")
        handlers = Handlers()

        @handlers.handler(topic)
        def on(message: InboxMessage[Paid], conn: object) -> None: ...

        paid = Paid(uuid4(), Decimal("1.5"))
        data = JsonSerializer().loads(JsonSerializer().dumps(paid))
        assert decoder(Paid)(data) == paid
        assert topic.key_of(paid) == str(paid.id).encode()
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_a_utc_datetime_keeps_its_instant() -> None:
    now = datetime.now(UTC)

    @dataclass
    class When:
        at: datetime

    assert decoder(When)(encode(When(now))).at == now


def test_a_broker_checks_a_topics_payload_before_it_touches_the_transaction() -> None:
    """`tx` is not even a connection: the refusals come first."""

    class Msgpack:
        content_type = "application/msgpack"

        def dumps(self, payload: Any) -> bytes:
            return b""

        def loads(self, data: bytes) -> Any:
            return None

    points = Topic("points", Point)
    with pytest.raises(SerializationError, match="carries Point; got a dict"):
        Broker().send(object(), points, {"x": 1})  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="declared 'application/json', but this Broker"):
        Broker(serializer=Msgpack()).send(object(), points, Point(1))
    with pytest.raises(InvalidKey, match="key derived from the payload is a float"):
        Broker().send(object(), Topic("points", Point, key="y"), Point(1))


def test_types_local_to_a_function_resolve_when_the_handler_is_registered() -> None:
    @dataclass
    class Part:
        name: str

    @dataclass
    class Machine:
        parts: list[Part]  # a string annotation naming a local class

    handlers = Handlers()

    @handlers.handler("machines")
    def on(message: InboxMessage[Machine], conn: Any) -> None:
        pass

    spec = handlers.get("machines")
    assert spec is not None and spec.payload_type is Machine
    assert decoder(Machine)({"parts": [{"name": "gear"}]}) == Machine([Part("gear")])


def test_a_payload_type_whose_fields_cannot_be_resolved_is_refused_at_registration() -> None:
    @dataclass
    class Broken:
        part: Unknown  # type: ignore[name-defined]  # noqa: F821

    handlers = Handlers()
    with pytest.raises(ConfigurationError) as info:

        @handlers.handler(Topic("broken", Broken))
        def on(message: Any, conn: Any) -> None:
            pass

    text = str(info.value)
    assert "@handler('broken') on" in text and "cannot resolve the annotations of" in text
    assert "Broken" in text and "Unknown" in text
    assert handlers.get("broken") is None


@dataclass
class Tree:
    label: str
    children: list[Tree] = field(default_factory=list)


def test_a_dataclass_that_contains_itself_round_trips() -> None:
    tree = Tree("root", [Tree("a", [Tree("a1")]), Tree("b")])
    assert decoder(Tree)(encode(tree)) == tree
    with pytest.raises(PayloadInvalid, match=r"payload\.children\[0\]\.children\[0\]\.label"):
        decoder(Tree)({"label": "root", "children": [{"label": "a", "children": [{}]}]})


def test_the_json_schema_describes_the_wire_form() -> None:
    from outbox.core.codecs import json_schema

    decimal = {"type": "string", "pattern": r"^-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"}
    point = {
        "type": "object",
        "title": "Point",
        "properties": {"x": {"type": "integer"}, "y": {"type": "number"}},
        "required": ["x"],
    }
    assert json_schema(Shape) == {
        "type": "object",
        "title": "Shape",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "at": {"type": "string", "format": "date-time"},
            "colour": {"enum": ["red", 2], "title": "Colour"},
            "points": {"type": "array", "items": point},
            "price": decimal,
            "day": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
            "clock": {"anyOf": [{"type": "string", "format": "time"}, {"type": "null"}]},
            "blob": {"type": "string", "contentEncoding": "base64"},
            "labels": {"type": "object", "additionalProperties": point},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        },
        "required": ["id", "at", "colour", "points", "price"],
    }
    assert json_schema(Tree)["properties"]["children"] == {
        "type": "array",
        "items": {"type": "object", "title": "Tree"},
    }
    assert json_schema(None) == {}
    model = json_schema(Model)
    assert model["title"] == "Model" and set(model["required"]) == {"id", "price", "colour"}


def test_newtypes_typeddicts_and_subclasses_of_scalars_convert() -> None:
    from typing import NewType, TypedDict

    OrderId = NewType("OrderId", int)

    class Sku(str):
        pass

    class Extra(TypedDict):
        note: str

    @dataclass
    class Row:
        order: OrderId
        sku: Sku
        extra: Extra

    row = decoder(Row, locals())({"order": 7, "sku": "A-1", "extra": {"note": "n"}})
    assert row == Row(OrderId(7), Sku("A-1"), {"note": "n"})
    assert type(row.sku) is Sku
    with pytest.raises(PayloadInvalid, match=r"payload\.order: expected an integer, got str"):
        decoder(Row)({"order": "7", "sku": "A-1", "extra": {}})
