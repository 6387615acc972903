"""Values as PostgreSQL stores them, and the errors it raises for the ones it refuses: what
the in-memory stores check before storing anything, so that a value PostgreSQL would refuse is
refused in memory too (`DataError`, which `outbox.core.retriable.refused_for_data` reads as
PostgreSQL's)."""

from __future__ import annotations

import json
import math
import time
import uuid
from datetime import UTC, datetime
from typing import Any, NoReturn

from outbox.core.text import is_storable

#: How long a statement waits for a row lock another open transaction holds, then raises
#: `LockTimeout` (PostgreSQL's `lock_timeout`, which outbox leaves at 0, waits for ever: a test
#: would hang instead).
LOCK_TIMEOUT = 10.0


class DataError(ValueError):
    """A value PostgreSQL would refuse, raised where psycopg's `DataError` would be.

    NUL or a lone surrogate in text, JSON that `jsonb` cannot hold, a number out of its
    column's range: `outbox.core.retriable.refused_for_data` says True, as for PostgreSQL's.
    """

    #: data_exception, as `outbox.core.retriable.refused_for_data` reads it.
    sqlstate = "22000"


class MemoryLost(ConnectionError):
    """A lost connection: a session closed, lost (`lose`) or whose transaction was terminated."""


class LockTimeout(Exception):
    """A statement waited `LOCK_TIMEOUT` seconds for a row lock another transaction holds."""

    #: lock_not_available, as PostgreSQL's `lock_timeout` raises it.
    sqlstate = "55P03"


# -- values as PostgreSQL stores them ---------------------------------------------------------


def text(value: object, what: str) -> str:
    """`value` if PostgreSQL's `text` stores it as it is, else `DataError`."""
    if not isinstance(value, str):
        raise DataError(f"{what}: expected text, got {type(value).__name__}")
    if not is_storable(value):
        raise DataError(f"{what}: text with a NUL or a lone surrogate cannot be stored")
    return value


def integer(value: object, bits: int, what: str) -> int:
    """`value` if it fits a signed integer column of `bits` bits, else `DataError`."""
    limit = 1 << (bits - 1)
    if not isinstance(value, int) or not -limit <= value < limit:
        raise DataError(f"{what}: {value!r} is out of range for a {bits}-bit integer")
    return value


def _jsonb_order(key: str) -> tuple[int, bytes]:
    """jsonb keeps an object's keys shorter first, then in byte order."""
    raw = key.encode()
    return len(raw), raw


def _jsonb_value(value: Any, what: str) -> Any:
    if isinstance(value, str):
        return text(value, what)
    if isinstance(value, dict):
        return {
            text(k, what): _jsonb_value(value[k], what) for k in sorted(value, key=_jsonb_order)
        }
    if isinstance(value, list):
        return [_jsonb_value(v, what) for v in value]
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise DataError(f"{name} is not JSON")


def jsonb(value: object, what: str) -> Any:
    """JSON text as a `jsonb` column holds it (what psycopg reads back): keys in jsonb's
    order, the last of duplicate keys; `DataError` where PostgreSQL refuses it (not JSON,
    NaN, a NUL or a lone surrogate in a string)."""
    if not isinstance(value, str):
        raise DataError(f"{what}: expected JSON text, got {type(value).__name__}")
    try:
        parsed = json.loads(value, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise DataError(f"{what}: invalid input syntax for type json: {exc}") from None
    return _jsonb_value(parsed, what)


def jsonb_text(value: Any) -> str:
    """A `jsonb` value as PostgreSQL writes it out (`::text`)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def timestamp(when: datetime) -> str:
    """A time as `producer_fetch` formats `created_at`: ISO 8601 in UTC, microseconds."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def as_uuid(value: object) -> uuid.UUID:
    """`value` as a `uuid` column takes it (any spelling of a UUID), else `DataError`."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise DataError(f"invalid input syntax for type uuid: {value!r}") from None


def aware(value: object) -> datetime:
    """A time as a `timestamptz` column takes it (a naive one in UTC, the session's zone)."""
    if not isinstance(value, datetime):
        raise DataError(f"expected a time, got {type(value).__name__}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


#: The seconds an interval holds (microseconds in 64 bits), and the range of a `timestamptz`
#: (4713 BC to 294276 AD) in seconds since the epoch.
_INTERVAL_SECONDS = 2**63 / 1e6
_TIMESTAMPS = (-210_866_803_200.0, 9_224_318_016_000.0)


def delay(seconds: float) -> float:
    """A retry delay as `now() + make_interval(secs => ...)` takes it, else `DataError`
    (NaN, infinities, or a time out of PostgreSQL's range)."""
    if not math.isfinite(seconds) or abs(seconds) >= _INTERVAL_SECONDS:
        raise DataError(f"delay {seconds!r}: interval out of range")
    if not _TIMESTAMPS[0] <= time.time() + seconds < _TIMESTAMPS[1]:
        raise DataError(f"delay {seconds!r}: timestamp out of range")
    return seconds
