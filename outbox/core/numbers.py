"""Checks of numeric settings, shared by the config dataclasses and the command-line flags.

Every number outbox is configured with means one of a few things: a duration in seconds that
must be positive (an interval, a timeout, a lease), a duration that may be zero (a window), a
count (at least 1, or at least 0 where zero means "none"), or a TCP port. NaN and infinity are
never accepted: `nan <= 0` is false, so a plain comparison lets NaN through, and a NaN lease or
window then breaks the daemon far from where it was configured.

`check_fields` validates a config object (raising `ConfigurationError` naming the field);
`flag_type` gives the argparse `type=` of a flag (a usage error naming the flag, exit 2). The
flags' environment variables are their defaults, which argparse passes through the same `type`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import Literal

from outbox.core.errors import ConfigurationError

#: What a number means, and so which values are valid: besides the kinds above, the worker
#: threads of a Handler (each a thread and a database session) and the records one Consumer
#: poll may ask for (librdkafka takes at most 1,000,000).
Rule = Literal[
    "seconds", "seconds_or_zero", "count", "count_or_zero", "port", "threads", "poll_records"
]

#: The rules whose values are whole numbers.
INTEGER_RULES: frozenset[Rule] = frozenset(
    {"count", "count_or_zero", "port", "threads", "poll_records"}
)

#: The longest duration accepted (100 years): a longer one reaches past the range of
#: PostgreSQL's timestamps once subtracted from now (a dedup window of 10,000 years stopped the
#: Handler at its first clean-up), or past the longest wait Python's threads take.
MAX_SECONDS = 100 * 365.25 * 86400
#: The largest count accepted: PostgreSQL's `integer`, which the counts meet in statements.
MAX_COUNT = 2**31 - 1

#: The whole numbers each integer rule accepts, lowest and highest.
_RANGES: dict[Rule, tuple[int, int]] = {
    "count": (1, MAX_COUNT),
    "count_or_zero": (0, MAX_COUNT),
    "port": (0, 65535),
    "threads": (1, 1000),
    "poll_records": (1, 1_000_000),
}

_REQUIREMENT: dict[Rule, str] = {
    "seconds": "> 0 seconds (a finite number)",
    "seconds_or_zero": ">= 0 seconds (a finite number)",
    "count": ">= 1 (a whole number)",
    "count_or_zero": ">= 0 (a whole number)",
    "port": "a port number 0-65535",
    "threads": "a whole number from 1 to 1000",
    "poll_records": "a whole number from 1 to 1000000",
}


def requirement(rule: Rule) -> str:
    """What a valid value of `rule` is, in words."""
    return _REQUIREMENT[rule]


def problem(value: object, rule: Rule) -> str | None:
    """Why `value` is not valid for `rule`, or None when it is."""
    if rule in INTEGER_RULES:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be {requirement(rule)}, got {type(value).__name__} {value!r}"
        low, high = _RANGES[rule]
        if value < low or (value > high and rule not in ("count", "count_or_zero")):
            return f"must be {requirement(rule)}, got {value}"
        if value > high:
            return f"must be at most {high}, got {value}"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be {requirement(rule)}, got {type(value).__name__} {value!r}"
    if not math.isfinite(value) or value < 0 or (rule == "seconds" and value == 0):
        return f"must be {requirement(rule)}, got {value}"
    if value > MAX_SECONDS:
        return f"must be at most {MAX_SECONDS:.0f} seconds (100 years), got {value}"
    return None


def check(name: str, value: object, rule: Rule, *, optional: bool = False) -> None:
    """Raise `ConfigurationError` naming `name` unless `value` is valid (or None if optional)."""
    if optional and value is None:
        return
    reason = problem(value, rule)
    if reason is not None:
        raise ConfigurationError(f"{name} {reason}")


def check_fields(
    config: object, rules: Mapping[str, Rule], *, optional: tuple[str, ...] = ()
) -> None:
    """`check` each attribute of `config` named in `rules`; `optional` ones may be None."""
    for name, rule in rules.items():
        check(name, getattr(config, name), rule, optional=name in optional)


def parse(text: str, rule: Rule) -> int | float:
    """`text` as a number valid for `rule`, or ValueError saying why not."""
    stripped = text.strip()
    value: int | float
    if rule in INTEGER_RULES:
        try:
            value = int(stripped)
        except ValueError:
            raise ValueError(f"invalid int value: {text!r} (must be {requirement(rule)})") from None
    else:
        try:
            value = float(stripped)
        except ValueError:
            raise ValueError(
                f"invalid float value: {text!r} (must be {requirement(rule)})"
            ) from None
    reason = problem(value, rule)
    if reason is not None:
        raise ValueError(reason.replace(f"got {value}", f"got {text!r}"))
    return value


def flag_type(rule: Rule, env: str | None = None) -> Callable[[str], int | float]:
    """The argparse `type=` of a flag holding a `rule` number (from `env` when not given)."""
    source = f" (from the flag, or from {env} when the flag is not given)" if env else ""

    def convert(text: str) -> int | float:
        try:
            return parse(text, rule)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}{source}") from None

    convert.__name__ = rule
    return convert
