"""User headers: validation, and their stored (JSON) and Kafka forms."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from outbox.core.errors import ConfigurationError, InvalidHeaders
from outbox.core.text import is_storable

#: Header names starting with this prefix are set by outbox itself.
RESERVED_PREFIX = "outbox-"
MESSAGE_ID = "outbox-message-id"
CREATED_AT = "outbox-created-at"
CONTENT_TYPE = "content-type"
#: The id of the conversation a message belongs to; absent means "the message's own id".
CORRELATION_ID = "outbox-correlation-id"
#: The id of the message whose handler sent this one; absent for messages sent outside handlers.
CAUSATION_ID = "outbox-causation-id"
#: W3C trace context (https://www.w3.org/TR/trace-context/), written by `broker.send` when
#: OpenTelemetry is installed; ordinary (not reserved) headers, so a user-supplied one wins.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: The tenant a message is for: the NAME of the database whose inbox stores it, when a consumer
#: serves several (`outbox consumer --route-header`). Set by `Broker(tenant=...)` or
#: `send(..., tenant=...)`; the consumer reads it under its `--route-header` name.
TENANT_HEADER = "outbox-tenant"

Headers = Mapping[str, str | bytes]


def validate_headers(headers: object) -> dict[str, str | bytes]:
    """Return headers as a dict, or raise `InvalidHeaders` naming the bad entry.

    Names are non-empty text PostgreSQL can store (no NUL, no lone surrogate); str values must
    be storable text too, bytes values may hold anything.
    """
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidHeaders(
            f"headers must be a mapping of str to str or bytes, got {type(headers).__name__}"
        )
    result: dict[str, str | bytes] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidHeaders(f"header name must be a non-empty str, got {name!r}")
        if not is_storable(name):
            raise InvalidHeaders(
                f"header name {name!r} contains a NUL or a lone surrogate, which cannot be "
                "stored; header names must be text"
            )
        if name.lower().startswith(RESERVED_PREFIX) or name.lower() == CONTENT_TYPE:
            raise InvalidHeaders(f"header name {name!r} is reserved by outbox")
        if not isinstance(value, str | bytes):
            raise InvalidHeaders(
                f"header {name!r} must be str or bytes, got {type(value).__name__}"
            )
        if isinstance(value, str) and not is_storable(value):
            raise InvalidHeaders(
                f"header {name!r} has a str value with a NUL or a lone surrogate, which cannot "
                "be stored as text: use bytes for binary values"
            )
        result[name] = value
    return result


#: outbox's own headers, which no tenant header may be named after.
_OWN = frozenset({MESSAGE_ID, CREATED_AT, CONTENT_TYPE, CORRELATION_ID, CAUSATION_ID})


def validate_tenant_header(name: object) -> str:
    """Return `name` if it can name the header that carries a message's tenant, else raise
    `ConfigurationError`: `TENANT_HEADER`, or a non-empty storable name that is not reserved
    by outbox (`outbox-...`, `content-type`)."""
    if name == TENANT_HEADER:
        return TENANT_HEADER
    if (
        not isinstance(name, str)
        or not name
        or not is_storable(name)
        or name.lower() in _OWN
        or name.lower().startswith(RESERVED_PREFIX)
        or name.lower() == CONTENT_TYPE
    ):
        raise ConfigurationError(
            f"tenant header name {name!r} is not valid: use {TENANT_HEADER!r} or a non-empty "
            f"text name that does not start with {RESERVED_PREFIX!r} and is not {CONTENT_TYPE!r}"
        )
    return name


def to_json(headers: Mapping[str, str | bytes]) -> dict[str, Any]:
    """The stored form: str values as they are, bytes values as {"b64": "..."}.

    Any value is storable this way: a str that PostgreSQL cannot hold as text (NUL, a lone
    surrogate) is stored as the bytes of its UTF-8 (surrogatepass), so `from_json` gives it
    back as bytes. Names are not checked here (the Consumer quarantines a record whose header
    name is not storable).
    """
    return {
        name: value
        if isinstance(value, str)
        and ((value.isascii() and "\x00" not in value) or is_storable(value))
        else {"b64": base64.b64encode(_bytes(value)).decode()}
        for name, value in headers.items()
    }


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value


def from_json(stored: Mapping[str, Any]) -> dict[str, str | bytes]:
    """Invert `to_json`."""
    return {
        name: value if isinstance(value, str) else base64.b64decode(value["b64"])
        for name, value in stored.items()
    }
