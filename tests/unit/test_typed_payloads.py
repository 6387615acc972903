"""The typed-payload core without servers: the JSON encoding of models and the types users send,
its refusals, decoding into dataclasses and models, `Topic`, and payload types of handlers."""

from __future__ import annotations

import enum
import json
import math
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
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
from outbox.core.codecs import PayloadInvalid, decoder, json_schema

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


# -- mapping keys ----------------------------------------------------------------------------

PLUS_TWO = timezone(timedelta(hours=2))


@dataclass
class Keyed:
    """A mapping for each key type the codec converts: JSON object keys are text, and each is
    read back as its declared type."""

    counts: dict[int, str] = field(default_factory=dict)
    ratios: dict[float, int] = field(default_factory=dict)
    flags: dict[bool, str] = field(default_factory=dict)
    prices: dict[Decimal, int] = field(default_factory=dict)
    ids: dict[UUID, int] = field(default_factory=dict)
    days: dict[date, int] = field(default_factory=dict)
    moments: dict[datetime, int] = field(default_factory=dict)
    clocks: dict[time, int] = field(default_factory=dict)
    blobs: dict[bytes, int] = field(default_factory=dict)
    colours: dict[Colour, int] = field(default_factory=dict)
    sizes: dict[Literal["s", 1, None], int] = field(default_factory=dict)
    maybe: dict[int | None, str] = field(default_factory=dict)
    either: dict[int | str, str] = field(default_factory=dict)
    nested: dict[int, list[dict[bool, Point]]] = field(default_factory=dict)
    optional: dict[int, str] | None = None
    pair: tuple[dict[int, str], dict[str, dict[float, str]]] = ({}, {})


def a_keyed() -> Keyed:
    return Keyed(
        counts={1: "a", -5: "b", 10**30: "c", 0: "zero"},
        ratios={1.5: 1, -0.0: 2, 1e16: 3, 5e-324: 4, 0.1: 5, 2: 6},
        flags={True: "t", False: "f"},
        prices={Decimal("1.10"): 1, Decimal("-0"): 2, Decimal("1E+400"): 3},
        ids={UUID(int=1): 1},
        days={date(2026, 1, 2): 1},
        moments={datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=PLUS_TWO): 1},
        clocks={time(3, 4, 5, 6): 1},
        blobs={b"\x00\xff": 1},
        colours={Colour.RED: 1, Colour.BLUE: 2},
        sizes={"s": 1, 1: 2, None: 3},
        maybe={None: "none", 0: "zero"},
        either={7: "int", "x": "str", "": "empty"},
        nested={7: [{True: Point(1)}, {}], 8: []},
        optional={2: "x"},
        pair=({3: "y"}, {"k": {2.5: "z"}}),
    )


def test_mapping_keys_are_written_as_json_writes_them_or_as_their_values_are() -> None:
    wire = encode(a_keyed())
    assert wire == {
        "counts": {"1": "a", "-5": "b", "1000000000000000000000000000000": "c", "0": "zero"},
        "ratios": {"1.5": 1, "-0.0": 2, "1e+16": 3, "5e-324": 4, "0.1": 5, "2": 6},
        "flags": {"true": "t", "false": "f"},
        "prices": {"1.10": 1, "-0": 2, "1E+400": 3},
        "ids": {"00000000-0000-0000-0000-000000000001": 1},
        "days": {"2026-01-02": 1},
        "moments": {"2026-01-02T03:04:05.000006+02:00": 1},
        "clocks": {"03:04:05.000006": 1},
        "blobs": {"AP8=": 1},
        "colours": {"red": 1, "2": 2},
        "sizes": {"s": 1, "1": 2, "null": 3},
        "maybe": {"null": "none", "0": "zero"},
        "either": {"7": "int", "x": "str", "": "empty"},
        "nested": {"7": [{"true": {"x": 1, "y": 0.0}}, {}], "8": []},
        "optional": {"2": "x"},
        "pair": [{"3": "y"}, {"k": {"2.5": "z"}}],
    }


