"""What a `Topic` accepts reads back as the same value, or send refuses it naming the place
(issue 31): the values of a dataclass checked against their declared types when they are
written, unions, Enums and Literals of any value, mapping subclasses, numbers a float would
change, non-finite Decimals, plain payloads whose keys are written alike, and pydantic models
with aliases, strict validation and offsets of seconds. Each case here was sent, then refused
(or changed) by the handler, before its fix."""

from __future__ import annotations

import enum
import json
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Generic, Literal, TypeVar
from uuid import UUID, uuid4

import pydantic
import pytest

from outbox import ConfigurationError, JsonSerializer, SerializationError, Topic
from outbox.core.codecs import PayloadInvalid, decoder, json_schema
from outbox.core.serializers import encode_payload, read_payload

serializer = JsonSerializer()
T = TypeVar("T")


def sent(payload: Any) -> bytes:
    return encode_payload(payload, serializer)[0]


def read(payload_type: type[Any], data: bytes) -> Any:
    """What a handler of `payload_type` gets for `data`."""
    return read_payload(payload_type, data, serializer.content_type, serializer)


def round_trip(payload: Any) -> Any:
    """The payload read back through a Topic of its type, as a handler reads it."""
    topic = Topic("t", type(payload))
    topic.check(payload)
    assert topic.payload is not None
    back = read(topic.payload, sent(payload))
    assert back == payload
    assert type(back) is type(payload)
    return back


def refused(payload: Any) -> str:
    """Send's refusal of `payload` (it must begin with the place: `payload...`)."""
    Topic("t", type(payload)).check(payload)
    with pytest.raises(SerializationError) as info:
        sent(payload)
    text = str(info.value)
    assert text.startswith("payload"), text
    return text


# -- unions ---------------------------------------------------------------------------------


@dataclass
class Either:
    text_or_id: str | UUID = ""
    id_or_text: UUID | str = ""
    text_or_int: str | int = ""
    day_or_moment: date | datetime | None = None
    moment_or_day: datetime | date | None = None
    number: float | int = 0
    maybe: list[int | None] | None = None


def test_a_union_value_reads_back_as_its_own_member() -> None:
    some = uuid4()
    back = round_trip(
        Either(
            text_or_id="x",
            id_or_text=some,
            text_or_int=3,
            day_or_moment=datetime(2026, 1, 2, 3, tzinfo=UTC),
            moment_or_day=date(2026, 1, 2),
            number=2,
            maybe=[1, None],
        )
    )
    assert type(back.id_or_text) is UUID and type(back.moment_or_day) is date
    round_trip(Either(id_or_text="not a uuid", text_or_int="3"))


@pytest.mark.parametrize(
    ("either", "message"),
    [
        (
            Either(text_or_id=UUID(int=1)),
            "payload.text_or_id: UUID('00000000-0000-0000-0000-000000000001') (UUID) would be "
            'written "00000000-0000-0000-0000-000000000001" and read back as '
            "'00000000-0000-0000-0000-000000000001' (str): the declared type is str | UUID",
        ),
        (
            Either(id_or_text=str(UUID(int=1))),
            "payload.id_or_text: '00000000-0000-0000-0000-000000000001' (str) would be written",
        ),
        (Either(text_or_int=True), "payload.text_or_int: True (bool) is not str | int"),
        (
            Either(maybe=[1, "2"]),
            "payload.maybe[1]: '2' (str) would be written \"2\", which the declared type int",
        ),
    ],
)
def test_send_refuses_a_union_value_read_back_as_another_member(
    either: Either, message: str
) -> None:
    assert message in refused(either)


# -- scalars of another type than declared -----------------------------------------------------


@dataclass
class Scalars:
    count: int = 0
    ratio: float = 0.0
    flag: bool = False
    name: str = ""
    day: date = date(2026, 1, 1)
    id: UUID = field(default_factory=lambda: UUID(int=0))
    price: Decimal = Decimal(0)
    items: list[int] = field(default_factory=list)
    pair: tuple[int, ...] = ()


