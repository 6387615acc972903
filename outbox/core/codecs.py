"""Typed payloads: how values JSON has no type for are encoded, and how a decoded JSON value
becomes the payload type a handler declared.

Encoding (`to_json`, the `default` hook of `JsonSerializer`): UUID -> its text; datetime WITH
a zone -> ISO 8601 (a naive datetime is refused: read elsewhere, it would mean another instant);
date and time -> ISO 8601; Decimal -> a string (a JSON number would be read back as a float and
lose digits); Enum -> its value; dataclass -> an object of its fields; pydantic model ->
`model_dump(mode="json")`; bytes inside a payload -> a standard base64 string. A set is refused
(its order is not defined: send a sorted list). Anything else is refused with its path, e.g.
`payload.items[2].price: object of type Foo is not JSON-encodable`.

Decoding (`decoder(type)`): a pydantic model by `model_validate` (its own config decides
extra fields: pydantic ignores them by default); a dataclass by outbox's own converter, with or
without pydantic installed, so that a message reads the same everywhere: fields by name,
unknown fields ignored, defaults for missing optional fields, nested dataclasses, and
UUID/datetime/date/time/Decimal/Enum/bytes converted back from their encoding above.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import math
import sys
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
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
    "json_schema",
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
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if is_model(type(value)):
        return value.model_dump(mode="json")
    if isinstance(value, set | frozenset):
        raise TypeError(
            f"a {type(value).__name__} is refused in JSON: its order is not defined; send a "
            "list (sorted(...))"
        )
    raise TypeError(f"object of type {type(value).__qualname__} is not JSON-encodable")


def describe_unencodable(payload: Any) -> str:
    """Where and why `payload` cannot be JSON-encoded: `payload.items[2].price: ...`.

    Walks the value the way `json.dumps(default=to_json)` does; called only after that failed.
    """
    try:
        found = _find(payload, "payload", set())
    except RecursionError:
        found = None
    return found or f"payload of type {type(payload).__qualname__} cannot be JSON-encoded"


def _find(value: Any, path: str, seen: set[int]) -> str | None:
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"{path}: {value!r} is not a JSON number (NaN and infinities are refused)"
    if isinstance(value, dict | list | tuple):
        if id(value) in seen:
            return f"{path}: circular reference"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                for k, item in value.items():
                    if not (k is None or isinstance(k, str | int | float | bool)):
                        return (
                            f"{path}: key {k!r} of type {type(k).__qualname__} is refused "
                            "(object keys must be str, int, float, bool or None)"
                        )
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
    except TypeError as exc:
        return f"{path}: {exc}"
    except Exception as exc:  # a model_dump that raises: its own error
        return f"{path}: {type(exc).__name__}: {exc}"
    if converted is value:
        return None
    if id(value) in seen:
        return f"{path}: circular reference"
    seen.add(id(value))
    try:
        return _find(converted, path, seen)
    finally:
        seen.discard(id(value))


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
    """What building one decoder shares: where names resolve, and the dataclasses being built
    (a dataclass that contains itself refers to its own converter, late)."""

    localns: Mapping[str, Any] | None
    building: dict[type[Any], Convert | None] = dataclasses.field(default_factory=dict)


def _build(payload_type: type[Any], localns: Mapping[str, Any] | None) -> Decode:
    if is_model(payload_type):
        validate = payload_type.model_validate

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
_MAPPINGS = {dict, abc.Mapping, abc.MutableMapping}


def _fail(path: str, expected: str, data: Any) -> PayloadInvalid:
    shown = repr(data)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return PayloadInvalid(f"{path}: expected {expected}, got {type(data).__name__} {shown}")


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
    if origin is typing.Literal:

        def literal(data: Any, path: str) -> Any:
            if data in args:
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
            if origin is set
            else frozenset
            if origin is frozenset
            else list
        )

        def sequence(data: Any, path: str) -> Any:
            if not isinstance(data, list):
                raise _fail(path, "an array", data)
            return build([item(d, f"{path}[{i}]") for i, d in enumerate(data)])

        return sequence
    if origin in _MAPPINGS:
        key = _converter(args[0], ctx) if args else _converter(Any, ctx)
        value = _converter(args[1], ctx) if len(args) > 1 else _converter(Any, ctx)

        def mapping(data: Any, path: str) -> Any:
            if not isinstance(data, dict):
                raise _fail(path, "an object", data)
            return {key(k, path): value(v, f"{path}.{k}") for k, v in data.items()}

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
        validate: Callable[[Any], Any] = getattr(tp, "model_validate")  # noqa: B009 - Any

        def model(data: Any, path: str) -> Any:
            try:
                return validate(data)
            except ValueError as exc:
                raise PayloadInvalid(f"{path}: not a valid {type_name(tp)}: {exc}") from exc

        return model
    return _scalar_converter(tp)


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
                return float(data)
            raise _fail(path, "a number", data)

        return number
    if tp is str:

        def text(data: Any, path: str) -> Any:
            if isinstance(data, str):
                return data
            raise _fail(path, "a string", data)

        return text
    if issubclass(tp, enum.Enum):

        def member(data: Any, path: str) -> Any:
            try:
                return tp(data)
            except ValueError:
                values = ", ".join(repr(m.value) for m in tp)
                raise _fail(path, f"a {name} ({values})", data) from None

        return member
    parsers: dict[type[Any], Callable[[str], Any]] = {
        UUID: UUID,
        datetime: datetime.fromisoformat,
        date: date.fromisoformat,
        time: time.fromisoformat,
        Decimal: Decimal,
        bytes: lambda s: base64.b64decode(s, validate=True),
    }
    for base, parse in parsers.items():
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
        hints = typing.get_type_hints(tp, localns=dict(ctx.localns or {}))
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the annotations of {tp.__module__}.{tp.__qualname__} "
            f"({type(exc).__name__}: {exc}): outbox converts a payload by its fields' types"
        ) from exc
    converters = {f.name: _converter(hints.get(f.name, Any), ctx) for f in fields}

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
        return {"enum": list(args)}
    if origin in _SEQUENCES:
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return {
                "type": "array",
                "prefixItems": [_schema(a, seen) for a in args],
                "minItems": len(args),
                "maxItems": len(args),
            }
        return {"type": "array", "items": _schema(args[0], seen) if args else {}}
    if origin in _MAPPINGS:
        return {
            "type": "object",
            "additionalProperties": _schema(args[1], seen) if len(args) > 1 else {},
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


def _scalar_schema(tp: type[Any]) -> dict[str, Any]:
    if issubclass(tp, bool):
        return {"type": "boolean"}
    if issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp], "title": tp.__qualname__}
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
        return {"type": "string", "pattern": r"^-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$"}
    if issubclass(tp, bytes | bytearray):
        return {"type": "string", "contentEncoding": "base64"}
    return {}
