"""Payload serializers: how a Python value becomes the bytes stored and sent, and back."""

from __future__ import annotations

import json
import sys
from typing import Any, Protocol, runtime_checkable

from outbox.core.codecs import decoder, describe_unencodable, json_reader, plain_problem, to_json
from outbox.core.errors import SerializationError

BYTES = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


@runtime_checkable
class Serializer(Protocol):
    """Turns payloads into bytes and back. `dumps` must raise `SerializationError` on bad input."""

    content_type: str

    def dumps(self, payload: Any) -> bytes:
        """Encode one payload."""
        ...

    def loads(self, data: bytes) -> Any:
        """Decode what `dumps` produced."""
        ...


#: What `json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
#: default=to_json)` builds on each call, built once (it keeps no state between calls).
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=to_json
)


class JsonSerializer:
    """Compact UTF-8 JSON; rejects NaN and values JSON cannot represent.

    Beyond JSON's own types it encodes models, dataclasses, UUID, datetime with a zone, date,
    time, Decimal (as a string), Enum (its value) and bytes inside a payload (base64), as
    `outbox.core.codecs` says; anything else, a naive datetime, a set and two keys of a dict
    it would write as one (`{1: "a", "1": "b"}`) are refused with the path of the offending
    value.
    """

    content_type = JSON

    def dumps(self, payload: Any) -> bytes:
        try:
            text = _ENCODER.encode(payload)
        except (TypeError, ValueError) as exc:
            raise SerializationError(describe_unencodable(payload)) from exc
        except RecursionError:
            raise SerializationError(
                f"payload of type {type(payload).__name__} is nested too deeply to encode as "
                f"JSON (more than about {sys.getrecursionlimit()} levels)"
            ) from None
        if isinstance(payload, dict | list | tuple):  # a dataclass's fields check their own
            problem = plain_problem(payload)
            if problem is not None:
                raise SerializationError(problem)
        try:
            return text.encode()
        except UnicodeEncodeError as exc:
            raise SerializationError(
                describe_unencodable(
                    payload,
                    f"payload of type {type(payload).__name__} has a string that is not valid "
                    f"Unicode (a lone surrogate at position {exc.start} of its JSON), which "
                    "JSON in UTF-8 cannot encode",
                )
            ) from None

    def loads(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerializationError(f"payload is not valid JSON: {exc}") from exc
        except RecursionError:
            raise SerializationError("payload is JSON nested too deeply to decode") from None


def encode_payload(payload: Any, serializer: Serializer) -> tuple[bytes, str]:
    """Encode a payload: bytes pass through, str is UTF-8 text, anything else uses `serializer`.

    Raises `SerializationError` for anything that cannot be encoded: a str with a lone
    surrogate, a value nested deeper than Python's recursion limit, or a value the serializer
    refuses (a serializer raising TypeError, ValueError, UnicodeError or RecursionError instead
    of `SerializationError` is reported the same way).
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), BYTES
    if isinstance(payload, str):
        try:
            return payload.encode(), TEXT
        except UnicodeEncodeError as exc:
            raise SerializationError(
                f"str payload is not valid Unicode (a lone surrogate at position {exc.start}) "
                "and cannot be encoded as UTF-8: use bytes for binary payloads"
            ) from None
    try:
        data = serializer.dumps(payload)
    except SerializationError:
        raise
    except (TypeError, ValueError, UnicodeError, RecursionError) as exc:
        raise SerializationError(
            f"serializer {type(serializer).__name__} cannot encode a payload of type "
            f"{type(payload).__name__}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(data, bytes):
        raise SerializationError(
            f"serializer {type(serializer).__name__}.dumps returned "
            f"{type(data).__name__}, expected bytes"
        )
    return data, serializer.content_type


def decode_payload(data: bytes, content_type: str | None, serializer: Serializer) -> Any:
    """Invert `encode_payload`, using the content type recorded with the message."""
    if content_type == BYTES:
        return data
    if content_type == TEXT:
        return data.decode()
    if content_type is None or content_type == serializer.content_type:
        return serializer.loads(data)
    raise SerializationError(
        f"payload has content type {content_type!r}, which serializer "
        f"{type(serializer).__name__} ({serializer.content_type!r}) cannot decode"
    )


def read_payload(
    payload_type: type[Any] | None, data: bytes, content_type: str | None, serializer: Serializer
) -> Any:
    """What a handler of `payload_type` gets for a stored payload (None: the decoded value):
    `decode_payload`, then the payload type's decoder. A pydantic model, with a
    `JsonSerializer`, validates the JSON bytes themselves, in pydantic's JSON mode (the
    counterpart of model_dump(mode="json"): a strict model reads its UUIDs and datetimes from
    text), which also spares decoding them twice.

    Raises `SerializationError` if `data` is not of its content type, else the decoder's error
    (`PayloadInvalid`, or what a validator raises) if it is not a valid `payload_type`.
    """
    if (
        payload_type is not None
        and content_type in (None, JSON)
        and isinstance(serializer, JsonSerializer)
        and type(serializer).loads is JsonSerializer.loads
    ):
        read = json_reader(payload_type)
        if read is not None:
            try:
                return read(data)
            except Exception:
                serializer.loads(data)  # not JSON at all: say so, as for any payload
                raise
    try:
        decoded = decode_payload(data, content_type, serializer)
    except SerializationError:
        raise
    except Exception as exc:  # a serializer's own error; bytes that are not UTF-8 text
        raise SerializationError(str(exc) or type(exc).__name__) from exc
    return decoded if payload_type is None else decoder(payload_type)(decoded)