@pytest.mark.parametrize(
    ("scalars", "message"),
    [
        (Scalars(count=True), "payload.count: True (bool) would be written true, which the"),
        (Scalars(ratio=False), "payload.ratio: False (bool) would be written false, which"),
        (Scalars(count=1.0), "payload.count: 1.0 (float) would be written 1.0, which the"),
        (Scalars(flag=1), "payload.flag: 1 (int) would be written 1, which the declared type"),
        (Scalars(name=7), "payload.name: 7 (int) would be written 7, which the declared"),
        (
            Scalars(day=datetime(2026, 1, 1, tzinfo=UTC)),
            "payload.day: datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.timezone.utc) "
            '(datetime) would be written "2026-01-01T00:00:00+00:00", which the declared type '
            "date does not read",
        ),
        (
            Scalars(id=str(UUID(int=1))),
            "read back as UUID('00000000-0000-0000-0000-000000000001') (UUID): the declared",
        ),
        (Scalars(ratio=10**309), "payload.ratio: 1000000000000000000000"),
        (
            Scalars(ratio=2**53 + 1),
            "payload.ratio: 9007199254740993 (int) would be written 9007199254740993 and read "
            "back as 9007199254740992.0 (float)",
        ),
        (Scalars(price=0.1), "payload.price: 0.1 (float) would be written 0.1 and read back"),
        (Scalars(items=[1, True]), "payload.items[1]: True (bool) would be written true"),
        (Scalars(items=(1, 2)), "payload.items: (1, 2) (tuple) would be written [1,2] and"),
        (Scalars(pair=[1]), "payload.pair: [1] (list) would be written [1] and read back as"),
    ],
)
def test_send_refuses_a_value_its_declared_type_would_not_read_back(
    scalars: Scalars, message: str
) -> None:
    assert message in refused(scalars)


def test_values_a_declared_type_reads_back_equal_are_sent() -> None:
    """An int for a float (read back as the equal float), an int for a Decimal, an IntEnum for
    an int, a str subclass for a str: equal values."""

    class Level(enum.IntEnum):
        LOW = 1

    class Sku(str):
        pass

    back = decoder(Scalars)(json.loads(sent(Scalars(count=Level.LOW, ratio=2**53, name=Sku("a")))))
    assert back == Scalars(count=1, ratio=float(2**53), name="a")
    assert back.ratio == 2**53 and type(back.ratio) is float
    assert decoder(Scalars)(json.loads(sent(Scalars(price=5)))).price == Decimal(5)


def test_a_number_too_large_for_a_float_is_refused_by_the_reader_naming_the_field() -> None:
    with pytest.raises(PayloadInvalid, match=r"payload\.ratio: expected a number"):
        decoder(Scalars)({"ratio": 10**309})


@dataclass
class Inner:
    x: int


@dataclass
class InnerMore(Inner):
    y: int = 0


@dataclass
class Outer:
    inner: Inner


def test_a_subclass_is_refused_where_its_base_is_declared() -> None:
    """The handler reads the declared class: a subclass would come back as its base, without
    its own fields, and not equal to what was sent."""
    assert "payload.inner: InnerMore(x=1, y=2) (InnerMore) would be written" in refused(
        Outer(InnerMore(1, 2))
    )
    round_trip(Outer(Inner(1)))


def test_a_topic_refuses_a_subclass_of_its_payload_type() -> None:
    with pytest.raises(SerializationError) as info:
        Topic("t", Inner).check(InnerMore(1, 2))
    assert str(info.value) == (
        "topic 't' carries Inner; got a InnerMore, a subclass, which the handler would read "
        "back as a Inner (not equal to what was sent, its own fields dropped): build a Inner"
    )

    class Box(pydantic.BaseModel, Generic[T]):
        item: T

    Topic("box", Box).check(Box[int](item=1))  # a parametrized model: its own type
    Topic("box", Box[int]).check(Box[int](item=1))


@dataclass(eq=False)
class Loner:
    x: int


@dataclass
class Named:
    name: str


@dataclass
class Either2:
    one: Named | Loner


