"""Typed payloads: how values JSON has no type for are encoded, and how a decoded JSON value
becomes the payload type a handler declared.

Encoding (`to_json`, the `default` hook of `JsonSerializer`): UUID -> its text; datetime WITH
a zone -> ISO 8601 (a naive datetime is refused: read elsewhere, it would mean another instant);
date and time -> ISO 8601; Decimal -> a string (a JSON number would be read back as a float and
lose digits; infinities and NaN are refused, as a float's are); Enum -> its value; dataclass ->
an object of its fields; pydantic model -> `model_dump(mode="json", by_alias=True)`; bytes
inside a payload -> a standard base64 string. A set is refused (its order is not defined: send
a sorted list), unless a dataclass field declares a set (then an array, sorted when its items
compare). Anything else is refused with its path, e.g. `payload.items[2].price: object of type
Foo is not JSON-encodable`; so are two keys of a dict json.dumps writes as one text
(`plain_problem`) and a lone surrogate, which UTF-8 cannot carry.

What send accepts reads back, through the handler of the same Topic, as the value sent (issue
31). A dataclass's values are written by their declared types: a value of another type that
the reader would refuse or read back as another value is refused, naming the field (`True` in
an `int` field, a datetime in a `date` field, an int a `float` would round, a UUID in a
`str | UUID` field, which the reader, taking the first type of a union that accepts the text,
would read back as a str; a subclass of a dataclass where the dataclass is declared). A
pydantic model is checked by its declared types for what pydantic writes and does not read back
(offsets of seconds, Enums of tuple values, union values it reads as another type, values not of
their field's type), and refused when its Topic is declared if it would refuse what it writes.

Mapping keys (JSON object keys are text): a key is written as json.dumps writes it (int
`"1"`, float by `repr`, `"true"`/`"false"`, `"null"`) or as its value is written (Decimal,
UUID, datetime, date, time, bytes, an Enum by its value). A dataclass field's keys are read back
by their declared type (`dict[int, str]` gives int keys), so a dataclass declaring keys that
are not text is checked when it is encoded: each key must read back as itself (a NaN, a naive
datetime, `True` for an int, `"1"` for `int | str` are refused, naming the field); a key type
with no text form (`tuple[int, int]`) is refused when the `Topic` is declared or the handler
registered. A pydantic model with such keys is checked by its own validation when it is
encoded: what it writes must read back with the same keys.

Decoding (`decoder(type)`, `json_reader(type)`): a pydantic model by its own validation in
pydantic's JSON mode (`model_validate_json`, the counterpart of `model_dump(mode="json")`: a
strict model reads back too), by alias or by field name (its own config decides extra fields:
pydantic ignores them by default); a dataclass by outbox's own converter, with or
without pydantic installed, so that a message reads the same everywhere: fields by name,
unknown fields ignored, defaults for missing optional fields, nested dataclasses, and
UUID/datetime/date/time/Decimal/Enum/bytes converted back from their encoding above, mapping
keys too.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import enum
import functools
import json
import math
import re
import sys
import types
import typing
from collections import Counter, OrderedDict, abc, defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timezone
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID

from outbox.core.errors import ConfigurationError

__all__ = [
    "PayloadInvalid",
    "check_payload_type",
    "decoder",
    "describe_unencodable",
    "is_model",
    "json_reader",
    "json_schema",
    "prepare",
    "to_json",
    "type_name",
]


class PayloadInvalid(ValueError):
    """A decoded payload does not match the declared payload type."""


def is_model(value_type: object) -> bool:
    """True for a pydantic v2 `BaseModel` subclass (pydantic is only imported if it already is:
    a model class cannot exist without it)."""
    module = sys.modules.get("pydantic")
    return (
        module is not None
        and isinstance(value_type, type)
        and issubclass(value_type, module.BaseModel)
    )


def type_name(value_type: object) -> str:
    """A type's name for messages: `module.Qualname` for classes."""
    if isinstance(value_type, type):
        return value_type.__qualname__
    return repr(value_type)


def check_payload_type(payload_type: object, what: str) -> type[Any] | None:
    """`payload_type` if outbox can encode and decode it (None, a dataclass, a pydantic v2
    model), else `ConfigurationError` naming `what`."""
    if payload_type is None:
        return None
    if isinstance(payload_type, type) and (
        dataclasses.is_dataclass(payload_type) or is_model(payload_type)
    ):
        return payload_type
    raise ConfigurationError(
        f"{what}: payload type must be a dataclass or a pydantic v2 BaseModel subclass "
        f"(or None for any JSON value), got {payload_type!r}"
    )


