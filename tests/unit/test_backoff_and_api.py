"""Backoff policy and the public surface of the package."""

from __future__ import annotations

import pytest

import outbox
from outbox import Backoff, ConfigurationError


def test_backoff_grows_geometrically_and_caps() -> None:
    b = Backoff(initial=1, maximum=10, multiplier=2, jitter=0)
    assert [b.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert b.delay(10_000) == 10


def test_backoff_jitter_stays_within_its_spread() -> None:
    b = Backoff(initial=1, maximum=1, jitter=0.5)
    delays = {b.delay(1) for _ in range(200)}
    assert min(delays) >= 0.5
    assert max(delays) <= 1.5
    assert len(delays) > 1


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"initial": 2, "maximum": 1}, {"multiplier": 0.5}, {"jitter": 2}],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)


def test_public_api_is_small_and_importable() -> None:
    assert "Broker" in outbox.__all__
    for name in outbox.__all__:
        assert getattr(outbox, name) is not None
    # Everything exported is an outbox error, or one of the documented entry points.
    entry_points = {
        "Backoff",
        "Broker",
        "Handlers",
        "InboxMessage",
        "JsonSerializer",
        "Message",
        "Serializer",
        "Topic",
    }
    for name in set(outbox.__all__) - entry_points:
        assert issubclass(getattr(outbox, name), outbox.OutboxError), name