def test_a_dataclass_equal_only_to_itself_is_compared_by_its_fields() -> None:
    """The value of a union whose earlier type reads JSON objects too is read back and compared:
    a dataclass declared eq=False, equal only to itself, must be compared by its fields."""
    back = decoder(Either2)(json.loads(sent(Either2(Loner(1)))))
    assert type(back.one) is Loner and back.one.x == 1
    assert "payload.one: Inner(x=1) (Inner) is not Named | Loner" in refused(Either2(Inner(1)))


# -- Enums and Literals of any value ------------------------------------------------------------


class Pair(enum.Enum):
    ORIGIN = (0, 0)
    UNIT = (1, 1)


class Rate(enum.Enum):
    LOW = Decimal("0.5")
    HIGH = Decimal("1.5")


class Shade(enum.Enum):
    DARK = "dark"
    LIGHT = "light"


class Twice(enum.Enum):
    """Two members written alike: the reader takes the first."""

    TEXT = "1.5"
    NUMBER = Decimal("1.5")


class Perm(enum.Flag):
    R = 1
    W = 2


@dataclass
class Enums:
    pair: Pair = Pair.ORIGIN
    rate: Rate = Rate.LOW
    shade: Literal[Shade.DARK] = Shade.DARK
    either: Literal[Shade.LIGHT, 0, "x"] = "x"
    twice: Twice = Twice.TEXT
    perm: Perm = Perm.R
    pairs: dict[str, Pair] = field(default_factory=dict)


def test_enums_of_any_value_and_literals_of_enums_read_back_as_their_members() -> None:
    back = round_trip(
        Enums(
            pair=Pair.UNIT,
            rate=Rate.HIGH,
            either=Shade.LIGHT,
            perm=Perm.R | Perm.W,
            pairs={"a": Pair.UNIT},
        )
    )
    assert back.pair is Pair.UNIT and back.rate is Rate.HIGH and back.shade is Shade.DARK
    assert back.either is Shade.LIGHT and back.perm == Perm.R | Perm.W
    assert json.loads(sent(back)) == {
        "pair": [1, 1],
        "rate": "1.5",
        "shade": "dark",
        "either": "light",
        "twice": "1.5",
        "perm": 3,
        "pairs": {"a": [1, 1]},
    }
    round_trip(Enums(either=0))
    properties = json_schema(Enums)["properties"]
    assert properties["pair"] == {"enum": [[0, 0], [1, 1]], "title": "Pair"}
    assert properties["rate"] == {"enum": ["0.5", "1.5"], "title": "Rate"}
    assert properties["shade"] == {"enum": ["dark"]}


def test_an_enum_member_written_as_another_is_refused_at_send() -> None:
    assert (
        "payload.twice: <Twice.NUMBER: Decimal('1.5')> (Twice) would be written \"1.5\" and "
        "read back as <Twice.TEXT: '1.5'> (Twice)" in refused(Enums(twice=Twice.NUMBER))
    )
    assert "payload.either: 'light' (str) would be written" in refused(Enums(either="light"))


def test_the_reader_of_an_enum_or_a_literal_tells_a_boolean_from_a_number() -> None:
    @dataclass
    class Strict:
        perm: Perm = Perm.R
        one: Literal[1] = 1

    with pytest.raises(PayloadInvalid) as info:
        decoder(Strict)({"perm": True, "one": True})
    assert "payload.perm: expected a Perm" in str(info.value)
    assert "payload.one: expected one of (1,), got bool True" in str(info.value)


# -- sets and bare collections ------------------------------------------------------------------


@dataclass
class Collections:
    ids: set[UUID] = field(default_factory=set)
    frozen: frozenset[int] = frozenset()
    anything: tuple = ()  # type: ignore[type-arg]
    bag: set = field(default_factory=set)  # type: ignore[type-arg]