def test_mapping_keys_are_read_back_as_their_declared_type() -> None:
    keyed = a_keyed()
    back = decoder(Keyed)(encode(keyed))
    assert back == keyed
    assert [type(k) for k in back.counts] == [int] * 4
    assert [type(k) for k in back.ratios] == [float] * 6
    assert list(back.flags) == [True, False] and list(back.maybe) == [None, 0]
    assert math.copysign(1.0, list(back.ratios)[1]) == -1.0  # -0.0 keeps its sign
    assert [str(k) for k in back.prices] == ["1.10", "-0", "1E+400"]  # every digit
    assert list(back.colours) == [Colour.RED, Colour.BLUE]
    assert next(iter(back.moments)).utcoffset() == timedelta(hours=2)
    assert list(back.either) == [7, "x", ""]


def test_keys_of_a_message_written_before_keys_were_converted_still_decode() -> None:
    """What json.dumps wrote for int, float, bool and None keys is the wire form kept: a
    message already stored (dead, or waiting) reads as its type says."""
    old = json.loads(
        json.dumps(
            {"counts": {1: "a"}, "ratios": {2.5: 1}, "flags": {False: "f"}, "maybe": {None: "n"}}
        )
    )
    assert decoder(Keyed)(old) == Keyed(
        counts={1: "a"}, ratios={2.5: 1}, flags={False: "f"}, maybe={None: "n"}
    )


@pytest.mark.parametrize(
    ("field_name", "keys", "message"),
    [
        ("counts", {"x": "a"}, "payload.counts: key 'x' is not an integer"),
        ("counts", {"1.0": "a"}, "payload.counts: key '1.0' is not an integer"),
        ("counts", {"1": "a", "01": "b"}, "payload.counts: keys '1' and '01' are both read as 1"),
        ("flags", {"1": "a"}, "payload.flags: key '1' is not true or false"),
        ("flags", {"True": "a"}, "payload.flags: key 'True' is not true or false"),
        ("ratios", {"nan": 1}, "payload.ratios: key 'nan' is not a number"),
        ("ratios", {"1e999": 1}, "payload.ratios: key '1e999' is not a number"),
        ("ids", {"nope": 1}, "payload.ids: key 'nope' is not a UUID"),
        (
            "moments",
            {"2026-01-02T03:04:05": 1},
            "payload.moments: key '2026-01-02T03:04:05' is not a datetime with a time zone",
        ),
        ("colours", {"green": 1}, "payload.colours: key 'green' is not a Colour ('red', '2')"),
        ("sizes", {"2": 1}, "payload.sizes: key '2' is not one of ('s', '1', 'null')"),
        ("maybe", {"None": "n"}, "payload.maybe: key 'None' is not int | None"),
        (
            "nested",
            {"7": [{"yes": {"x": 1}}]},
            "payload.nested.7[0]: key 'yes' is not true or false",
        ),
    ],
)
def test_a_key_that_does_not_read_as_its_type_names_the_field(
    field_name: str, keys: dict[str, Any], message: str
) -> None:
    with pytest.raises(PayloadInvalid) as info:
        decoder(Keyed)({field_name: keys})
    assert message in str(info.value)


class Sku(str):
    pass