# -- encoding --------------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """The JSON-native value for one object `json` cannot encode itself; `TypeError` if none.

    Called by `json.dumps(default=...)` only for such objects, so plain payloads pay nothing.
    """
    plan = _plans.get(type(value))
    if plan is not None:  # a dataclass written before: the most frequent payload, first
        return _write_fields(value, plan)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise TypeError(
                "a naive datetime (no time zone) is refused in JSON: another reader would take "
                "it for its own local time; give it a zone (datetime.now(timezone.utc))"
            )
        return value.isoformat()
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise TypeError(f"{value!r} is {_NOT_A_DECIMAL}")
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _write_fields(value, _plan(type(value)))
    if is_model(type(value)):
        # warnings="error": a value pydantic would write though it is not of its field's type
        # (set after validation, or inside a dataclass) is refused, not read back changed
        dumped = value.model_dump(mode="json", by_alias=True, warnings="error")
        check = _model_check(type(value))
        if check is not None:
            check(value, dumped)
        return dumped
    if isinstance(value, set | frozenset):
        raise TypeError(
            f"a {type(value).__name__} is refused in JSON: its order is not defined; send a "
            "list (sorted(...))"
        )
    raise TypeError(f"object of type {type(value).__qualname__} is not JSON-encodable")


def describe_unencodable(payload: Any, otherwise: str | None = None) -> str:
    """Where and why `payload` cannot be JSON-encoded: `payload.items[2].price: ...` (a lone
    surrogate in a string or a key too, which UTF-8 cannot carry); `otherwise` if no reason is
    found.

    Walks the value the way `json.dumps(default=to_json)` does; called only after that failed.
    """
    try:
        found = _find(payload, "payload", set())
    except RecursionError:
        found = None
    if found is None:
        return otherwise or f"payload of type {type(payload).__qualname__} cannot be JSON-encoded"
    return f"{found[0]}: {found[1]}"


def _surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in `text` (which UTF-8 cannot encode), or None."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _find(value: Any, path: str, seen: set[int]) -> tuple[str, str] | None:
    """The path of the first value inside `value` that cannot be written, and why."""
    if isinstance(value, str):
        position = _surrogate(value)
        if position is None:
            return None
        return path, (
            f"a string that is not valid Unicode (a lone surrogate at position {position}), which "
            "JSON in UTF-8 cannot carry: use bytes for binary data"
        )
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (path, _long_int(value)) if _too_long(value) else None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return path, f"{value!r} is {_NOT_A_NUMBER}"
    if isinstance(value, dict | list | tuple):
        if id(value) in seen:
            return path, "circular reference"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                for k, item in value.items():
                    if not (k is None or isinstance(k, str | int | float | bool)):
                        return path, (
                            f"key {_shown(k)} of type {type(k).__qualname__} is refused "
                            "(object keys must be str, int, float, bool or None)"
                        )
                    if isinstance(k, float) and not math.isfinite(k):
                        return path, f"key {k!r} is {_NOT_A_NUMBER}"
                    position = _surrogate(k) if isinstance(k, str) else None
                    if position is not None:
                        return path, (
                            f"key {_shown(k)} is not valid Unicode (a lone surrogate at position "
                            f"{position}), which JSON in UTF-8 cannot carry"
                        )
                    if isinstance(k, int) and not isinstance(k, bool) and _too_long(k):
                        return path, f"key {_shown(k)} {_long()}"
                    found = _find(
                        item, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k!r}]", seen
                    )
                    if found:
                        return found
            else:
                for index, item in enumerate(value):
                    found = _find(item, f"{path}[{index}]", seen)
                    if found:
                        return found
        finally:
            seen.discard(id(value))
        return None
    try:
        converted = to_json(value)
    except _Refused as exc:
        return f"{path}{exc.where}", exc.reason
    except TypeError as exc:
        return path, str(exc)
    except Exception as exc:  # a model_dump that raises: its own error
        return path, f"{type(exc).__name__}: {exc}"
    if converted is value:
        return None
    if id(value) in seen:
        return path, "circular reference"
    seen.add(id(value))
    try:
        return _find(converted, path, seen)
    finally:
        seen.discard(id(value))


_NOT_A_NUMBER = "not a JSON number (NaN and infinities are refused)"
_NOT_A_DECIMAL = (
    "refused: a Decimal is written as its digits, and infinities and NaN have none (as a float's "
    "are refused: NaN is not even equal to itself)"
)


def _long() -> str:
    return (
        f"is longer than the {sys.get_int_max_str_digits()} digits Python writes or reads "
        "(sys.set_int_max_str_digits)"
    )


def _too_long(value: int) -> bool:
    """True if an int cannot be written in decimal (more digits than Python converts)."""
    limit = sys.get_int_max_str_digits()
    if not limit or value.bit_length() <= 3 * limit:  # surely writable: no text built
        return False
    try:
        int.__repr__(value)
    except ValueError:
        return True
    return False


def _long_int(value: int) -> str:
    return f"{_shown(value)} {_long()}"


def _shown(value: Any) -> str:
    """`repr(value)` for messages, at most 80 characters (an int too long for decimal text is
    described)."""
    try:
        shown = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        digits = math.floor(math.log10(abs(value))) + 1
        shown = f"<an int of {digits} digits>"
    return shown if len(shown) <= 80 else shown[:77] + "..."


class _Refused(TypeError):
    """A value that `to_json` refuses to write: `reason`, and `where` inside the value that
    raised it (`.counts`, `[2]`), which `describe_unencodable` puts after the path it found."""

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.where = where

    def within(self, segment: str) -> _Refused:
        """The same refusal, one level out (`segment` is the level's own step)."""
        self.where = segment + self.where
        return self

    def __str__(self) -> str:
        return f"{self.where.lstrip('.')}: {self.reason}" if self.where else self.reason


class _TypeRefused(ConfigurationError):
    """A declared type outbox cannot write so that it reads back (a key type with no text
    form, a union a JSON value could be read back as two ways): the dataclass field that
    declares it is put in front."""


# -- decoding --------------------------------------------------------------------------------

Decode = Callable[[Any], Any]
_decoders: dict[Any, Decode] = {}


def decoder(payload_type: type[Any], localns: Mapping[str, Any] | None = None) -> Decode:
    """The function that turns a decoded JSON value into `payload_type` (built once per type,
    then cached); it raises `PayloadInvalid` with a message naming the field. Building it
    resolves a dataclass's annotations, nested ones too (`localns`: names a class defined in a
    function may need), and raises `ConfigurationError` naming the class if one cannot be."""
    found = _decoders.get(payload_type)
    if found is None:
        found = _build(payload_type, localns)
        _decoders[payload_type] = found
    return found


@dataclasses.dataclass
class _Context:
    """What building one decoder (or one encoding) shares: where names resolve, and the
    dataclasses being built (a dataclass that contains itself refers to its own converter,
    late); `declaring`: built for a `Topic` being declared, not for a send."""

    localns: Mapping[str, Any] | None
    building: dict[type[Any], Convert | None] = dataclasses.field(default_factory=dict)
    encoding: set[type[Any]] = dataclasses.field(default_factory=set)
    declaring: bool = False


def _validation(tp: type[Any]) -> Callable[[Any], Any]:
    """A model's validation as its handler runs it, of a decoded JSON value: in pydantic's JSON
    mode, the counterpart of `model_dump(mode="json")` (a strict model reads its UUIDs and
    datetimes from their text, which its Python mode refuses), so the value is written back to
    JSON text first (`json_reader` validates the stored bytes themselves); fields by alias (as
    `to_json` writes them) or by name (as outbox wrote them before, and a message may still be
    stored). A value JSON cannot hold (a serializer other than JSON may give one) is validated
    in Python mode."""
    from_json = _json_validation(tp)
    validate: Callable[..., Any] = getattr(tp, "model_validate")  # noqa: B009 - Any

    def validation(data: Any) -> Any:
        try:
            text = _TEXT.encode(data)
        except (TypeError, ValueError):
            return validate(data, by_alias=True, by_name=True)
        return from_json(text)

    return validation


_TEXT = json.JSONEncoder(separators=(",", ":"))


def _json_validation(tp: type[Any]) -> Callable[[str | bytes], Any]:
    validate: Callable[..., Any] = getattr(tp, "model_validate_json")  # noqa: B009 - Any
    return functools.partial(validate, by_alias=True, by_name=True)


_json_readers: dict[type[Any], Callable[[bytes], Any] | None] = {}


def json_reader(payload_type: type[Any]) -> Callable[[bytes], Any] | None:
    """For a pydantic model, the function that validates a stored JSON payload, its bytes, as
    its handler does (`PayloadInvalid` naming the fields, or what a validator raises); None
    for other types, which are decoded first (`decoder`)."""
    found = _json_readers.get(payload_type, _MISSING)
    if found is not _MISSING:
        return found  # type: ignore[no-any-return]
    reader = None
    if is_model(payload_type):
        validate = _json_validation(payload_type)

        def reader(data: bytes) -> Any:
            try:
                return validate(data)
            except ValueError as exc:  # pydantic's ValidationError, whose text names the model
                raise PayloadInvalid(str(exc)) from exc

    _json_readers[payload_type] = reader
    return reader


def _build(payload_type: type[Any], localns: Mapping[str, Any] | None) -> Decode:
    if is_model(payload_type):
        validate = _validation(payload_type)

        def from_model(data: Any) -> Any:
            try:
                return validate(data)
            except ValueError as exc:  # pydantic's ValidationError, whose text names the model
                raise PayloadInvalid(str(exc)) from exc

        return from_model
    convert = _converter(payload_type, _Context(localns))

    def from_value(data: Any) -> Any:
        return convert(data, "payload")

    return from_value


Convert = Callable[[Any, str], Any]
_SEQUENCES = {
    list,
    tuple,
    set,
    frozenset,
    abc.Sequence,
    abc.MutableSequence,
    abc.Iterable,
    abc.Collection,
    abc.Set,
    abc.MutableSet,
}
#: The mapping annotations the reader reads a JSON object as, each with what it builds.
_MAPPINGS: dict[Any, Callable[[Any], Any]] = {
    dict: dict,
    abc.Mapping: dict,
    abc.MutableMapping: dict,
    OrderedDict: OrderedDict,
    Counter: Counter,
}


def _mapping(tp: Any) -> tuple[Any, Any, Callable[[Any], Any] | None] | None:
    """For a mapping annotation, bare or with arguments: its key type, its value type and what
    the reader builds (None for a defaultdict: its default_factory is not written); None for
    other annotations."""
    origin = typing.get_origin(tp) or tp
    try:
        build = _MAPPINGS.get(origin)
    except TypeError:  # an unhashable annotation: not a mapping
        return None
    if build is None and origin is not defaultdict:
        return None
    args = typing.get_args(tp)
    key = args[0] if args else Any
    if origin is Counter:
        return key, int, build
    return key, args[1] if len(args) > 1 else Any, build


def _no_default_factory() -> _TypeRefused:
    return _TypeRefused(
        "a defaultdict's default_factory is not written in JSON, so the handler could not read "
        "it back: declare dict[K, V] (and build the defaultdict where it is used)"
    )


def _fail(path: str, expected: str, data: Any) -> PayloadInvalid:
    return PayloadInvalid(f"{path}: expected {expected}, got {type(data).__name__} {_shown(data)}")


def _converter(tp: Any, ctx: _Context) -> Convert:
    """A converter for one annotation; unknown annotations pass the value through unchanged."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return lambda data, path: data
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _converter(args[0], ctx)
    if origin is typing.Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        optional = len(options) < len(args)
        inner = [_converter(a, ctx) for a in options]
        names = " | ".join(type_name(a) for a in args)

        def union(data: Any, path: str) -> Any:
            if data is None and optional:
                return None
            errors = []
            for convert in inner:
                try:
                    return convert(data, path)
                except PayloadInvalid as exc:
                    errors.append(str(exc))
            if len(errors) == 1:
                raise PayloadInvalid(errors[0])
            raise _fail(path, names, data)

        return union
    bare = _BARE.get(tp)
    if bare is not None:
        return _converter(bare, ctx)
    if origin is typing.Literal:
        find = _by_form(args)

        def literal(data: Any, path: str) -> Any:
            found = find(data)
            if found is not _MISSING:
                return found
            for arg in args:  # a serializer other than JSON may give the value itself
                if data is arg:
                    return data
            raise _fail(path, f"one of {args!r}", data)

        return literal
    if origin in _SEQUENCES:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            items = [_converter(a, ctx) for a in args]

            def fixed(data: Any, path: str) -> Any:
                if not isinstance(data, list) or len(data) != len(items):
                    raise _fail(path, f"an array of {len(items)} items", data)
                return tuple(
                    c(d, f"{path}[{i}]") for i, (c, d) in enumerate(zip(items, data, strict=True))
                )

            return fixed
        item = _converter(args[0], ctx) if args else _converter(Any, ctx)
        build: Callable[[list[Any]], Any] = (
            tuple
            if origin is tuple
            else set
            if origin in (set, abc.MutableSet)
            else frozenset
            if origin in (frozenset, abc.Set)
            else list
        )

        def sequence(data: Any, path: str) -> Any:
            if not isinstance(data, list):
                raise _fail(path, "an array", data)
            return build([item(d, f"{path}[{i}]") for i, d in enumerate(data)])

        return sequence
    parts = _mapping(tp)
    if parts is not None:
        key_type, value_type, build_mapping = parts
        if build_mapping is None:
            raise _no_default_factory()
        key = _key_converter(key_type, ctx)
        value = _converter(value_type, ctx)

        def mapping(data: Any, path: str) -> Any:
            if not isinstance(data, dict):
                raise _fail(path, "an object", data)
            result = {key(k, path): value(v, f"{path}.{k}") for k, v in data.items()}
            if len(result) < len(data):  # "1" and "01" for an int: refused, not one dropped
                raise _merged(data, key, path)
            return result if build_mapping is dict else build_mapping(result)

        return mapping
    if origin is not None:
        return _converter(origin, ctx)
    if isinstance(tp, typing.NewType):
        return _converter(tp.__supertype__, ctx)
    if not isinstance(tp, type):
        return lambda data, path: data
    if typing.is_typeddict(tp):
        return _converter(dict[str, Any], ctx)
    if dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp, ctx)
    if is_model(tp):
        validate = _validation(tp)

        def model(data: Any, path: str) -> Any:
            try:
                return validate(data)
            except ValueError as exc:
                raise PayloadInvalid(f"{path}: not a valid {type_name(tp)}: {exc}") from exc

        return model
    return _scalar_converter(tp)


#: The types read from a JSON string, each with its parser.
_PARSERS: dict[type[Any], Callable[[str], Any]] = {
    UUID: UUID,
    datetime: datetime.fromisoformat,
    date: date.fromisoformat,
    time: time.fromisoformat,
    Decimal: Decimal,
    bytes: lambda s: base64.b64decode(s, validate=True),
}


def _scalar_converter(tp: type[Any]) -> Convert:
    name = type_name(tp)
    if tp is bool:

        def boolean(data: Any, path: str) -> Any:
            if isinstance(data, bool):
                return data
            raise _fail(path, "a boolean", data)

        return boolean
    if tp is int:

        def integer(data: Any, path: str) -> Any:
            if isinstance(data, int) and not isinstance(data, bool):
                return data
            raise _fail(path, "an integer", data)

        return integer
    if tp is float:

        def number(data: Any, path: str) -> Any:
            if isinstance(data, int | float) and not isinstance(data, bool):
                try:
                    return float(data)
                except OverflowError:  # an int beyond 1.8e308
                    pass
            raise _fail(path, "a number", data)

        return number
    if tp is str:

        def text(data: Any, path: str) -> Any:
            if isinstance(data, str):
                return data
            raise _fail(path, "a string", data)

        return text
    if issubclass(tp, enum.Enum):
        find = _by_form(list(tp))
        values = ", ".join(repr(m.value) for m in tp)

        def member(data: Any, path: str) -> Any:
            found = find(data)
            if found is not _MISSING:
                return found
            if isinstance(data, tp):  # a serializer other than JSON may give the member
                return data
            try:  # a Flag's combination of members, an Enum's own _missing_
                found = tp(data)
                if _same_form(_written(found)[0], data):
                    return found
            except (ValueError, TypeError, _Refused):
                pass
            raise _fail(path, f"a {name} ({values})", data)

        return member
    for base, parse in _PARSERS.items():
        if issubclass(tp, base) and (base is not date or not issubclass(tp, datetime)):
            return _parsed(tp, base, parse)
    if tp in (type(None),):
        return lambda data, path: data if data is None else _raise(_fail(path, "null", data))

    if issubclass(tp, str | int | float):  # a subclass such as `class Sku(str)`
        base = str if issubclass(tp, str) else int if issubclass(tp, int) else float
        check = _scalar_converter(base)

        def subclass(data: Any, path: str) -> Any:
            try:
                return tp(check(data, path))
            except (TypeError, ValueError) as exc:
                if isinstance(exc, PayloadInvalid):
                    raise
                raise _fail(path, f"a {name} ({exc})", data) from None

        return subclass

    def instance(data: Any, path: str) -> Any:
        if isinstance(data, tp):
            return data
        raise _fail(path, name, data)

    return instance


def _raise(exc: Exception) -> Any:
    raise exc


_MISSING: Any = object()


def _by_form(values: Iterable[Any]) -> Callable[[Any], Any]:
    """A function that finds, among `values` (an Enum's members, a Literal's values), the first
    that is written as the JSON value it is given (`_MISSING` if none): a member of any value
    (a tuple, a Decimal) reads back, and `true` is not taken for 1."""
    table: dict[tuple[str, Any], Any] = {}
    others: list[tuple[Any, Any]] = []  # written as an array or an object
    for value in values:
        try:
            form = _written(value)[0]
        except _Refused:  # cannot be written: refused when sent, never read
            continue
        key = _form_key(form)
        if key is not None:
            table.setdefault(key, value)
        elif not any(_same_form(form, other) for other, _ in others):
            others.append((form, value))

    def find(data: Any) -> Any:
        try:
            key = _form_key(data)
        except TypeError:  # unhashable: not a JSON value
            return _MISSING
        if key is not None:
            return table.get(key, _MISSING)
        for form, value in others:
            if _same_form(form, data):
                return value
        return _MISSING

    return find


def _form_key(form: Any) -> tuple[str, Any] | None:
    """A JSON scalar as a dict key that tells a boolean from a number; None for an array or an
    object (or what JSON does not have)."""
    if form is None:
        return ("null", None)
    if isinstance(form, bool):
        return ("boolean", form)
    if isinstance(form, int | float):
        return ("number", form)
    if isinstance(form, str):
        return ("string", form)
    return None


def _same_form(one: Any, other: Any) -> bool:
    """True if two JSON values are the same JSON (a boolean is not a number)."""
    if isinstance(one, list):
        return (
            isinstance(other, list)
            and len(one) == len(other)
            and all(_same_form(a, b) for a, b in zip(one, other, strict=True))
        )
    if isinstance(one, dict):
        return (
            isinstance(other, dict)
            and one.keys() == other.keys()
            and all(_same_form(item, other[key]) for key, item in one.items())
        )
    try:
        key = _form_key(one)
        return key is not None and key == _form_key(other)
    except TypeError:
        return False


def _parsed(tp: type[Any], base: type[Any], parse: Callable[[str], Any]) -> Convert:
    name = type_name(tp)
    numbers_too = base is Decimal

    def parsed(data: Any, path: str) -> Any:
        if isinstance(data, tp):
            return data
        if numbers_too and isinstance(data, int | float) and not isinstance(data, bool):
            return Decimal(str(data))
        if not isinstance(data, str):
            raise _fail(path, f"a {name} as a string", data)
        try:
            value = parse(data)
        except (ValueError, InvalidOperation, binascii.Error) as exc:
            raise _fail(path, f"a {name} ({exc})" if base is not Decimal else name, data) from None
        if base is datetime and (value.tzinfo is None or value.utcoffset() is None):
            raise _fail(path, "a datetime with a time zone", data)
        return value

    return parsed


def _dataclass_converter(tp: type[Any], ctx: _Context) -> Convert:
    """Fields by name; unknown keys ignored; missing fields take their defaults or fail."""
    if tp in ctx.building:  # a field refers back to a dataclass being built: look it up late
        return lambda data, path: _built(ctx, tp)(data, path)
    ctx.building[tp] = None
    name = type_name(tp)
    required: list[str] = []
    fields = [f for f in dataclasses.fields(tp) if f.init]
    for f in fields:
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    try:
        hints = _resolve(tp, ctx.localns)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the annotations of {tp.__module__}.{tp.__qualname__} "
            f"({type(exc).__name__}: {exc}): outbox converts a payload by its fields' types"
        ) from exc
    converters = {}
    for f in fields:
        try:
            converters[f.name] = _converter(hints.get(f.name, Any), ctx)
        except _TypeRefused as exc:
            raise ConfigurationError(f"{name}.{f.name}: {exc}") from None

    def build(data: Any, path: str) -> Any:
        if not isinstance(data, dict):
            raise _fail(path, f"an object for {name}", data)
        problems = [f"{path}.{f}: {name} field is missing" for f in required if f not in data]
        values = {}
        for key, convert in converters.items():
            if key in data:
                try:
                    values[key] = convert(data[key], f"{path}.{key}")
                except PayloadInvalid as exc:
                    problems.append(str(exc))
        if problems:
            raise PayloadInvalid("; ".join(problems))
        try:
            return tp(**values)
        except (TypeError, ValueError) as exc:  # a __post_init__ that refuses
            raise PayloadInvalid(f"{path}: {name}({exc})") from exc

    ctx.building[tp] = build
    return build


def _built(ctx: _Context, tp: type[Any]) -> Convert:
    convert = ctx.building[tp]
    if convert is None:  # cannot happen: decoding starts once the outer converter is built
        raise RuntimeError(f"the converter of {type_name(tp)} is not built yet")
    return convert


# -- mapping keys ----------------------------------------------------------------------------
#
# A JSON object key is text. A key is written as json.dumps writes it (str; int in decimal;
# float by repr, which reads back exactly; "true"/"false"; "null") or as its value is written
# (Decimal, UUID, datetime, date, time, bytes; an Enum by its value), and read back as the key
# type declared. The writer checks that each key reads back as itself, so what cannot is
# refused before anything is written; the reader refuses keys that are not of their type, and
# two keys read as one ("1" and "01" for an int).

_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_KEY_TYPES = (
    "JSON object keys are text, which outbox reads back as str, int, float, bool, None, "
    "Decimal, UUID, datetime, date, time, bytes, an Enum or a Literal of these, or a union of "
    "them"
)
_hints: dict[type[Any], dict[str, Any]] = {}


def _resolve(tp: type[Any], localns: Mapping[str, Any] | None) -> dict[str, Any]:
    """A dataclass's resolved field annotations (`typing.get_type_hints`), kept once found: the
    encoding uses what a handler's registration or a Topic resolved with local names."""
    found = _hints.get(tp)
    if found is None:
        found = typing.get_type_hints(tp, localns=dict(localns or {}))
        _hints[tp] = found
        _unresolved.discard(tp)
    return found


def _annotation_name(tp: Any) -> str:
    """An annotation as written: `dict[int, str] | None`, `Literal['a', 1]`."""
    if tp is type(None) or tp is None:
        return "None"
    if tp is Ellipsis:
        return "..."
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_annotation_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is typing.Annotated:
        return _annotation_name(args[0])
    if origin is not None:
        base = _annotation_name(origin)
        return f"{base}[{', '.join(_annotation_name(a) for a in args)}]" if args else base
    if isinstance(tp, type):
        return tp.__qualname__
    return str(getattr(tp, "__name__", None) or repr(tp))


def _key_text(key: Any) -> str:
    """The JSON object key `key` is written as; `_Refused` if it has none."""
    if isinstance(key, enum.Enum):
        try:
            return _key_text(key.value)
        except _Refused:
            raise _Refused(
                f"key {_shown(key)}: the value of a {type(key).__qualname__} has no JSON form "
                "as an object key"
            ) from None
    if isinstance(key, str):
        return str.__str__(key)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        if _too_long(key):
            raise _Refused(f"key {_shown(key)} {_long()}")
        return int.__repr__(key)
    if isinstance(key, float):
        if not math.isfinite(key):
            raise _Refused(f"key {key!r} is {_NOT_A_NUMBER}")
        return float.__repr__(key)
    if isinstance(key, Decimal | UUID | date | time | bytes):
        try:
            text: str = to_json(key)
        except TypeError as exc:  # a naive datetime, a Decimal infinity or NaN
            raise _Refused(
                f"key {exc}" if isinstance(key, Decimal) else f"key {_shown(key)}: {exc}"
            ) from None
        return text
    raise _Refused(
        f"key {_shown(key)} of type {type(key).__qualname__} has no JSON form (object keys are "
        "text)"
    )


def _same_key(back: Any, key: Any) -> bool:
    """True if `back`, read from the text of `key`, is `key`: equal, and of the same kind (a
    bool is not an int, a str not a number, a Decimal not a float, although Python finds them
    equal: a reader would get another value)."""
    if isinstance(back, bool) or isinstance(key, bool):
        return isinstance(back, bool) and isinstance(key, bool) and back == key
    if isinstance(back, str) or isinstance(key, str):
        return isinstance(back, str) and isinstance(key, str) and back == key
    if isinstance(back, int | float) or isinstance(key, int | float):
        return isinstance(back, int | float) and isinstance(key, int | float) and back == key
    return bool((isinstance(back, type(key)) or isinstance(key, type(back))) and back == key)


def _key_fail(path: str, key: Any, expected: str) -> PayloadInvalid:
    return PayloadInvalid(f"{path}: key {_shown(key)} is not {expected}")


def _merged(data: dict[Any, Any], key: Convert, path: str) -> PayloadInvalid:
    """The error for two keys of `data` that read as one."""
    seen: dict[Any, Any] = {}
    for text in data:
        value = key(text, path)
        first = seen.setdefault(value, text)
        if first is not text:
            return PayloadInvalid(
                f"{path}: keys {_shown(first)} and {_shown(text)} are both read as {_shown(value)}"
            )
    return PayloadInvalid(f"{path}: two keys are read as one")


def _key_table(values: Iterable[Any]) -> dict[str, Any]:
    """{text: value} for the values that have a key text (the first of two with one text)."""
    table: dict[str, Any] = {}
    for value in values:
        with contextlib.suppress(_Refused):  # no text: never read back, refused when written
            table.setdefault(_key_text(value), value)
    return table


def _key_choice(table: Mapping[str, Any], expected: str, value: Convert) -> Convert:
    def choice(key: Any, path: str) -> Any:
        if not isinstance(key, str):
            return value(key, path)
        try:
            return table[key]
        except KeyError:
            raise _key_fail(path, key, expected) from None

    return choice


def _key_converter(tp: Any, ctx: _Context) -> Convert:
    """A converter for the keys of a mapping declared with key type `tp`: text read as `tp` (a
    key of another JSON type, which a serializer other than JSON may give, is converted as a
    value). `_TypeRefused` if `tp` has no text form."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return lambda key, path: key
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _key_converter(args[0], ctx)
    if isinstance(tp, typing.NewType):
        return _key_converter(tp.__supertype__, ctx)
    if origin is typing.Union or origin is types.UnionType:
        arms = [_key_converter(a, ctx) for a in args]
        names = _annotation_name(tp)

        def union(key: Any, path: str) -> Any:
            for arm in arms:
                try:
                    return arm(key, path)
                except PayloadInvalid:
                    pass
            raise _key_fail(path, key, names)

        return union
    if origin is typing.Literal:
        table = _key_table(args)
        return _key_choice(table, f"one of {tuple(table)!r}", _converter(tp, ctx))
    if origin is not None or not isinstance(tp, type):
        raise _TypeRefused(
            f"a dict key of type {_annotation_name(tp)} has no JSON form: {_KEY_TYPES}"
        )
    value = _converter(tp, ctx)
    if tp is type(None):
        return _key_choice({"null": None}, "null", value)
    if issubclass(tp, enum.Enum):
        table = _key_table(tp)
        return _key_choice(table, f"a {tp.__qualname__} ({', '.join(map(repr, table))})", value)
    if tp is bool:
        return _key_choice({"true": True, "false": False}, "true or false", value)
    name = type_name(tp)
    if issubclass(tp, int | float | str):
        pattern: re.Pattern[str] | None
        base: type[Any]
        if issubclass(tp, int):
            pattern, base, expected = _INTEGER, int, "an integer"
        elif issubclass(tp, float):
            pattern, base, expected = _NUMBER, float, "a number"
        else:
            pattern, base, expected = None, str, "a string"

        def scalar(key: Any, path: str) -> Any:
            if not isinstance(key, str):
                return value(key, path)
            if pattern is not None and not pattern.fullmatch(key):
                raise _key_fail(path, key, expected)
            try:
                result = base(key)
                if base is float and not math.isfinite(result):
                    raise ValueError("not finite")
                return result if tp is base else tp(result)
            except (TypeError, ValueError):  # too many digits; a subclass that refuses
                raise _key_fail(path, key, expected if tp is base else f"a {name}") from None

        return scalar
    for base_type, parse in _PARSERS.items():
        if issubclass(tp, base_type) and (base_type is not date or not issubclass(tp, datetime)):
            return _parsed_key(tp, base_type, parse, value)
    raise _TypeRefused(f"a dict key of type {_annotation_name(tp)} has no JSON form: {_KEY_TYPES}")


def _parsed_key(
    tp: type[Any], base: type[Any], parse: Callable[[str], Any], value: Convert
) -> Convert:
    expected = f"a {type_name(tp)}"

    def parsed(key: Any, path: str) -> Any:
        if not isinstance(key, str):
            return value(key, path)
        try:
            result = parse(key)
        except (ValueError, InvalidOperation, binascii.Error):
            raise _key_fail(path, key, expected) from None
        if base is datetime and (result.tzinfo is None or result.utcoffset() is None):
            raise _key_fail(path, key, "a datetime with a time zone")
        return result

    return parsed


def _text_keys(tp: Any) -> bool:
    """True if keys declared `tp` are read back as the very text JSON has: nothing to write
    beyond what json.dumps does (str, a subclass of str, Any, a Literal of strings)."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return True
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _text_keys(args[0])
    if isinstance(tp, typing.NewType):
        return _text_keys(tp.__supertype__)
    if origin is typing.Union or origin is types.UnionType:
        return all(_text_keys(a) for a in args)
    if origin is typing.Literal:
        return all(isinstance(a, str) and not isinstance(a, enum.Enum) for a in args)
    return isinstance(tp, type) and issubclass(tp, str) and not issubclass(tp, enum.Enum)


# -- writing what a dataclass declares ------------------------------------------------------
#
# `to_json` writes a dataclass field by field, each by the writer of its declared type: what the
# handler's converter (above) reads back. A writer is `(exact, write)`: a value whose type is in
# `exact` is written as it is (json.dumps and `to_json` give what the reader reads back as an
# equal value: one set lookup per field, the common case); any other value goes through `write`,
# which returns what to write (a mapping with its keys as text, a set as a list) or raises
# `_Refused` saying why the reader would refuse it or read back another value. What no rule
# below covers is checked by writing it and reading it back with the declared type's converter
# (`_checked`): exact, and paid only by values of another type than declared.

Encode = Callable[[Any], Any]
Writer = tuple[frozenset[type[Any]], Encode]
Plan = tuple[tuple[str, frozenset[type[Any]], Encode], ...]
_plans: dict[type[Any], Plan] = {}
_unresolved: set[type[Any]] = set()
_NONE: type[Any] = type(None)
_JSON_SCALARS: frozenset[type[Any]] = frozenset({str, int, float, bool, _NONE})
#: Types whose exact instances a field declared with that very type writes as they are.
_EXACT: frozenset[type[Any]] = frozenset(
    {bool, int, float, str, _NONE, UUID, datetime, date, time, Decimal, bytes}
)
#: What json.dumps writes as JSON text, for reading back what a writer wrote (`_written`).
_FORM = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=to_json
)


