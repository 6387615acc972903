"""The small contracts the daemons are written against; adapters live in postgres/, kafka/."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from outbox.core.envelope import StoredMessage


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