@pytest.mark.parametrize(
    ("keyed", "message"),
    [
        (Keyed(counts={True: "a"}), "payload.counts: key True (bool) would be written 'true'"),
        (
            Keyed(counts={"1": "a"}),
            "payload.counts: key '1' (str) would be written '1' and read back as 1 (int)",
        ),
        (Keyed(counts={1.5: "a"}), "payload.counts: key 1.5 (float) would be written '1.5'"),
        (Keyed(ratios={float("nan"): 1}), "payload.ratios: key nan is not a JSON number"),
        (Keyed(ratios={float("-inf"): 1}), "payload.ratios: key -inf is not a JSON number"),
        (
            Keyed(ratios={2**53 + 1: 1}),
            "payload.ratios: key 9007199254740993 (int) would be written",
        ),
        (Keyed(prices={Decimal("NaN"): 1}), "payload.prices: key Decimal('NaN') is refused"),
        (
            Keyed(prices={1.5: 1}),
            "payload.prices: key 1.5 (float) would be written '1.5' and read back as Decimal(",
        ),
        (
            Keyed(moments={datetime(2026, 1, 1): 1}),
            "payload.moments: key datetime.datetime(2026, 1, 1, 0, 0): a naive datetime",
        ),
        (
            Keyed(days={datetime(2026, 1, 1, tzinfo=UTC): 1}),
            "tzinfo=datetime.timezone.utc) (datetime) would be written '2026-01-01T00:00:00+00:00'"
            ", which the declared key type date does not read",
        ),
        (
            Keyed(colours={"red": 1}),
            "payload.colours: key 'red' (str) would be written 'red' and read back as <Colour.RED",
        ),
        (Keyed(sizes={"x": 1}), "payload.sizes: key 'x' (str) would be written 'x'"),
        (
            Keyed(either={"1": "a"}),
            "payload.either: key '1' (str) would be written '1' and read back as 1 (int)",
        ),
        (Keyed(counts={(1, 2): "a"}), "payload.counts: key (1, 2) of type tuple has no JSON form"),
        (
            Keyed(nested={1: [{}, {1: Point(1)}]}),
            "payload.nested.1[1]: key 1 (int) would be written '1'",
        ),
        (
            Keyed(pair=({}, {"k": {float("inf"): "z"}})),
            "payload.pair[1].k: key inf is not a JSON number",
        ),
        (
            Keyed(counts={10**5000: "a"}),
            "payload.counts: key <an int of 5001 digits> is longer than",
        ),
    ],
)
def test_send_refuses_a_key_it_would_not_read_back_naming_the_field(
    keyed: Keyed, message: str
) -> None:
    with pytest.raises(SerializationError) as info:
        json_serializer.dumps(keyed)
    assert message in str(info.value)


def test_keys_that_are_str_subclasses_and_very_large_ints_round_trip() -> None:
    keyed = Keyed(counts={10**4000: "big"}, either={Sku("x"): "sku", 3: "int"})
    back = decoder(Keyed)(encode(keyed))
    assert back == keyed
    assert [type(k) for k in back.either] == [str, int]


@dataclass
class Grid:
    cells: dict[tuple[int, int], str]


@dataclass
class Holder:
    grid: Grid | None = None


@dataclass
class Ambiguous:
    either: dict[int, str] | dict[str, int]


def test_a_key_type_without_a_json_form_is_refused_when_the_topic_is_declared() -> None:
    for payload in (Grid, Holder):
        with pytest.raises(ConfigurationError) as info:
            Topic("grid", payload)
        text = str(info.value)
        assert (
            text.startswith("Topic('grid'): ")
            and "Grid.cells: a dict key of type tuple[int, int] has no JSON form" in text
        )
    handlers = Handlers()
    with pytest.raises(
        ConfigurationError, match=r"@handler\('grid'\) on .*Grid\.cells: a dict key"
    ):

        @handlers.handler("grid")
        def on(message: InboxMessage[Grid], conn: Any) -> None:
            pass

    with pytest.raises(SerializationError, match=r"payload: Grid\.cells: a dict key of type"):
        json_serializer.dumps(Grid({(1, 2): "a"}))


def test_a_union_of_mappings_a_json_object_cannot_tell_apart_is_refused() -> None:
    with pytest.raises(
        ConfigurationError, match=r"Ambiguous\.either: dict\[int, str\] \| dict\[str, int\]"
    ):
        Topic("ambiguous", Ambiguous)


def test_the_json_schema_names_the_keys_of_a_mapping() -> None:
    properties = json_schema(Keyed)["properties"]
    integer = {"pattern": "^-?[0-9]+$"}
    assert properties["counts"] == {
        "type": "object",
        "propertyNames": integer,
        "additionalProperties": {"type": "string"},
    }
    assert properties["flags"]["propertyNames"] == {"enum": ["true", "false"]}
    assert properties["ratios"]["propertyNames"]["pattern"].startswith("^-?")
    assert properties["ids"]["propertyNames"] == {"format": "uuid"}
    assert properties["days"]["propertyNames"] == {"format": "date"}
    assert properties["colours"]["propertyNames"] == {"enum": ["red", "2"]}
    assert properties["sizes"]["propertyNames"] == {"enum": ["s", "1", "null"]}
    assert properties["maybe"]["propertyNames"] == {"anyOf": [integer, {"const": "null"}]}
    assert "propertyNames" not in properties["pair"]["prefixItems"][1]
    assert "propertyNames" not in json_schema(Shape)["properties"]["labels"]


class Level(enum.Enum):
    LOW = 1


