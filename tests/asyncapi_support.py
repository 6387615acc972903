"""Stand-ins for the typed topics of issue 23 (/work/i23-interface.md), for the AsyncAPI tests.

`FakeTopic` has the attributes `outbox.asyncapi` reads from a `Topic`; `typed_registry` builds a
`Handlers` whose specs carry a payload type and a declared topic (through the `HandlerSpec`
fields when they exist, else through a wrapper) and whose `sent_topics` are given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from outbox import Handlers
from outbox.core.handlers import HandlerSpec


@dataclasses.dataclass(frozen=True)
class FakeTopic:
    """A topic declared once, as `outbox.Topic` will be."""

    name: str
    payload: Any = None
    key: str | Callable[[Any], Any] | None = None
    content_type: str = "application/json"
    description: str = ""


class _TypedSpec:
    """A `HandlerSpec` with `payload_type` and `declared`, for a `HandlerSpec` without them."""

    def __init__(self, spec: HandlerSpec, payload_type: Any, declared: Any) -> None:
        self._spec = spec
        self.payload_type = payload_type
        self.declared = declared

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def _typed(spec: HandlerSpec, payload_type: Any, declared: Any) -> Any:
    fields = {field.name for field in dataclasses.fields(HandlerSpec)}
    if {"payload_type", "declared"} <= fields:
        return dataclasses.replace(spec, payload_type=payload_type, declared=declared)
    return _TypedSpec(spec, payload_type, declared)


class _StandInHandlers(Handlers):
    def __init__(self, typed: Mapping[str, tuple[Any, Any]], sent: Iterable[FakeTopic]) -> None:
        super().__init__()
        self._typed = dict(typed)
        self._sent = tuple(sent)

    def __iter__(self) -> Iterator[HandlerSpec]:
        for spec in super().__iter__():
            yield _typed(spec, *self._typed.get(spec.topic, (None, None)))

    @property
    def sent_topics(self) -> tuple[Any, ...]:  # type: ignore[override,unused-ignore]
        return self._sent


def _handle(message: Any, conn: Any) -> None:
    """Handle a message (a stand-in)."""


def typed_registry(
    typed: Mapping[str, tuple[Any, FakeTopic | None]], sent: Iterable[FakeTopic] = ()
) -> Handlers:
    """A registry with a handler per topic of `typed` ({topic: (payload_type, declared)}) and
    `sent` declared sent."""
    handlers = _StandInHandlers(typed, sent)
    for topic in typed:
        handlers.handler(topic)(_handle)
    return handlers
