"""Payload serializers: how a Python value becomes the bytes stored and sent, and back."""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

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


class JsonSerializer:
    """Compact UTF-8 JSON; rejects NaN and values JSON cannot represent."""

    content_type = JSON

    def dumps(self, payload: Any) -> bytes:
        try:
            text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SerializationError(
                f"payload of type {type(payload).__name__} is not JSON-serializable: {exc}"
            ) from exc
        return text.encode()

    def loads(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SerializationError(f"payload is not valid JSON: {exc}") from exc


def encode_payload(payload: Any, serializer: Serializer) -> tuple[bytes, str]:
    """Encode a payload: bytes pass through, str is UTF-8 text, anything else uses `serializer`."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), BYTES
    if isinstance(payload, str):
        return payload.encode(), TEXT
    data = serializer.dumps(payload)
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