def test_a_set_is_written_as_a_sorted_array_and_bare_collections_read_back() -> None:
    """A set a type declares is read back as a set: written as an array (sorted, one wire form
    for one set); a bare `tuple` was read as nothing at all (every message dead)."""
    collections = Collections(
        ids={UUID(int=2), UUID(int=1)}, frozen=frozenset({3, 1}), anything=(1, "a"), bag={2, 1}
    )
    back = round_trip(collections)
    assert type(back.ids) is set and type(back.frozen) is frozenset
    wire = json.loads(sent(collections))
    assert wire == {
        "ids": [str(UUID(int=1)), str(UUID(int=2))],
        "frozen": [1, 3],
        "anything": [1, "a"],
        "bag": [1, 2],
    }
    assert "payload.ids: [UUID('00000000-0000-0000-0000-000000000001')] (list) would be " in (
        refused(Collections(ids=[UUID(int=1)]))
    )
    round_trip(Collections(frozen={1}))  # a set for a frozenset: read back equal


# -- mapping annotations ---------------------------------------------------------------------------


@dataclass
class Mappings:
    ordered: OrderedDict[str, int] = field(default_factory=OrderedDict)
    counter: Counter[str] = field(default_factory=Counter)
    keyed: OrderedDict[int, Decimal] = field(default_factory=OrderedDict)


def test_ordered_dicts_and_counters_read_back_as_themselves() -> None:
    mappings = Mappings(
        ordered=OrderedDict([("b", 2), ("a", 1)]),
        counter=Counter("abca"),
        keyed=OrderedDict([(2, Decimal("1.10"))]),
    )
    back = round_trip(mappings)
    assert type(back.ordered) is OrderedDict and list(back.ordered) == ["b", "a"]
    assert type(back.counter) is Counter and back.counter["a"] == 2
    assert type(back.keyed) is OrderedDict and list(back.keyed) == [2]
    assert json.loads(sent(mappings))["keyed"] == {"2": "1.10"}
    assert json_schema(Mappings)["properties"]["counter"] == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
    }
    round_trip(Mappings(ordered={"a": 1}, counter={"a": 1}))  # equal mappings: read back equal


def test_a_defaultdict_is_refused_when_the_topic_is_declared() -> None:
    @dataclass
    class Tallies:
        tallies: defaultdict[str, int]

    with pytest.raises(ConfigurationError) as info:
        Topic("tallies", Tallies)
    assert "Tallies.tallies: a defaultdict's default_factory is not written" in str(info.value)
    with pytest.raises(ConfigurationError, match=r"Tallies\.tallies: a defaultdict's"):
        decoder(Tallies, locals())  # what a handler's registration builds


# -- Decimal infinities and NaN -----------------------------------------------------------------


@dataclass
class Prices:
    price: Decimal = Decimal(0)
    by_price: dict[Decimal, int] = field(default_factory=dict)
    some: frozenset[Decimal] = frozenset()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (Prices(price=Decimal("Infinity")), "payload.price: Decimal('Infinity') is refused"),
        (Prices(price=Decimal("-Infinity")), "payload.price: Decimal('-Infinity') is refused"),
        (Prices(price=Decimal("NaN")), "payload.price: Decimal('NaN') is refused"),
        (Prices(price=Decimal("sNaN")), "payload.price: Decimal('sNaN') is refused"),
        (Prices(by_price={Decimal("Infinity"): 1}), "payload.by_price: key Decimal('Infinity')"),
        ({"a": [Decimal("-Infinity")]}, "payload.a[0]: Decimal('-Infinity') is refused"),
        ({Decimal("NaN"): 1}, "payload: key Decimal('NaN') of type Decimal is refused"),
        # A set with a NaN cannot be sorted (its comparison signals): refused all the same.
        (Prices(some=frozenset({Decimal(0), Decimal("NaN")})), "Decimal('NaN') is refused"),
    ],
)
def test_a_decimal_infinity_or_nan_is_refused_at_send(payload: Any, message: str) -> None:
    with pytest.raises(SerializationError) as info:
        sent(payload)
    assert message in str(info.value)


# -- plain payloads: keys written alike ----------------------------------------------------------


