"""The in-memory transport, for fast unit tests: kept importable here for users.

It lives in `outbox.testing.memory`, beside the other testing helpers.
"""

from __future__ import annotations

from outbox.testing.memory import (
    InMemoryPublisher,
    InMemorySubscriber,
    InMemoryTransport,
    Record,
    murmur2,
    partition_for,
)

__all__ = [
    "InMemoryPublisher",
    "InMemorySubscriber",
    "InMemoryTransport",
    "Record",
    "murmur2",
    "partition_for",
]
