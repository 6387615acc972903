"""Properties of typed payloads over generated types (Hypothesis): what a `Topic` accepts, the
same Topic reads back as an equal value; what it would not, it refuses before anything is
written, naming the place. Never: accepted, then refused (or changed) by the handler.

The generated types and values are in tests/typed_support.py; tests/integration/
test_typed_messages.py sends some of them through PostgreSQL and a drain.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from tests.typed_support import Refused, payloads, round_trip

SHARED: dict[str, Any] = {
    "deadline": None,
    "database": None,  # nothing stored under .hypothesis/
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@settings(max_examples=200, **SHARED)
@given(case=payloads())
def test_a_dataclass_of_supported_types_reads_back_equal(case: tuple[type[Any], Any]) -> None:
    back = round_trip(*case)
    assert not isinstance(back, Refused), back.message  # each value here is of its type


@settings(max_examples=200, **SHARED)
@given(case=payloads(hostile=True))
def test_a_dataclass_value_is_refused_at_send_or_reads_back_equal(
    case: tuple[type[Any], Any],
) -> None:
    round_trip(*case)


@settings(max_examples=100, **SHARED)
@given(case=payloads(models=True))
def test_a_model_is_refused_at_send_or_reads_back_equal(case: tuple[type[Any], Any]) -> None:
    round_trip(*case)


@settings(max_examples=100, **SHARED)
@given(case=payloads(hostile=True, models=True))
def test_a_model_of_hostile_values_is_refused_at_send_or_reads_back_equal(
    case: tuple[type[Any], Any],
) -> None:
    round_trip(*case)