@dataclass
class Loose:
    anything: Any = None
    by_any: dict[Any, int] = field(default_factory=dict)
    by_name: dict[str, Any] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({1: "a", "1": "b"}, "payload: keys 1 and '1' are both written \"1\": one would be lost"),
        ([{"x": {True: 1, "true": 2}}], "payload[0].x: keys True and 'true' are both written"),
        ({"n": {None: 1, "null": 2}}, "payload.n: keys None and 'null' are both written"),
        ({"f": {"1.5": 1, 1.5: 2}}, "payload.f: keys '1.5' and 1.5 are both written"),
        (Loose(anything={"k": {2: 0, "2": 1}}), "payload.anything.k: keys 2 and '2' are both"),
        (Loose(by_any={0: 0, "0": 1}), "payload.by_any: keys 0 and '0' are both written"),
        (Loose(by_name={"k": [{1: 0, "1": 1}]}), "payload.by_name.k[0]: keys 1 and '1' are"),
    ],
)
def test_plain_keys_written_alike_are_refused_at_send(payload: Any, message: str) -> None:
    with pytest.raises(SerializationError) as info:
        sent(payload)
    assert message in str(info.value)


def test_plain_keys_of_other_types_that_are_written_apart_are_sent_as_before() -> None:
    payload = {1: "a", "2": "b", None: [{True: 1.5, 2.5: None}]}
    assert sent(payload) == json.dumps(payload, separators=(",", ":")).encode()


# -- lone surrogates and NUL -------------------------------------------------------------------


def test_a_lone_surrogate_is_refused_naming_its_place_and_nul_is_sent() -> None:
    with pytest.raises(SerializationError, match=r"payload\.a\[1\]: a string that is not valid"):
        sent({"a": ["ok", "x\ud800"]})
    with pytest.raises(SerializationError, match=r"payload\.by_name: key 'k\\udc80' is not valid"):
        sent(Loose(by_name={"k\udc80": 1}))
    assert round_trip(Loose(by_name={"\x00": "\x00"})).by_name == {"\x00": "\x00"}


class Named2(pydantic.BaseModel):
    names: dict[str, int] = {}
    name: str = ""


def test_a_lone_surrogate_in_a_models_key_is_refused_not_replaced() -> None:
    """pydantic writes a lone surrogate in a dict key as U+FFFD: another key, silently."""
    with pytest.raises(SerializationError, match=r"payload\.names: key 'a\\udc80' is not"):
        sent(Named2(names={"é": 1, "a\udc80": 2}))
    with pytest.raises(SerializationError, match=r"payload\.name: a string that is not valid"):
        sent(Named2(name="\ud800"))
    assert round_trip(Named2(names={"é\x00": 1})).names == {"é\x00": 1}


# -- pydantic: aliases -------------------------------------------------------------------------


class Line(pydantic.BaseModel):
    sku_code: str = pydantic.Field(alias="skuCode")
    unit_price: Decimal = pydantic.Field(alias="unitPrice")


class Aliased(pydantic.BaseModel):
    order_id: UUID = pydantic.Field(alias="orderId")
    lines: list[Line] = []
    note: str | None = None


def test_a_model_with_aliases_is_written_by_alias_and_reads_back() -> None:
    model = Aliased(orderId=UUID(int=1), lines=[Line(skuCode="a", unitPrice=Decimal("1.5"))])
    assert json.loads(sent(model)) == {
        "orderId": str(UUID(int=1)),
        "lines": [{"skuCode": "a", "unitPrice": "1.5"}],
        "note": None,
    }
    round_trip(model)


def test_a_model_message_stored_by_field_name_still_decodes() -> None:
    old = b'{"order_id":"00000000-0000-0000-0000-000000000001","lines":[{"sku_code":"a",'
    old += b'"unit_price":"1.5"}]}'
    back = read(Aliased, old)
    assert back == Aliased(orderId=UUID(int=1), lines=[Line(skuCode="a", unitPrice="1.5")])


class Renamed(pydantic.BaseModel):
    x: int = pydantic.Field(serialization_alias="X", validation_alias="ex")


class RenamedInside(pydantic.BaseModel):
    inner: list[Renamed]


@dataclass
class RenamedInDataclass:
    renamed: Renamed | None = None