def prepare(payload_type: type[Any] | None, localns: Mapping[str, Any] | None = None) -> None:
    """Build now what encoding `payload_type` needs (a `Topic` does when it is declared), so
    that a type outbox cannot write so that it reads back (a key type with no text form, a
    union of mappings a JSON object cannot tell apart) is a `ConfigurationError` before anything
    is sent. Annotations that cannot be resolved (names local to a function, not in `localns`)
    are left for later: until a handler's registration resolves them, such a dataclass is
    written as json.dumps writes it, unchecked."""
    if payload_type is None:
        return
    if dataclasses.is_dataclass(payload_type):
        if payload_type not in _plans:  # unresolved: the first send tries again
            _build_plan(payload_type, _Context(localns, declaring=True))
    elif is_model(payload_type):
        problem = _model_problem(payload_type)
        if problem is not None:
            raise ConfigurationError(problem)
        _model_check(payload_type)


def _write_fields(value: Any, plan: Plan) -> dict[str, Any]:
    fields = {}
    for name, exact, write in plan:
        item = getattr(value, name)
        if type(item) not in exact:
            try:
                item = write(item)
            except _Refused as exc:
                raise exc.within(f".{name}") from None
        fields[name] = item
    return fields


def _plan(tp: type[Any]) -> Plan:
    """How `to_json` writes the fields of dataclass `tp` (built once, then cached)."""
    found = _plans.get(tp)
    if found is not None:
        return found
    if tp in _unresolved:
        return _loose_plan(tp)
    try:
        return _build_plan(tp, _Context(None))
    except ConfigurationError as exc:
        raise _Refused(str(exc)) from None