class KeyedModel(pydantic.BaseModel):
    counts: dict[int, str] = {}
    flags: dict[bool, str] = {}
    ids: dict[UUID, int] = {}
    nested: dict[int, list[dict[bool, int]]] = {}
    ratios: dict[float, int] = {}
    levels: dict[Level, int] = {}
    either: dict[int | str, int] = {}


def test_a_models_keys_round_trip_by_its_own_rules() -> None:
    model = KeyedModel(
        counts={1: "a"}, flags={False: "f"}, ids={UUID(int=2): 1}, nested={3: [{True: 1}]}
    )
    wire = encode(model)
    assert wire["counts"] == {"1": "a"} and wire["flags"] == {"false": "f"}
    assert decoder(KeyedModel)(wire) == model


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            KeyedModel(levels={Level.LOW: 1}),
            "payload: KeyedModel's own validation refuses what it wrote",
        ),
        (KeyedModel(either={1: 1}), "payload.either: key 1 (int) is read back as '1' (str)"),
        (KeyedModel(ratios={float("nan"): 1}), "payload.ratios: key nan is not a JSON number"),
        (KeyedModel(ratios={float("inf"): 1}), "payload.ratios: key inf is not a JSON number"),
        (KeyedModel(either={1: 1, "1": 2}), "payload.either: 2 keys sent, 1 read back"),
    ],
)
def test_send_refuses_a_model_whose_keys_it_would_not_read_back(
    model: pydantic.BaseModel, message: str
) -> None:
    with pytest.raises(SerializationError) as info:
        json_serializer.dumps(model)
    assert message in str(info.value)
    with pytest.raises(SerializationError) as info:
        json_serializer.dumps({"inside": [model]})
    assert message.replace("payload", "payload.inside[0]", 1) in str(info.value)


class AliasedModel(pydantic.BaseModel):
    counts: dict[int, str] = pydantic.Field(alias="Counts")


class NamedModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(populate_by_name=True)
    counts: dict[int, str] = pydantic.Field(alias="Counts")


def test_a_model_with_aliases_and_keys_reads_back() -> None:
    """Written by alias, read by alias or by name: it was refused (written by name, which the
    model read only with populate_by_name=True)."""
    aliased = AliasedModel(Counts={1: "a"})
    assert encode(aliased) == {"Counts": {"1": "a"}}
    assert decoder(AliasedModel)(encode(aliased)) == aliased
    assert decoder(AliasedModel)({"counts": {"1": "a"}}) == aliased  # stored by name before
    named = NamedModel(Counts={1: "a"})
    assert decoder(NamedModel)(encode(named)) == named


def test_keys_of_a_dataclass_local_to_a_function_are_written_by_their_type() -> None:
    """A Topic resolves its payload's annotations with the names where it is declared."""

    @dataclass
    class Part:
        name: str

    @dataclass
    class Stock:
        parts: dict[UUID, Part]  # a string annotation naming a local class

    topic = Topic("stock", Stock)
    stock = Stock({UUID(int=3): Part("gear")})
    wire = encode(stock)
    assert wire == {"parts": {str(UUID(int=3)): {"name": "gear"}}}
    assert topic.payload is not None and decoder(topic.payload, locals())(wire) == stock


def test_keys_of_a_dataclass_whose_annotations_cannot_be_resolved_go_as_json_writes_them() -> None:
    """Sent without a Topic and with no handler registered: outbox cannot tell its key types,
    so keys are written as json.dumps writes them (the reader converts them back), and what
    json.dumps refuses is refused."""

    @dataclass
    class Part:
        name: str

    @dataclass
    class Bin:
        parts: dict[int, Part]
        spares: dict[UUID, Part] | None = None

    assert encode(Bin({1: Part("gear")})) == {"parts": {"1": {"name": "gear"}}, "spares": None}
    spare = Bin({}, {UUID(int=3): Part("gear")})
    with pytest.raises(SerializationError, match=r"payload\.spares: key UUID\('00000000-"):
        json_serializer.dumps(spare)
    # A handler's registration resolves them (with its own local names): from then on, too.
    read = decoder(Bin, locals())
    assert read(encode(Bin({1: Part("gear")}))) == Bin({1: Part("gear")})
    assert read(encode(spare)) == spare
