"""Generated payload types and values for the typed-payload property tests (Hypothesis).

`payload_types(...)` draws a dataclass (or a pydantic model: plain, strict, with field aliases)
made of the field types the codec supports: scalars, Enums of any value (tuples, Decimals, a
Flag), Literals of values and of Enum members, unions (`int | str`, `datetime | date`...), Any,
`list`, `tuple`, `set`, `dict`, `OrderedDict` and `Counter` with keys of every supported key
type, `X | None`, a union of a mapping and a list, nested dataclasses (or models, and models
inside dataclasses and the other way round); `payloads(...)` draws one such type and an
instance of it. With `hostile=True` the values and keys also include what send must refuse, or
at least never write in a form the reader refuses or reads as another value: values and keys of
another type than declared (a bool for an int, a datetime for a date, a UUID's text for a UUID,
an int a float rounds or cannot hold), values a union's earlier type reads (a UUID in
`str | UUID`), Enum members written alike, NaN and infinities (Decimal ones too), naive
datetimes and offsets of seconds, keys two types of a union read alike, plain keys json.dumps
writes alike, lone surrogates, sets.

The property every test checks (`round_trip`): what a `Topic` accepts decodes, through the
same Topic, to a value equal to the one sent; or the Topic refuses it with a
`SerializationError` naming the place (`payload...`) before anything is written.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from hypothesis import event
from hypothesis import strategies as st

from outbox import JsonSerializer, SerializationError, Topic
from outbox.core.codecs import is_model
from outbox.core.serializers import encode_payload, read_payload


class Hue(enum.Enum):
    """Values of every JSON scalar type, each with its own key text."""

    RED = "red"
    TWO = 2
    HALF = 2.5
    YES = True


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 10


class Clash(enum.Enum):
    """Two members whose values are written as the same key text ('1')."""

    TEXT = "1"
    NUMBER = 1


class Pair(enum.Enum):
    """Values JSON writes as arrays: read back by what they are written as."""

    ORIGIN = (0, 0)
    UNIT = (1, "a")


class Rate(enum.Enum):
    """Decimal values, written as their text."""

    LOW = Decimal("0.5")
    HIGH = Decimal("1E+2")


class Shade(enum.Enum):
    DARK = "dark"
    LIGHT = "light"


class Perm(enum.Flag):
    """A Flag: a combination of members is a value too."""

    R = 1
    W = 2


class Twice(enum.Enum):
    """Two members written alike ("1.5"): the second reads back as the first."""

    TEXT = "1.5"
    NUMBER = Decimal("1.5")


class Huge(int):
    """An int too long for decimal text (Python refuses more than 4,300 digits), printed short."""

    def __repr__(self) -> str:
        return "Huge(10**5000)"


#: Offsets of whole minutes; pydantic writes an offset of seconds without them (another instant).
MINUTES = [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))]
ZONES = st.sampled_from([*MINUTES, timezone(timedelta(seconds=30))])
#: Text without lone surrogates (which UTF-8 cannot carry: see `hostile_text`), NUL included.
text = st.text(st.characters(exclude_categories=["Cs"]) | st.sampled_from(["\x00", "€"]))
hostile_text = st.text(st.characters(exclude_categories=()) | st.sampled_from(["\ud800"]))
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
#: Decimals send writes (its digits): infinities and NaN are refused.
finite_decimals = st.decimals(allow_nan=False, allow_infinity=False)
#: Any Decimal a key may be (a signalling NaN cannot be hashed).
key_decimals = st.decimals().filter(lambda d: not d.is_snan())
big_ints = st.integers() | st.sampled_from([10**30, -(10**30), 2**63, 10**4000])


@dataclass(frozen=True)
class Typed:
    """A field type and the values that belong to it."""

    annotation: Any
    values: st.SearchStrategy[Any]
    shown: str

    def __repr__(self) -> str:
        return self.shown


def _typed(annotation: Any, values: st.SearchStrategy[Any], shown: str | None = None) -> Typed:
    return Typed(annotation, values, shown or getattr(annotation, "__name__", repr(annotation)))


LITERAL = Literal["a", 1, None, False]
literals = st.sampled_from(["a", 1, None, False])
SHADE = Literal[Shade.DARK, "x", 0]


@dataclass(frozen=True)
class Grammar:
    keys: list[Typed]
    leaves: list[Typed]


#: The values of a field declared Any: JSON whose keys are text (read back as written).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite_floats | text,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(text, inner, max_size=2),
    max_leaves=4,
)
#: Dicts json.dumps writes with two keys alike: one would be lost.
keys_alike = st.sampled_from([{1: 0, "1": 1}, {"k": [{True: 0, "true": 1}]}, {None: 0, "null": 1}])
#: Text a UUID field reads as a UUID.
uuid_text = st.uuids().map(str)


def grammar(*, hostile: bool, models: bool) -> Grammar:
    """The key types and the value types to build payload types of."""
    zones = st.sampled_from(MINUTES) if models and not hostile else ZONES
    aware = st.datetimes(timezones=zones)
    times = st.times(timezones=st.none() | zones)
    keys = [  # each key of which reads back as itself
        _typed(int, big_ints),
        _typed(float, finite_floats),
        _typed(bool, st.booleans()),
        _typed(Decimal, finite_decimals),
        _typed(UUID, st.uuids()),
        _typed(date, st.dates()),
        _typed(datetime, aware),
        _typed(time, times),
        _typed(bytes, st.binary(max_size=6)),
        _typed(Hue, st.sampled_from(Hue)),
        _typed(Level, st.sampled_from(Level)),
        _typed(LITERAL, literals, "Literal['a', 1, None, False]"),
        _typed(Literal["x", "y"], st.sampled_from(["x", "y"]), "Literal['x', 'y']"),
        _typed(str, text),
        _typed(int | None, st.none() | st.integers(), "int | None"),
        _typed(date | int, st.dates() | st.integers(), "date | int"),
        _typed(bool | int, st.booleans() | st.integers(), "bool | int"),
        _typed(UUID | bool, st.uuids() | st.booleans(), "UUID | bool"),
    ]
    leaves = [
        _typed(int, big_ints),
        _typed(float, finite_floats),
        _typed(bool, st.booleans()),
        _typed(str, text),
        _typed(Decimal, finite_decimals),
        _typed(UUID, st.uuids()),
        _typed(date, st.dates()),
        _typed(datetime, aware),
        _typed(time, times),
        _typed(bytes, st.binary(max_size=6)),
        _typed(Hue, st.sampled_from(Hue)),
        _typed(LITERAL, literals, "Literal['a', 1, None, False]"),
        _typed(Perm, st.sampled_from([Perm.R, Perm.W, Perm.R | Perm.W])),
        _typed(int | str, st.integers() | text, "int | str"),
        _typed(datetime | date, aware | st.dates(), "datetime | date"),
        _typed(UUID | int | None, st.uuids() | st.integers() | st.none(), "UUID | int | None"),
        _typed(Any, json_values),
    ]
    if not models:  # pydantic does not read these back: refused at send (below)
        leaves += [
            _typed(Pair, st.sampled_from(Pair)),
            _typed(Rate, st.sampled_from(Rate)),
            _typed(SHADE, st.sampled_from([Shade.DARK, "x", 0]), "Literal[Shade.DARK, 'x', 0]"),
        ]
    if not hostile:
        return Grammar(keys, leaves)
    naive_or_aware = st.datetimes(timezones=st.none() | zones)
    keys += [  # keys some of which send must refuse
        _typed(int, big_ints | st.booleans() | st.floats() | text | st.just(Huge(10**5000))),
        _typed(float, st.floats() | st.integers()),
        _typed(Decimal, key_decimals | finite_floats | st.integers()),
        _typed(date, st.dates() | naive_or_aware),
        _typed(datetime, naive_or_aware),
        _typed(str, hostile_text | st.integers() | st.booleans()),
        _typed(Literal["x", "y"], st.sampled_from(["x", "y", "z", 1]), "Literal['x', 'y']"),
        _typed(int | str, st.integers() | st.text("0123456789-.", max_size=3), "int | str"),
        _typed(str | int, st.integers() | st.text("0123456789-", max_size=3), "str | int"),
        _typed(float | int, st.integers() | finite_floats, "float | int"),
        _typed(Decimal | int, st.integers() | key_decimals, "Decimal | int"),
        _typed(bool, st.booleans() | st.integers(0, 1)),
        _typed(Clash, st.sampled_from(Clash)),
        _typed(Hue, st.sampled_from(Hue) | st.sampled_from(["red", 2, 2.5, True])),
        _typed(Literal["1", 1], st.sampled_from(["1", 1]), "Literal['1', 1]"),
    ]
    leaves += [  # values some of which send must refuse
        _typed(float, st.floats() | st.integers() | st.sampled_from([10**309, 2**53 + 1, True])),
        _typed(int, big_ints | st.booleans() | finite_floats),
        _typed(bool, st.booleans() | st.integers(0, 1)),
        _typed(str, hostile_text | st.integers() | uuid_text),
        _typed(UUID, st.uuids() | uuid_text),
        _typed(date, st.dates() | naive_or_aware),
        _typed(datetime, naive_or_aware),
        _typed(Decimal, st.decimals() | finite_floats | st.integers()),
        _typed(frozenset[int], st.frozensets(st.integers(), max_size=2), "frozenset[int]"),
        _typed(str | UUID, text | st.uuids() | uuid_text, "str | UUID"),
        _typed(UUID | str, text | st.uuids() | uuid_text, "UUID | str"),
        _typed(str | int, text | st.integers() | st.text("0123456789", max_size=2), "str | int"),
        _typed(date | datetime, st.dates() | naive_or_aware, "date | datetime"),
        _typed(int | float, st.integers() | st.floats(), "int | float"),
        _typed(float | int, st.integers() | finite_floats, "float | int"),
        _typed(Pair, st.sampled_from(Pair) | st.sampled_from([(0, 0), [0, 0]])),
        _typed(Rate, st.sampled_from(Rate)),
        _typed(Twice, st.sampled_from(Twice)),
        _typed(SHADE, st.sampled_from([Shade.DARK, Shade.LIGHT, "x", "dark", 0, False])),
        _typed(Any, json_values | keys_alike),
    ]
    return Grammar(keys, leaves)


_names = itertools.count()


def _containers(
    inner: st.SearchStrategy[Typed],
    keys: list[Typed],
    record: Callable[[list[Typed]], st.SearchStrategy[Typed]],
) -> st.SearchStrategy[Typed]:
    def listed(t: Typed) -> Typed:
        return _typed(list[t.annotation], st.lists(t.values, max_size=3), f"list[{t}]")

    def variadic(t: Typed) -> Typed:
        return _typed(
            tuple[t.annotation, ...], st.lists(t.values, max_size=3).map(tuple), f"tuple[{t}, ...]"
        )

    def pair(ts: tuple[Typed, Typed]) -> Typed:
        a, b = ts
        return _typed(
            tuple[a.annotation, b.annotation], st.tuples(a.values, b.values), f"tuple[{a}, {b}]"
        )

    def mapping(kv: tuple[Typed, Typed]) -> Typed:
        k, v = kv
        return _typed(
            dict[k.annotation, v.annotation],
            st.dictionaries(k.values, v.values, max_size=3),
            f"dict[{k}, {v}]",
        )

    def optional(t: Typed) -> Typed:
        return _typed(t.annotation | None, st.none() | t.values, f"{t} | None")

    def either(kv: tuple[Typed, Typed]) -> Typed:
        # A mapping or a list: a JSON object or an array, which the reader tells apart.
        k, v = kv
        return _typed(
            dict[k.annotation, v.annotation] | list[v.annotation],
            st.dictionaries(k.values, v.values, max_size=2) | st.lists(v.values, max_size=2),
            f"dict[{k}, {v}] | list[{v}]",
        )

    def ordered(kv: tuple[Typed, Typed]) -> Typed:
        k, v = kv
        return _typed(
            OrderedDict[k.annotation, v.annotation],
            st.dictionaries(k.values, v.values, max_size=3).map(OrderedDict),
            f"OrderedDict[{k}, {v}]",
        )

    def counter(k: Typed) -> Typed:
        return _typed(
            Counter[k.annotation],
            st.dictionaries(k.values, st.integers(), max_size=3).map(Counter),
            f"Counter[{k}]",
        )

    def bag(k: Typed) -> Typed:  # keys are hashable: a set of them
        return _typed(set[k.annotation], st.sets(k.values, max_size=3), f"set[{k}]")

    key = st.sampled_from(keys)
    return st.one_of(
        inner.map(listed),
        inner.map(variadic),
        st.tuples(inner, inner).map(pair),
        st.tuples(key, inner).map(mapping),
        st.tuples(key, inner).map(mapping),
        inner.map(optional),
        st.tuples(key, inner).map(either),
        st.tuples(key, inner).map(ordered),
        key.map(counter),
        key.map(bag),
        st.lists(inner, min_size=1, max_size=3).flatmap(record),
    )


def _dataclass(fields: list[Typed]) -> st.SearchStrategy[Typed]:
    names = [f"f{i}" for i in range(len(fields))]
    cls = dataclasses.make_dataclass(
        f"Generated{next(_names)}", [(n, f.annotation) for n, f in zip(names, fields, strict=True)]
    )
    values = st.builds(cls, **{n: f.values for n, f in zip(names, fields, strict=True)})
    return st.just(_typed(cls, values, f"{cls.__name__}({', '.join(map(repr, fields))})"))


#: Model configurations: plain, strict (its Python mode refuses a UUID's text), field aliases
#: (written by alias, read by alias or by name), both.
CONFIGS: list[dict[str, Any]] = [
    {},
    {"strict": True},
    {"alias_generator": str.upper},
    {"strict": True, "alias_generator": lambda name: f"the-{name}"},
]


def _model(fields: list[Typed]) -> st.SearchStrategy[Typed]:
    return st.sampled_from(CONFIGS).map(lambda config: _made_model(fields, config))


def _made_model(fields: list[Typed], config: dict[str, Any]) -> Typed:
    import pydantic

    names = [f"f{i}" for i in range(len(fields))]
    cls = pydantic.create_model(
        f"GeneratedModel{next(_names)}",
        __config__=pydantic.ConfigDict(**config),
        **{n: (f.annotation, ...) for n, f in zip(names, fields, strict=True)},
    )

    def build(values: dict[str, Any]) -> Any:
        try:
            return cls.model_validate(values, by_name=True)
        except pydantic.ValidationError:  # pydantic refuses the value itself: not this test's
            return _NOT_BUILT

    values = st.fixed_dictionaries({n: f.values for n, f in zip(names, fields, strict=True)})
    built = values.map(build).filter(lambda v: v is not _NOT_BUILT)
    shown = ", ".join(map(repr, fields))
    return _typed(cls, built, f"{cls.__name__}{config or ''}({shown})")


def _either_record(fields: list[Typed]) -> st.SearchStrategy[Typed]:
    """A dataclass or a model: a model inside a dataclass, a dataclass inside a model."""
    return _dataclass(fields) | _model(fields)


_NOT_BUILT = object()


def field_types(*, hostile: bool = False, models: bool = False) -> st.SearchStrategy[Typed]:
    types = grammar(hostile=hostile, models=models)
    # Nested records of the other kind too, except in the dataclasses every value of which must
    # read back (a model does not read back some of their values: an offset of seconds).
    record = _either_record if hostile or models else _dataclass
    return st.recursive(
        st.sampled_from(types.leaves),
        lambda inner: _containers(inner, types.keys, record),
        max_leaves=6,
    )


def payload_types(*, hostile: bool = False, models: bool = False) -> st.SearchStrategy[Typed]:
    """A generated dataclass (or pydantic model) and the instances of it."""
    record = _model if models else _dataclass
    return st.lists(field_types(hostile=hostile, models=models), min_size=1, max_size=4).flatmap(
        record
    )


def payloads(*, hostile: bool = False, models: bool = False) -> st.SearchStrategy[Any]:
    """(payload type, an instance of it)."""
    return payload_types(hostile=hostile, models=models).flatmap(
        lambda t: st.tuples(st.just(t.annotation), t.values)
    )


# -- the property -----------------------------------------------------------------------------

serializer = JsonSerializer()


@dataclass(frozen=True)
class Refused:
    """What send said, refusing a payload."""

    message: str


def encode(topic: Topic[Any], payload: Any) -> tuple[bytes, str] | Refused:
    """What send writes for `payload` (as `Broker.send` encodes it), or its refusal."""
    topic.check(payload)
    try:
        return encode_payload(payload, serializer)
    except SerializationError as exc:
        message = str(exc)
        assert message.startswith("payload"), message  # it names the place
        return Refused(message)


def read(topic: Topic[Any], data: bytes, content_type: str) -> Any:
    """What a handler of `topic` gets for the encoded payload: any error here is the defect."""
    assert topic.payload is not None
    return read_payload(topic.payload, data, content_type, serializer)


def round_trip(payload_type: type[Any], payload: Any) -> Any:
    """The payload read back, or `Refused`; fails if the reader refuses what send wrote or reads
    another value."""
    topic = Topic("generated", payload_type)
    encoded = encode(topic, payload)
    if isinstance(encoded, Refused):
        event("refused at send")
        return encoded
    event("read back")
    back = read(topic, *encoded)
    assert back == payload, (back, payload)
    assert type(back) is type(payload)
    if is_model(payload_type):
        assert back.model_dump() == payload.model_dump()
    return back