def _loose_plan(tp: type[Any]) -> Plan:
    """The fields of a dataclass whose annotations are not known: as json.dumps writes them."""
    return tuple((f.name, _ANY[0], _ANY[1]) for f in dataclasses.fields(tp))


def _build_plan(tp: type[Any], ctx: _Context) -> Plan:
    if tp in ctx.encoding:  # contains itself: built by the outer call, which caches it
        return ()
    ctx.encoding.add(tp)
    try:
        hints = _resolve(tp, ctx.localns)
    except Exception:
        if not ctx.declaring:  # not tried again at each send: until a handler resolves it
            _unresolved.add(tp)
        return _loose_plan(tp)
    plan = []
    for f in dataclasses.fields(tp):
        if not f.init:  # not read back (the reader does not pass it): as json.dumps writes it
            plan.append((f.name, *_ANY))
            continue
        try:
            exact, write = _writer(hints.get(f.name, Any), ctx)
        except _TypeRefused as exc:
            raise ConfigurationError(f"{type_name(tp)}.{f.name}: {exc}") from None
        plan.append((f.name, exact, write))
    found = tuple(plan)
    _plans[tp] = found
    return found


def plain_problem(payload: Any) -> str | None:
    """Where and why json.dumps would lose part of `payload`, a plain JSON value it has just
    written (so not circular): two keys of one dict written as one text (`{1: "a", "1": "b"}`
    is `{"1":"a","1":"b"}`, which a reader reads as one key); None if it would not. Only dicts
    whose keys are not all str are looked at key by key."""
    try:
        if _str_keys(payload):
            return None
    except RecursionError:  # nested deeper than Python recurses: looked at without recursing
        pass
    try:
        _check_plain(payload, circular=False)
    except _Refused as exc:
        return f"payload{exc.where}: {exc.reason}"
    return None


def _str_keys(value: Any) -> bool:
    """True if every dict inside `value` (through dicts, lists and tuples) has only str keys:
    the common case, which cannot lose a key (RecursionError if `value` contains itself)."""
    kind = type(value)
    values: Iterable[Any]
    if kind is dict or (kind is not list and kind is not tuple and isinstance(value, dict)):
        if not _STR.issuperset(map(type, value)):
            return False
        values = value.values()
    elif kind is list or kind is tuple or isinstance(value, list | tuple):
        values = value
    else:
        return True
    if _JSON_SCALARS.issuperset(map(type, values)):
        return True
    for item in values:  # noqa: SIM110 - a loop, not all(...): no generator on the common path
        if type(item) not in _JSON_SCALARS and not _str_keys(item):
            return False
    return True


def _plain(value: Any) -> Any:
    """A value declared Any: `value`, if json.dumps writes no two keys inside it as one."""
    try:
        if _str_keys(value):
            return value
    except RecursionError:  # deeper than Python recurses, or circular: looked at without
        pass
    return _check_plain(value)


def _check_plain(value: Any, circular: bool = True) -> Any:
    """`value`, if json.dumps writes no two keys of a dict inside it as one text, else
    `_Refused` naming that dict. Looks into dicts, lists and tuples only: other objects are
    written by `to_json`, by their own rules. `circular`: `value` may contain itself (then a
    container seen twice is looked at once; json.dumps refuses a circular one)."""
    if type(value) in _JSON_SCALARS:
        return value
    stack: list[tuple[Any, _Link]] = [(value, None)]
    seen: set[int] | None = set() if circular else None
    while stack:
        item, link = stack.pop()
        if seen is not None:
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            if not _STR.issuperset(map(type, item)):
                problem = _alike(item)
                if problem is not None:
                    raise _Refused(problem, _path(link))
            if not _JSON_SCALARS.issuperset(map(type, item.values())):
                for key, inner in item.items():
                    if isinstance(inner, dict | list | tuple):
                        stack.append((inner, (link, key, True)))
        elif isinstance(item, list | tuple) and not _JSON_SCALARS.issuperset(map(type, item)):
            for index, inner in enumerate(item):
                if isinstance(inner, dict | list | tuple):
                    stack.append((inner, (link, index, False)))
    return value