class Choices(pydantic.BaseModel):
    x: int = pydantic.Field(
        serialization_alias="X", validation_alias=pydantic.AliasChoices("ex", "X")
    )


def test_a_model_whose_written_names_it_does_not_read_is_refused_when_the_topic_is_declared() -> (
    None
):
    for payload_type in (Renamed, RenamedInside, RenamedInDataclass):
        with pytest.raises(ConfigurationError) as info:
            Topic("renamed", payload_type)
        assert "Renamed.x is written as 'X', which Renamed does not read" in str(info.value)
    with pytest.raises(SerializationError, match=r"payload\.m: Renamed\.x is written as 'X'"):
        sent({"m": Renamed(ex=1)})
    round_trip(Choices(ex=1))


class Forbids(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    x: int

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.x


class Excludes(pydantic.BaseModel):
    secret: str = pydantic.Field(exclude=True)


def test_a_model_that_would_refuse_what_it_writes_is_refused_when_the_topic_is_declared() -> None:
    with pytest.raises(ConfigurationError, match=r"Forbids\.double is written \(a computed"):
        Topic("forbids", Forbids)
    with pytest.raises(ConfigurationError, match=r"Excludes\.secret is required but not"):
        Topic("excludes", Excludes)


# -- pydantic: strict models ---------------------------------------------------------------------


class StrictOrder(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)
    order_id: UUID
    at: datetime
    day: date
    price: Decimal
    shade: Shade
    blob: bytes = b""


def test_a_strict_model_reads_back() -> None:
    model = StrictOrder(
        order_id=uuid4(),
        at=datetime.now(UTC),
        day=date(2026, 1, 1),
        price=Decimal("1.10"),
        shade=Shade.DARK,
        blob=b"ab",
    )
    round_trip(model)
    assert decoder(StrictOrder)(json.loads(sent(model))) == model

    @dataclass
    class Carrier:
        order: StrictOrder

    assert decoder(Carrier)(json.loads(sent(Carrier(model)))) == Carrier(model)


def test_a_model_payload_that_is_not_json_or_not_valid_says_which() -> None:
    with pytest.raises(SerializationError, match="payload is not valid JSON"):
        read(StrictOrder, b'{"order_id": ')
    with pytest.raises(PayloadInvalid, match=r"validation errors? for StrictOrder"):
        read(StrictOrder, b'{"order_id": 1}')


# -- pydantic: offsets of seconds, keys written alike ---------------------------------------------


class Clocked(pydantic.BaseModel):
    at: datetime
    clock: time | None = None
    history: list[dict[str, datetime]] = []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            Clocked(at=datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=30)))),
            "payload.at: the offset +00:00:30 of 2026-01-01T00:00:00+00:00:30 has seconds, "
            "which pydantic writes without them (another instant)",
        ),
        (
            Clocked(
                at=datetime(2026, 1, 1, tzinfo=UTC),
                clock=time(1, tzinfo=timezone(timedelta(microseconds=1))),
            ),
            "payload.clock: the offset +00:00:00.000001 of",
        ),
        (
            Clocked(
                at=datetime(2026, 1, 1, tzinfo=UTC),
                history=[
                    {},
                    {"a": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=1, seconds=1)))},
                ],
            ),
            "payload.history[1].a: the offset +01:00:01 of",
        ),
    ],
)
def test_a_model_datetime_whose_offset_has_seconds_is_refused_at_send(
    model: Clocked, message: str
) -> None:
    assert message in refused(model)
    with pytest.raises(SerializationError) as info:
        sent({"inside": model})
    assert message.replace("payload", "payload.inside", 1) in str(info.value)


def test_a_model_datetime_with_an_offset_of_minutes_reads_back() -> None:
    round_trip(
        Clocked(
            at=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=5, minutes=45))),
            clock=time(1, tzinfo=UTC),
            history=[{"a": datetime(2026, 1, 1, tzinfo=timezone(-timedelta(hours=3)))}],
        )
    )


class Loosely(pydantic.BaseModel):
    extra: dict[Any, int] = {}
    data: Any = None


