"""The small contracts the daemons are written against; adapters live in kafka/ and memory.py.

Every transport (Kafka, the in-memory one) passes the same contract suite, tests/transport/.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from outbox.core.envelope import InboxRow, StoredMessage


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """Why one message was not delivered; `permanent` means retrying cannot help."""

    error: str
    permanent: bool = False


class Publisher(Protocol):
    """Sends messages to the transport and reports, per message, whether it was acknowledged.

    `publish` returns only when every message of the batch has a definite outcome: None for
    acknowledged (durably stored by the transport), or a `DeliveryFailure`. Results are in the
    order of the input. Messages of one key must reach the transport in the order given.
    """

    def publish(self, messages: Sequence[StoredMessage]) -> list[DeliveryFailure | None]:
        """Send a batch; one result per message, in order."""
        ...

    def close(self) -> None:
        """Flush what is pending and release the connection."""
        ...


class Subscriber(Protocol):
    """Reads the topics it was created for as a member of one consumer group.

    `poll` returns records in partition order (a key's messages in the order they were
    published), each decoded into the row the inbox stores. A group's position moves on only
    through `commit`: a new subscriber of the group starts after the last committed record of
    each partition, so records polled but never committed are delivered again. Several groups
    each receive every record.
    """

    def poll(self, max_records: int, timeout: float) -> list[InboxRow]:
        """Wait up to `timeout` seconds for a record, then return it and what else is already
        there, up to `max_records`; empty when nothing arrived."""
        ...

    def commit(self, rows: Sequence[InboxRow]) -> None:
        """Record that `rows` are stored: the group resumes after the last of each partition.

        Best effort: a lost commit (logged) only means a redelivery, which the inbox absorbs.
        """
        ...

    def close(self) -> None:
        """Leave the group and release the connection; uncommitted records stay for others."""
        ...