#: Where `_check_plain` is: (the link of the container above, the key or index, a key?).
_Link = tuple[Any, Any, bool] | None


def _path(link: _Link) -> str:
    steps = []
    while link is not None:
        link, step, key = link
        steps.append(
            (f".{step}" if isinstance(step, str) else f"[{step!r}]") if key else f"[{step}]"
        )
    return "".join(reversed(steps))


def _alike(mapping: Mapping[Any, Any]) -> str | None:
    """Why two keys of `mapping` are written as one JSON object key by json.dumps, or None."""
    texts: dict[str, Any] = {}
    for key in mapping:
        text = _dumped_key(key)
        if text is None:  # json.dumps refuses it, naming it
            continue
        first = texts.setdefault(text, key)
        if first is not key:
            return (
                f"keys {_shown(first)} and {_shown(key)} are both written "
                f"{json.dumps(text, ensure_ascii=False)}: one would be lost"
            )
    return None


def _dumped_key(key: Any) -> str | None:
    """The text json.dumps writes a dict key as (None for a key it refuses)."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return None if _too_long(key) else int.__repr__(key)
    if isinstance(key, float):
        return float.__repr__(key) if math.isfinite(key) else None
    return None


#: A value declared Any (or object) is written as json.dumps writes it, and read back as JSON;
#: two keys it would write as one are refused.
_ANY: Writer = (_JSON_SCALARS, _plain)


def _writer(tp: Any, ctx: _Context) -> Writer:
    """How `to_json` writes a value declared `tp` so that the reader reads back an equal value,
    or refuses it (`_Refused`); `_TypeRefused` for a type it cannot write so (built once per
    field, when the dataclass is first written or its Topic declared)."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return _ANY
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _writer(args[0], ctx)
    if isinstance(tp, typing.NewType):
        return _writer(tp.__supertype__, ctx)
    if origin is typing.Union or origin is types.UnionType:
        return _union_writer(tp, ctx)
    if origin is typing.Literal:
        return _literal_writer(tp, ctx)
    bare = _BARE.get(tp)
    if bare is not None:
        return _writer(bare, ctx)
    if origin in _SEQUENCES:
        return _sequence_writer(tp, origin, args, ctx)
    parts = _mapping(tp)
    if parts is not None:
        return _mapping_writer(tp, parts, ctx)
    if origin is not None:
        return _writer(origin, ctx)
    if not isinstance(tp, type):  # the reader takes such a value as it is
        return _ANY
    if typing.is_typeddict(tp):
        return _writer(dict[str, Any], ctx)
    if dataclasses.is_dataclass(tp):
        if tp not in _plans:  # a field type refused now, not at the first send
            _build_plan(tp, ctx)
        return frozenset({tp}), _checked(tp, ctx)  # an instance writes itself, by its own plan
    if is_model(tp):
        problem = _model_problem(tp)
        if problem is not None:
            raise _TypeRefused(problem)
        return frozenset({tp}), _checked(tp, ctx)
    if issubclass(tp, enum.Enum):
        return _enum_writer(tp, ctx)
    if tp is float:
        return _float_writer(ctx)
    if tp is Decimal:  # an int reads back as the equal Decimal
        return frozenset({Decimal, int}), _checked(tp, ctx)
    if tp in _EXACT or (issubclass(tp, str | int | float) and not issubclass(tp, bool)):
        return frozenset({tp}), _checked(tp, ctx)
    return frozenset(), _checked(tp, ctx)


def _checked(tp: Any, ctx: _Context) -> Encode:
    """A writer that writes a value as `to_json` does and reads it back with the converter of
    `tp` (built when first needed): the value if that gives it back, else `_Refused`."""
    declared = _annotation_name(tp)
    localns = ctx.localns
    read: list[Convert] = []

    def check(value: Any) -> Any:
        if not read:
            try:
                read.append(_converter(tp, _Context(localns)))
            except ConfigurationError as exc:
                raise _Refused(str(exc)) from None
        return _read_back(value, value, read[0], declared)

    return check


def _read_back(value: Any, written: Any, read: Convert, declared: str) -> Any:
    """`written` (what is written for `value`) if `read` gives `value` back from its JSON, else
    `_Refused` saying what the reader does with it."""
    form, text = _written(written)
    try:
        back = read(form, "payload")
    except PayloadInvalid:
        raise _Refused(
            f"{_shown(value)} ({type(value).__qualname__}) would be written {text}, which the "
            f"declared type {declared} does not read"
        ) from None
    if not _same_value(back, value):
        raise _Refused(
            f"{_shown(value)} ({type(value).__qualname__}) would be written {text} and read "
            f"back as {_shown(back)} ({type(back).__qualname__}): the declared type is "
            f"{declared}"
        )
    return written


def _written(value: Any) -> tuple[Any, str]:
    """The JSON value a reader gets for `value` (as send writes it), and its text for messages;
    `_Refused` if it cannot be written."""
    try:
        text = _FORM.encode(value)
    except _Refused:
        raise
    except (TypeError, ValueError):
        found = _find(value, "", set())
        if found is None:
            raise _Refused(f"a {type(value).__qualname__} cannot be JSON-encoded") from None
        where, reason = found
        raise _Refused(reason, where) from None
    shown = text if len(text) <= 80 else text[:77] + "..."
    return json.loads(text), shown


def _same_value(back: Any, sent: Any) -> bool:
    """True if `back`, read from what was written for `sent`, is `sent` for the handler: equal,
    and a bool not a number, a str not another type, as Python alone would say. Dataclasses,
    lists, tuples and dicts are compared item by item, so that this holds inside them too (and
    a dataclass declared eq=False, equal only to itself, is compared by its fields)."""
    if back is sent:
        return True
    if isinstance(back, bool) is not isinstance(sent, bool):
        return False
    if isinstance(back, str) is not isinstance(sent, str):
        return False
    if dataclasses.is_dataclass(sent) and not isinstance(sent, type):
        return type(back) is type(sent) and all(
            _same_value(getattr(back, f.name), getattr(sent, f.name))
            for f in dataclasses.fields(sent)
            if f.compare
        )
    if isinstance(sent, list | tuple) and isinstance(back, list | tuple):
        return (
            isinstance(back, list) is isinstance(sent, list)
            and len(back) == len(sent)
            and all(_same_value(a, b) for a, b in zip(back, sent, strict=True))
        )
    if isinstance(sent, Mapping) and isinstance(back, Mapping):
        try:
            return back.keys() == sent.keys() and all(
                _same_value(back[key], item) for key, item in sent.items()
            )
        except Exception:  # keys that do not compare: not the same
            return False
    try:
        return bool(back == sent)
    except Exception:  # a signalling NaN, an __eq__ that raises: not the same
        return False