def test_a_models_keys_written_alike_are_refused_at_send() -> None:
    assert "payload.extra: keys 1 and '1' are both written" in refused(
        Loosely(extra={1: 0, "1": 1})
    )
    assert "payload.data.k: keys 1 and '1' are both written" in refused(
        Loosely(data={"k": {1: 0, "1": 1}})
    )


# -- pydantic: what pydantic itself does not read back -------------------------------------------


class Odd(pydantic.BaseModel):
    pair: Pair | None = None
    shade: Literal[Shade.DARK] | None = None
    rate: list[Rate] = []
    perm: Perm = Perm.R


class EitherModel(pydantic.BaseModel):
    text_or_id: str | UUID = ""
    id_or_text: UUID | str = ""
    text_or_int: str | int = ""


@dataclass
class Priced:
    price: Decimal


class Loose2(pydantic.BaseModel):
    count: int = 0
    priced: list[Priced] = []


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            Odd(pair=Pair.UNIT),
            "payload.pair: <Pair.UNIT: (1, 1)> (Pair) is written [1,1], which pydantic does not "
            "read back as it: declare Pair in a dataclass, whose codec does",
        ),
        (Odd(shade=Shade.DARK), "payload.shade: <Shade.DARK: 'dark'> (Shade) is written \"dark\""),
        (Odd(rate=[Rate.LOW, Rate.HIGH]), "payload.rate[0]: <Rate.LOW: Decimal('0.5')> (Rate)"),
        (
            EitherModel(text_or_id=str(UUID(int=1))),
            "payload.text_or_id: '00000000-0000-0000-0000-000000000001' (str) is written "
            '"00000000-0000-0000-0000-000000000001", which pydantic reads back as '
            "UUID('00000000-0000-0000-0000-000000000001') (UUID): the declared type is str | UUID",
        ),
        (EitherModel(id_or_text=str(UUID(int=1))), "payload.id_or_text: '00000000-0000-"),
    ],
)
def test_a_model_value_pydantic_would_read_back_otherwise_is_refused_at_send(
    model: pydantic.BaseModel, message: str
) -> None:
    """pydantic writes these and its validation refuses them, or reads another value (in a
    union, the type it finds best for the JSON): every such message was dead, or changed."""
    assert message in refused(model)


def test_model_values_pydantic_reads_back_are_sent() -> None:
    round_trip(Odd(perm=Perm.R | Perm.W))
    round_trip(EitherModel(text_or_id=UUID(int=1), id_or_text="x", text_or_int="1"))
    round_trip(EitherModel(text_or_id="x", id_or_text=UUID(int=1), text_or_int=1))


def test_a_model_value_not_of_its_fields_type_is_refused_at_send() -> None:
    """A value set after validation, or inside a dataclass (which pydantic does not validate
    again): pydantic wrote it with a warning, and read it back as another value or not at all."""
    loose = Loose2()
    loose.count = "many"  # type: ignore[assignment]
    assert "payload: PydanticSerializationError: Pydantic serializer warnings:" in refused(loose)
    assert "input_value='many'" in refused(loose)
    assert "input_value=0.1" in refused(Loose2(priced=[Priced(0.1)]))  # type: ignore[arg-type]


# -- a model inside a dataclass, and a dataclass inside a model ---------------------------------


@dataclass
class Envelope:
    order: Aliased
    at: datetime
    tags: dict[UUID, Shade] = field(default_factory=dict)


class Wrapper(pydantic.BaseModel):
    envelope: Envelope | None = None
    maybe: int | None | None = None


def test_models_and_dataclasses_inside_each_other_read_back() -> None:
    envelope = Envelope(
        Aliased(orderId=uuid4(), lines=[Line(skuCode="\x00", unitPrice=Decimal(1))]),
        datetime(2026, 1, 1, tzinfo=UTC),
        {UUID(int=3): Shade.LIGHT},
    )
    round_trip(envelope)
    assert json.loads(sent(envelope))["order"]["lines"] == [{"skuCode": "\x00", "unitPrice": "1"}]
    round_trip(Wrapper(envelope=envelope, maybe=None))
