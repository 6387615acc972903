"""Registries for the AsyncAPI tests, built with the real `outbox.Topic` and `Handlers`.

`typed_registry({topic: (payload_type, declared)}, sent)` registers a handler per topic: with
its declared `Topic` when given, else with a callback whose message parameter is annotated
`InboxMessage[payload_type]` (or untyped), and declares `sent` with `handlers.sends`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from outbox import Handlers, InboxMessage, Topic


def _callback(payload_type: Any) -> Any:
    def handle(message: Any, conn: Any) -> None:
        """Handle a message."""

    if payload_type is not None:
        handle.__annotations__ = {"message": InboxMessage[payload_type], "conn": Any}
    return handle


def typed_registry(
    typed: Mapping[str, tuple[Any, Topic[Any] | None]], sent: Iterable[Topic[Any]] = ()
) -> Handlers:
    """A registry with a handler per topic of `typed` ({topic: (payload_type, declared)}) and
    `sent` declared sent."""
    handlers = Handlers()
    for topic, (payload_type, declared) in typed.items():
        handlers.handler(declared if declared is not None else topic)(_callback(payload_type))
    sent = tuple(sent)
    if sent:
        handlers.sends(*sent)
    return handlers