def _float_writer(ctx: _Context) -> Writer:
    """A float, or an int a float holds exactly (read back as the equal float)."""
    checked = _checked(float, ctx)

    def number(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                if float(value) == value:
                    return value
            except OverflowError:
                pass
        return checked(value)

    return frozenset({float}), number


def _enum_writer(tp: type[enum.Enum], ctx: _Context) -> Writer:
    """A member whose value reads back as that very member; another is refused, naming why (a
    value the reader cannot read, or reads as another member)."""
    read = _converter(tp, ctx)
    declared = type_name(tp)
    refused: dict[Any, _Refused] = {}
    for each in tp:
        try:
            _read_back(each, each, read, declared)
        except _Refused as exc:
            refused[each] = exc
    checked = _checked(tp, ctx)
    if not refused:
        return frozenset({tp}), checked

    def member(value: Any) -> Any:
        if type(value) is tp:
            problem = refused.get(value)
            if problem is None:
                return value
            raise _Refused(problem.reason, problem.where)
        return checked(value)

    return frozenset(), member


def _literal_writer(tp: Any, ctx: _Context) -> Writer:
    """One of the Literal's values that reads back as itself (a value of that very type)."""
    read = _converter(tp, ctx)
    declared = _annotation_name(tp)
    fine: set[tuple[type[Any], Any]] = set()
    for arg in typing.get_args(tp):
        with contextlib.suppress(_Refused):
            _read_back(arg, arg, read, declared)
            fine.add((type(arg), arg))
    checked = _checked(tp, ctx)

    def literal(value: Any) -> Any:
        try:
            if (type(value), value) in fine:
                return value
        except TypeError:  # unhashable: not one of them
            pass
        return checked(value)

    return frozenset(), literal


#: Bare collection annotations, as the reader reads them.
_BARE: dict[Any, Any] = {
    list: list[Any],
    tuple: tuple[Any, ...],
    set: set[Any],
    frozenset: frozenset[Any],
    dict: dict[Any, Any],
}


def _sequence_writer(tp: Any, origin: Any, args: tuple[Any, ...], ctx: _Context) -> Writer:
    checked = _checked(tp, ctx)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        writers = [_writer(a, ctx) for a in args]

        def fixed(value: Any) -> Any:
            if not isinstance(value, tuple) or len(value) != len(writers):
                return checked(value)
            result = []
            for index, ((exact, write), item) in enumerate(zip(writers, value, strict=True)):
                if type(item) not in exact:
                    try:
                        item = write(item)
                    except _Refused as exc:
                        raise exc.within(f"[{index}]") from None
                result.append(item)
            return result

        return frozenset(), fixed
    exact, write = _writer(args[0], ctx) if args else _ANY
    unordered = origin in (set, frozenset, abc.Set, abc.MutableSet)
    accepted: type[Any] | types.UnionType = (
        list
        if origin is list
        else tuple
        if origin is tuple
        else set | frozenset
        if unordered
        else list | tuple  # an abstract Sequence, Iterable, Collection: read back as a list
    )

    def sequence(value: Any) -> Any:
        if not isinstance(value, accepted):
            return checked(value)
        items = _ordered(value) if unordered else value
        if set(map(type, items)) <= exact:
            return items
        result = []
        for index, item in enumerate(items):
            if type(item) not in exact:
                try:
                    item = write(item)
                except _Refused as exc:
                    raise exc.within(f"[{index}]") from None
            result.append(item)
        return result

    return frozenset(), sequence


def _ordered(items: Iterable[Any]) -> list[Any]:
    """A set's items as a list, sorted when they can be (one wire form for one set)."""
    try:
        return sorted(items)
    except (TypeError, ArithmeticError):
        # Items of types that do not compare (or a Decimal NaN, whose comparison signals):
        # in the set's own order.
        return list(items)


def _mapping_writer(
    tp: Any, parts: tuple[Any, Any, Callable[[Any], Any] | None], ctx: _Context
) -> Writer:
    key_type, value_type, build = parts
    if build is None:
        raise _no_default_factory()
    exact, write_item = _writer(value_type, ctx)
    checked = _checked(tp, ctx)
    keys = _plain_keys(key_type)
    write_key: Callable[[Any], str] | None = None
    if keys == "str":
        string = _string_key(key_type)
    elif keys is None:
        write_key = _key_writer(key_type, ctx)

    def mapping(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return checked(value)
        if write_key is None:
            if not set(map(type, value)) <= _STR:
                if keys == "str":
                    for key in value:
                        if not isinstance(key, str):
                            string(key)
                else:  # Any: as json.dumps writes them, two of which must not be one
                    problem = _alike(value)
                    if problem is not None:
                        raise _Refused(problem)
            if isinstance(value, dict) and set(map(type, value.values())) <= exact:
                return value
        result = {}
        for key, item in value.items():
            text = key
            if write_key is not None:
                text = write_key(key)
                if text in result:  # cannot be: each key reads back as itself; never drop one
                    raise _Refused(f"two keys are both written {text!r}")
            if type(item) not in exact:
                try:
                    item = write_item(item)
                except _Refused as exc:
                    raise exc.within(_step(key) if write_key is None else f".{text}") from None
            result[text] = item
        return result

    return frozenset(), mapping


_STR: frozenset[type[Any]] = frozenset({str})


def _plain_keys(tp: Any) -> str | None:
    """How keys declared `tp` are written: as json.dumps writes them, and read as that text, for
    Any ("any"); as they are for str and its subclasses ("str"); else None: by `_key_writer`."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return "any"
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _plain_keys(typing.get_args(tp)[0])
    if isinstance(tp, typing.NewType):
        return _plain_keys(tp.__supertype__)
    if isinstance(tp, type) and issubclass(tp, str) and not issubclass(tp, enum.Enum):
        return "str"
    return None


def _string_key(tp: Any) -> Callable[[Any], str]:
    """A key declared str must be one (an int would be read back as its text)."""
    declared = _annotation_name(tp)

    def string(key: Any) -> str:
        if isinstance(key, str):
            return key
        raise _Refused(
            f"key {_shown(key)} ({type(key).__qualname__}) would be written {_key_text(key)!r} "
            f"and read back as a str: the declared key type is {declared}"
        )

    return string


def _key_writer(tp: Any, ctx: _Context) -> Callable[[Any], str]:
    """The text a key is written as, checked to read back as that very key (`_Refused` if not)."""
    read = _key_converter(tp, ctx)
    declared = _annotation_name(tp)
    plain = tp if tp in (int, str) else None  # their text reads back exactly: no need to check

    def write(key: Any) -> str:
        text = _key_text(key)
        if type(key) is plain:
            return text
        try:
            back = read(text, "")
        except PayloadInvalid:
            raise _Refused(
                f"key {_shown(key)} ({type(key).__qualname__}) would be written {text!r}, "
                f"which the declared key type {declared} does not read"
            ) from None
        if not _same_key(back, key):
            raise _Refused(
                f"key {_shown(key)} ({type(key).__qualname__}) would be written {text!r} and "
                f"read back as {_shown(back)} ({type(back).__qualname__}): the declared key "
                f"type is {declared}"
            )
        return text

    return write


def _union_writer(tp: Any, ctx: _Context) -> Writer:
    """The reader takes the first type of the union that accepts a JSON value (null first when
    the union has None). A value is written by the writer of its own type; if a type before it
    may read JSON of the same kind (`str | UUID`: both strings), what is written is read back
    with the union's converter and refused unless it gives the value back. A union with a
    mapping whose keys are not text is refused if another of its types reads JSON objects too:
    `_TypeRefused`."""
    args = typing.get_args(tp)
    for arm in args:
        if not _keyed(arm):
            continue
        kinds = _json_kinds(arm)
        for other in args:
            if other is not arm and _json_kinds(other) & (kinds | {"any"}):
                raise _TypeRefused(
                    f"{_annotation_name(tp)}: a JSON {'/'.join(sorted(kinds))} could be read "
                    f"back as {_annotation_name(arm)} or as {_annotation_name(other)} (the first "
                    "that accepts it is taken): declare one of them, or two fields"
                )
    optional = _NONE in args
    declared = _annotation_name(tp)
    arms: list[tuple[frozenset[type[Any]], Encode, bool]] = []
    earlier: set[str] = {"null"} if optional else set()
    for arm in args:
        if arm is _NONE:
            continue
        exact, write = _writer(arm, ctx)
        kinds = _json_kinds(arm)
        loose = arm is Any or arm is object or isinstance(arm, typing.TypeVar)
        shared = "any" in earlier or bool(kinds & (earlier | {"any"}))
        arms.append((exact, write, shared and not loose))
        earlier |= kinds
    if len(arms) == 1 and not arms[0][2]:  # X | None: null is read as None, X as X
        ((exact, write, _),) = arms

        def optional_value(value: Any) -> Any:
            return value if value is None else write(value)

        return exact | {_NONE}, optional_value
    by_type: dict[type[Any], int] = {}
    for index, (exact, _, _) in enumerate(arms):
        for t in exact:
            by_type.setdefault(t, index)
    fast = frozenset(t for t, i in by_type.items() if not arms[i][2])
    if optional:
        fast |= {_NONE}
    localns = ctx.localns
    read: list[Convert] = []

    def union(value: Any) -> Any:
        if value is None and optional:
            return None
        own = by_type.get(type(value))
        problems = []
        for exact, write, shared in arms if own is None else arms[own : own + 1]:
            try:
                written = value if type(value) in exact else write(value)
            except _Refused as exc:
                problems.append(exc)
                continue
            if not shared:
                return written
            if not read:
                read.append(_converter(tp, _Context(localns)))
            return _read_back(value, written, read[0], declared)
        if len(problems) == 1:
            raise problems[0]
        raise _Refused(f"{_shown(value)} ({type(value).__qualname__}) is not {declared}")

    return fast, union


def _keyed(tp: Any) -> bool:
    """True if a value declared `tp` is, or holds in its lists and tuples, a mapping whose keys
    are not text (not looking into dataclasses)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _keyed(args[0])
    if isinstance(tp, typing.NewType):
        return _keyed(tp.__supertype__)
    if origin is typing.Union or origin is types.UnionType or origin in _SEQUENCES:
        return any(_keyed(a) for a in args if a is not Ellipsis)
    parts = _mapping(tp)
    if parts is not None:
        return not _text_keys(parts[0]) or _keyed(parts[1])
    return False


_ANY_KIND = frozenset({"any"})


def _json_kinds(tp: Any) -> frozenset[str]:
    """The JSON types a value declared `tp` is read from ({"any"} when not known)."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return _ANY_KIND
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _json_kinds(args[0])
    if isinstance(tp, typing.NewType):
        return _json_kinds(tp.__supertype__)
    if origin is typing.Union or origin is types.UnionType:
        return frozenset().union(*(_json_kinds(a) for a in args))
    if origin is typing.Literal:
        return frozenset().union(*(_value_kinds(a) for a in args))
    if origin in _SEQUENCES:
        return frozenset({"array"})
    if _mapping(tp) is not None:
        return frozenset({"object"})
    if origin is not None:
        return _json_kinds(origin)
    if not isinstance(tp, type):
        return _ANY_KIND
    if tp is type(None):
        return frozenset({"null"})
    if typing.is_typeddict(tp):
        return frozenset({"object"})
    if issubclass(tp, enum.Enum):
        return frozenset().union(*(_value_kinds(m.value) for m in tp)) or _ANY_KIND
    if issubclass(tp, bool):
        return frozenset({"boolean"})
    if issubclass(tp, int | float):
        return frozenset({"number"})
    if issubclass(tp, Decimal):
        return frozenset({"string", "number"})
    if issubclass(tp, str | UUID | date | time | bytes | bytearray):
        return frozenset({"string"})
    if issubclass(tp, list | tuple | set | frozenset):
        return frozenset({"array"})
    if issubclass(tp, dict) or dataclasses.is_dataclass(tp) or is_model(tp):
        return frozenset({"object"})
    return _ANY_KIND


def _value_kinds(value: Any) -> frozenset[str]:
    """The JSON type a Literal's value or an Enum's member is written as."""
    try:
        value = _written(value)[0]
    except _Refused:
        return _ANY_KIND
    if isinstance(value, list):
        return frozenset({"array"})
    if isinstance(value, dict):
        return frozenset({"object"})
    if value is None:
        return frozenset({"null"})
    if isinstance(value, bool):
        return frozenset({"boolean"})
    if isinstance(value, int | float):
        return frozenset({"number"})
    if isinstance(value, str):
        return frozenset({"string"})
    return _ANY_KIND


# -- a model's keys, by its own validation -------------------------------------------------

Check = Callable[[Any, Any], None]
Differ = Callable[[Any, Any], "_Refused | None"]
_model_checks: dict[type[Any], Check | None] = {}


def _model_check(tp: type[Any]) -> Check | None:
    """What `to_json` checks when it writes a pydantic model: for a model that would refuse
    what it writes (`_model_problem`), a check that refuses it; for a model with mappings whose
    keys are not text (nested too), a check that what `model_dump` wrote reads back, by the
    model's own validation (the handler's decoder), with the same keys. None for any other
    model: nothing to check."""
    if tp in _model_checks:
        return _model_checks[tp]
    problem = _model_problem(tp)
    check: Check | None
    if problem is not None:
        check = _refusing(problem)
    else:
        differ = _differ(tp, {}) if _converts_keys(tp, set()) else None
        keys = None if differ is None else _checking(tp, differ)
        walk = _walker(tp, {}, {})
        check = keys if walk is None else _walking(walk, keys)
    if getattr(tp, "__pydantic_complete__", True):  # else its annotations may not be known yet
        _model_checks[tp] = check
    return check


def _walking(walk: Walk, then: Check | None) -> Check:
    def check(value: Any, dumped: Any) -> None:
        walk(value)
        if then is not None:
            then(value, dumped)

    return check


# What pydantic writes that its own validation would read back as another value, found in the
# model's values by its declared types: a datetime or a time whose offset has seconds (pydantic
# writes the offset in minutes: another instant), and two keys of a dict declared with Any keys
# (or inside a value declared Any) that are written as one text (one would be lost).

Walk = Callable[[Any], None]


def _walker(tp: Any, building: dict[Any, Walk | None], config: Mapping[str, Any]) -> Walk | None:
    """A function that refuses (`_Refused`, naming the place) what a value declared `tp` holds
    that pydantic would not write so that it reads back; None if a value so declared cannot
    hold any. `config`: the configuration of the model whose field declares `tp`."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return _plain
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _walker(args[0], building, config)
    if isinstance(tp, typing.NewType):
        return _walker(tp.__supertype__, building, config)
    if origin is typing.Literal:
        return _choice_walker(tp, args, config)
    bare = _BARE.get(tp)
    if bare is not None:
        return _walker(bare, building, config)
    if origin is typing.Union or origin is types.UnionType:
        arms = [w for a in args if (w := _walker(a, building, config)) is not None]
        own = _union_read_back(tp, args, config)
        if own is not None:
            arms.insert(0, own)
        if not arms:
            return None

        def union(value: Any) -> None:
            for arm in arms:  # each looks only at values of its own type
                arm(value)

        return union
    if origin in _SEQUENCES:
        return _sequence_walker(origin, args, building, config)
    parts = _mapping(tp)
    if parts is not None:
        return _mapping_walker(parts[0], parts[1], building, config)
    if origin is not None:
        return _walker(origin, building, config)
    if isinstance(tp, type) and issubclass(tp, datetime | time):
        return _offset
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _choice_walker(tp, list(tp), config)
    return _instance_walker(tp, building, config)


def _adapter(tp: Any, config: Mapping[str, Any]) -> Any:
    """pydantic's TypeAdapter of `tp` as a field of a model configured `config` reads it."""
    pydantic = sys.modules["pydantic"]
    return pydantic.TypeAdapter(tp, config=pydantic.ConfigDict(**config) if config else None)


def _choice_walker(tp: Any, values: Iterable[Any], config: Mapping[str, Any]) -> Walk | None:
    """For an Enum or a Literal: refuse the members (values) that pydantic writes as what it
    does not read back as them (an Enum of tuple or Decimal values, `Literal[Shade.DARK]`,
    written 'dark'); None if pydantic reads back each one."""
    adapter = _adapter(tp, {k: v for k, v in config.items() if k == "strict"})
    refused: dict[tuple[type[Any], Any], str] = {}
    for value in values:
        try:
            text = adapter.dump_json(value)
        except Exception:  # not even written: pydantic's own error at send
            continue
        try:
            back = adapter.validate_json(text)
        except ValueError:
            back = _MISSING
        if back is _MISSING or not _same_value(back, value):
            refused[(type(value), value)] = (
                f"{_shown(value)} ({type(value).__qualname__}) is written "
                f"{text.decode(errors='replace')}, which pydantic does not read back as it: "
                f"declare {_annotation_name(tp)} in a dataclass, whose codec does"
            )
    if not refused:
        return None

    def choice(value: Any) -> None:
        try:
            problem = refused.get((type(value), value))
        except TypeError:  # unhashable: none of them
            return
        if problem is not None:
            raise _Refused(problem)

    return choice


def _union_read_back(tp: Any, args: tuple[Any, ...], config: Mapping[str, Any]) -> Walk | None:
    """For a union two types of which read the same kind of JSON (`str | UUID`: strings): a
    value is written and read back by pydantic, as the model would, and refused unless it
    comes back (pydantic takes the type it finds best for the JSON, which may be another);
    None for a union whose types read different JSON (`int | None`, `list[int] | dict[str,
    int]`)."""
    kinds: set[str] = set()
    overlap = False
    for arm in args:
        if arm is _NONE or arm is Any or arm is object or isinstance(arm, typing.TypeVar):
            continue
        own = _json_kinds(arm)
        overlap = overlap or bool(own & (kinds | {"any"})) or "any" in kinds
        kinds |= own
    if not overlap:
        return None
    declared = _annotation_name(tp)
    adapter: list[Any] = []

    def read_back(value: Any) -> None:
        if not adapter:
            adapter.append(_adapter(tp, config))
        try:
            text = adapter[0].dump_json(value, by_alias=True, warnings="error")
            back = adapter[0].validate_json(text, by_alias=True, by_name=True)
        except Exception:  # pydantic's own error when the model is written or read
            return
        if not _same_value(back, value):
            raise _Refused(
                f"{_shown(value)} ({type(value).__qualname__}) is written "
                f"{text.decode(errors='replace')}, which pydantic reads back as {_shown(back)} "
                f"({type(back).__qualname__}): the declared type is {declared}"
            )

    return read_back


def _sequence_walker(
    origin: Any, args: tuple[Any, ...], building: dict[Any, Walk | None], config: Mapping[str, Any]
) -> Walk | None:
    variadic = not (origin is tuple and not (len(args) == 2 and args[1] is Ellipsis))
    walkers = [_walker(a, building, config) for a in (args[:1] if variadic else args)]
    if all(w is None for w in walkers):
        return None

    def sequence(value: Any) -> None:
        if not isinstance(value, list | tuple | set | frozenset):
            return
        for index, item in enumerate(value):
            walk = walkers[0] if variadic else walkers[index] if index < len(walkers) else None
            if walk is not None:
                try:
                    walk(item)
                except _Refused as exc:
                    raise exc.within(f"[{index}]") from None

    return sequence


def _mapping_walker(
    key_type: Any, value_type: Any, building: dict[Any, Walk | None], config: Mapping[str, Any]
) -> Walk | None:
    keys = _plain_keys(key_type)
    any_keys = keys == "any"
    walk_key = None if keys is not None else _walker(key_type, building, config)
    walk_item = _walker(value_type, building, config)
    if walk_key is None and walk_item is None and keys is None:
        return None

    def mapping(value: Any) -> None:
        if type(value) is not dict and not isinstance(value, Mapping):
            return
        if keys == "str" and not all(map(str.isascii, value)):
            for key in value:  # pydantic writes a lone surrogate in a key as U+FFFD: another key
                position = _surrogate(key)
                if position is not None:
                    raise _Refused(
                        f"key {_shown(key)} is not valid Unicode (a lone surrogate at position "
                        f"{position}), which JSON in UTF-8 cannot carry"
                    )
        if any_keys and not _STR.issuperset(map(type, value)):
            problem = _alike(value)
            if problem is not None:
                raise _Refused(problem)
        for key, item in value.items():
            try:
                if walk_key is not None:
                    walk_key(key)
                if walk_item is not None:
                    walk_item(item)
            except _Refused as exc:
                raise exc.within(_step(key)) from None

    return mapping


def _instance_walker(
    tp: Any, building: dict[Any, Walk | None], config: Mapping[str, Any]
) -> Walk | None:
    """The walker of a model or a dataclass: each field that may hold what `_walker` finds."""
    if tp in building:  # contains itself: the one being built, looked up when used
        return lambda value: _late_walker(building, tp)(value)
    annotations = _field_annotations(tp)
    if annotations is None:
        return None
    building[tp] = None
    if is_model(tp):  # its fields as it declares them (Strict, union_mode...), by its config
        config = getattr(tp, "model_config")  # noqa: B009 - Any
        infos: dict[str, Any] = getattr(tp, "model_fields")  # noqa: B009 - Any
        annotations = {
            name: typing.Annotated[info.annotation, *info.metadata] if info.metadata else a
            for (name, a), info in zip(annotations.items(), infos.values(), strict=True)
        }
    fields = [(name, w) for name, a in annotations.items() if (w := _walker(a, building, config))]
    if not fields:
        building[tp] = _nothing
        return None

    def instance(value: Any) -> None:
        if not isinstance(value, tp):
            return
        for name, walk in fields:
            try:
                walk(getattr(value, name, None))
            except _Refused as exc:
                raise exc.within(f".{name}") from None

    building[tp] = instance
    return instance


def _nothing(value: Any) -> None:
    return None


def _late_walker(building: dict[Any, Walk | None], tp: Any) -> Walk:
    walk = building[tp]
    if walk is None:  # cannot be: walking starts once the outer one is built
        raise RuntimeError(f"the walker of {type_name(tp)} is not built yet")
    return walk


def _offset(value: Any) -> None:
    """Refuse a datetime or a time whose offset is not whole minutes: pydantic writes it
    without its seconds, which reads back as another instant."""
    if type(value) is not datetime and not isinstance(value, datetime | time):
        return
    offset = value.utcoffset()
    if offset is None or not (offset.seconds % 60 or offset.microseconds):
        return
    shown = datetime(2000, 1, 1, tzinfo=timezone(offset)).isoformat()[19:]
    raise _Refused(
        f"the offset {shown} of {value.isoformat()} has seconds, which pydantic writes without "
        "them (another instant): give it an offset of whole minutes (astimezone(UTC))"
    )


def _refusing(problem: str) -> Check:
    def check(value: Any, dumped: Any) -> None:
        raise _Refused(problem)

    return check


def _model_problem(tp: type[Any]) -> str | None:
    """Why the validation of model `tp`, or of a model inside it, refuses every message the
    model writes (a field written under a name it does not read, a computed field written to a
    model that forbids extra fields, a required field excluded from what is written), or None."""
    seen: set[type[Any]] = set()
    _reachable(tp, seen)
    for model in sorted((m for m in seen if is_model(m)), key=lambda m: m is not tp):
        name = type_name(model)
        fields: dict[str, Any] = getattr(model, "model_fields")  # noqa: B009 - Any
        for field_name, info in fields.items():
            if info.exclude is True and info.is_required():
                return (
                    f"{name}.{field_name} is required but not written (exclude=True): the "
                    f"validation of {name} would refuse every message"
                )
            written = info.serialization_alias or field_name
            if written not in _read_names(field_name, info):
                return (
                    f"{name}.{field_name} is written as {written!r}, which {name} does not read "
                    f"(its validation_alias is {info.validation_alias!r}): every message would "
                    "be refused; give it the same alias both ways"
                )
        config: Mapping[str, Any] = getattr(model, "model_config")  # noqa: B009 - Any
        computed: dict[str, Any] = getattr(model, "model_computed_fields", {})
        if config.get("extra") == "forbid" and computed:
            field_name = next(iter(computed))
            return (
                f"{name}.{field_name} is written (a computed field), which {name} refuses "
                "(extra='forbid'): every message would be refused; allow extra fields "
                "(extra='ignore')"
            )
    return None


def _read_names(name: str, info: Any) -> set[str]:
    """The names a model's validation reads a field from, by alias or by name (as its handler
    validates): its name, its alias or validation alias, a choice among them, a path of one."""
    names = {name}
    alias = info.validation_alias if info.validation_alias is not None else info.alias
    choices = getattr(alias, "choices", None) or [alias]
    for choice in choices:
        path = getattr(choice, "path", None)
        if isinstance(choice, str):
            names.add(choice)
        elif path is not None and len(path) == 1 and isinstance(path[0], str):
            names.add(path[0])
    return names


def _reachable(tp: Any, seen: set[type[Any]]) -> None:
    """Adds to `seen` the models and dataclasses a value declared `tp` may hold (itself too)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return
    if isinstance(tp, typing.NewType):
        _reachable(tp.__supertype__, seen)
        return
    if origin is not None:
        for arg in args[:1] if origin is typing.Annotated else args:
            if arg is not Ellipsis:
                _reachable(arg, seen)
        if origin is not typing.Annotated:
            _reachable(origin, seen)
        return
    if tp in seen:
        return
    annotations = _field_annotations(tp)
    if annotations is None:
        return
    seen.add(tp)
    for annotation in annotations.values():
        _reachable(annotation, seen)


def _checking(tp: type[Any], differ: Differ) -> Check:
    read = decoder(tp)
    name = type_name(tp)

    def check(value: Any, dumped: Any) -> None:
        try:
            back = read(dumped)
        except Exception as exc:  # PayloadInvalid; whatever a validator raises
            raise _Refused(
                f"{name}'s own validation refuses what it wrote (model_dump(mode='json')): {exc}"
            ) from None
        problem = differ(value, back)
        if problem is not None:
            raise problem

    return check


def _converts_keys(tp: Any, seen: set[type[Any]]) -> bool:
    """True if a value declared `tp` has, somewhere inside, a mapping whose keys are not text."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return False
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _converts_keys(args[0], seen)
    if isinstance(tp, typing.NewType):
        return _converts_keys(tp.__supertype__, seen)
    parts = _mapping(tp)
    if parts is not None:
        return not _text_keys(parts[0]) or _converts_keys(parts[1], seen)
    if origin is not None:
        return any(_converts_keys(a, seen) for a in args if a is not Ellipsis)
    annotations = _field_annotations(tp)
    if annotations is None or tp in seen:
        return False
    seen.add(tp)
    return any(_converts_keys(a, seen) for a in annotations.values())


def _field_annotations(tp: Any) -> dict[str, Any] | None:
    """The fields of a model or a dataclass and their annotations; None for other types (and a
    dataclass whose annotations cannot be resolved)."""
    if not isinstance(tp, type):
        return None
    if is_model(tp):
        fields: dict[str, Any] = getattr(tp, "model_fields")  # noqa: B009 - Any
        return {name: info.annotation for name, info in fields.items()}
    if dataclasses.is_dataclass(tp):
        try:
            hints = _resolve(tp, None)
        except Exception:
            return None
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(tp)}
    return None


def _differ(tp: Any, building: dict[type[Any], Differ | None]) -> Differ | None:
    """Where the keys of `got`, a value read back, are not those of `sent`, a value declared
    `tp` (a `_Refused` naming the place), or None if they are; None for a type without keys to
    convert."""
    if not _converts_keys(tp, set()):
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _differ(args[0], building)
    if isinstance(tp, typing.NewType):
        return _differ(tp.__supertype__, building)
    if origin is typing.Union or origin is types.UnionType:
        arms = [d for a in args if (d := _differ(a, building)) is not None]

        def union(sent: Any, got: Any) -> _Refused | None:
            for arm in arms:
                problem = arm(sent, got)
                if problem is not None:
                    return problem
            return None

        return union
    if origin in _SEQUENCES:
        variadic = not (origin is tuple and not (len(args) == 2 and args[1] is Ellipsis))
        items = [_differ(a, building) for a in (args[:1] if variadic else args)]

        def sequence(sent: Any, got: Any) -> _Refused | None:
            if not isinstance(sent, list | tuple) or not isinstance(got, list | tuple):
                return None
            for index, (one, other) in enumerate(zip(sent, got, strict=False)):
                differ = items[0] if variadic else items[index] if index < len(items) else None
                problem = differ(one, other) if differ is not None else None
                if problem is not None:
                    return problem.within(f"[{index}]")
            return None

        return sequence
    parts = _mapping(tp)
    if parts is not None:
        return _mapping_differ(parts[:2], building)
    if origin is not None:
        return _differ(origin, building)
    if tp in building:  # contains itself: the one being built, looked up when used
        return lambda sent, got: _late(building, tp)(sent, got)
    building[tp] = None
    annotations = _field_annotations(tp) or {}
    fields = [(name, d) for name, a in annotations.items() if (d := _differ(a, building))]

    def instance(sent: Any, got: Any) -> _Refused | None:
        for name, differ in fields:
            problem = differ(getattr(sent, name, None), getattr(got, name, None))
            if problem is not None:
                return problem.within(f".{name}")
        return None

    building[tp] = instance
    return instance


def _late(building: dict[type[Any], Differ | None], tp: type[Any]) -> Differ:
    differ = building[tp]
    if differ is None:  # cannot be: comparing starts once the outer one is built
        raise RuntimeError(f"the comparison of {type_name(tp)} is not built yet")
    return differ


def _mapping_differ(
    args: tuple[Any, ...], building: dict[type[Any], Differ | None]
) -> Differ | None:
    text = _text_keys(args[0])
    items = _differ(args[1], building) if len(args) > 1 else None

    def mapping(sent: Any, got: Any) -> _Refused | None:
        if not isinstance(sent, Mapping) or not isinstance(got, Mapping):
            return None
        if not text:
            for key in sent:
                if isinstance(key, float) and not math.isfinite(key):
                    return _Refused(f"key {key!r} is {_NOT_A_NUMBER}")
        if len(got) != len(sent):
            return _Refused(
                f"{len(sent)} keys sent, {len(got)} read back: keys were written as one JSON "
                "object key"
            )
        for (key, item), (back, again) in zip(sent.items(), got.items(), strict=True):
            if not text and not _same_key(back, key):
                return _Refused(
                    f"key {_shown(key)} ({type(key).__qualname__}) is read back as "
                    f"{_shown(back)} ({type(back).__qualname__})"
                )
            if items is not None:
                problem = items(item, again)
                if problem is not None:
                    return problem.within(_step(back))
        return None

    return mapping


def _step(key: Any) -> str:
    """A path's step to the value of `key`: `.1`, as the reader's paths go."""
    try:
        return f".{_key_text(key)}"
    except _Refused:
        return f"[{_shown(key)}]"


# -- JSON Schema -----------------------------------------------------------------------------


def json_schema(payload_type: type[Any] | None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12 vocabulary, no `$ref`) of a payload type's wire form, as
    `JsonSerializer` writes it: a pydantic model's own serialization schema (with its `$defs`,
    which a document embedding it must keep or move), a dataclass by the rules above (nested
    dataclasses inline; unknown properties allowed, as the decoder ignores them), `{}` for
    None (any JSON value)."""
    if payload_type is None:
        return {}
    if is_model(payload_type):
        schema: dict[str, Any] = getattr(payload_type, "model_json_schema")(  # noqa: B009
            mode="serialization"
        )
        return schema
    return _schema(payload_type, frozenset())


def _schema(tp: Any, seen: frozenset[type[Any]]) -> dict[str, Any]:
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return {}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _schema(args[0], seen)
    if origin is typing.Union or origin is types.UnionType:
        return {"anyOf": [_schema(a, seen) for a in args]}
    if origin is typing.Literal:
        return {"enum": _forms(args)}
    if origin in _SEQUENCES:
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return {
                "type": "array",
                "prefixItems": [_schema(a, seen) for a in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        return {"type": "array", "items": _schema(args[0], seen) if args else {}}
    parts = _mapping(tp)
    if parts is not None:
        keys = _key_schema(parts[0])
        return {
            "type": "object",
            **({"propertyNames": keys} if keys is not None else {}),
            "additionalProperties": _schema(parts[1], seen),
        }
    if origin is not None:
        return _schema(origin, seen)
    if tp is type(None):
        return {"type": "null"}
    if not isinstance(tp, type):
        return {}
    if dataclasses.is_dataclass(tp):
        if tp in seen:  # a dataclass that contains itself: not described again
            return {"type": "object", "title": tp.__qualname__}
        hints = typing.get_type_hints(tp)
        fields = [f for f in dataclasses.fields(tp) if f.init]
        inner = seen | {tp}
        schema: dict[str, Any] = {
            "type": "object",
            "title": tp.__qualname__,
            "properties": {f.name: _schema(hints.get(f.name, Any), inner) for f in fields},
        }
        required = [
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if required:
            schema["required"] = required
        if tp.__doc__ and not tp.__doc__.startswith(f"{tp.__name__}("):
            schema["description"] = tp.__doc__.strip()
        return schema
    if is_model(tp):
        return json_schema(tp)
    return _scalar_schema(tp)


def _forms(values: Iterable[Any]) -> list[Any]:
    """The JSON values `values` (an Enum's members, a Literal's values) are written as."""
    forms = []
    for value in values:
        with contextlib.suppress(_Refused):  # cannot be written: never sent
            forms.append(_written(value)[0])
    return forms


_DECIMAL_PATTERN = r"^-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"


def _key_schema(tp: Any) -> dict[str, Any] | None:
    """The schema of the text of keys declared `tp` (for `propertyNames`); None for any text."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _key_schema(args[0])
    if isinstance(tp, typing.NewType):
        return _key_schema(tp.__supertype__)
    if origin is typing.Union or origin is types.UnionType:
        arms = [_key_schema(a) for a in args]
        return None if any(a is None for a in arms) else {"anyOf": arms}
    if origin is typing.Literal:
        return {"enum": list(_key_table(args))}
    if not isinstance(tp, type):
        return None
    if tp is type(None):
        return {"const": "null"}
    if issubclass(tp, enum.Enum):
        return {"enum": list(_key_table(tp))}
    if issubclass(tp, bool):
        return {"enum": ["true", "false"]}
    if issubclass(tp, int):
        return {"pattern": f"^{_INTEGER.pattern}$"}
    if issubclass(tp, float):
        return {"pattern": f"^{_NUMBER.pattern}$"}
    if issubclass(tp, Decimal):
        return {"pattern": _DECIMAL_PATTERN}
    if issubclass(tp, str):
        return None
    schema = _scalar_schema(tp)
    schema.pop("type", None)
    return schema or None


def _scalar_schema(tp: type[Any]) -> dict[str, Any]:
    if issubclass(tp, bool):
        return {"type": "boolean"}
    if issubclass(tp, enum.Enum):
        return {"enum": _forms(tp), "title": tp.__qualname__}
    if issubclass(tp, int):
        return {"type": "integer"}
    if issubclass(tp, float):
        return {"type": "number"}
    if issubclass(tp, str):
        return {"type": "string"}
    if issubclass(tp, UUID):
        return {"type": "string", "format": "uuid"}
    if issubclass(tp, datetime):
        return {"type": "string", "format": "date-time"}
    if issubclass(tp, date):
        return {"type": "string", "format": "date"}
    if issubclass(tp, time):
        return {"type": "string", "format": "time"}
    if issubclass(tp, Decimal):
        return {"type": "string", "pattern": _DECIMAL_PATTERN}
    if issubclass(tp, bytes | bytearray):
        return {"type": "string", "contentEncoding": "base64"}
    return {}
