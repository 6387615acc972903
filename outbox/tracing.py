"""Trace context and correlation ids that travel with a message, from `send` to its handler.

- `broker.send` records the current OpenTelemetry context in the message's headers
  (`traceparent`, `tracestate`, through the configured propagator) and, when called from a
  handler callback, the correlation and causation ids (`outbox-correlation-id`,
  `outbox-causation-id`).
- The Producer relay sends each traced message inside a PRODUCER span, a child of the sender's.
- The Handler runs each callback in a CONSUMER span, a *child* of the sender's context (not a
  link): business transaction, relay and handler are one trace.

OpenTelemetry is optional (the `tracing` extra, `opentelemetry-api`): without it only the
correlation ids are kept, and the cost is one context-variable lookup per message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from functools import cache
from types import TracebackType
from typing import Any, Protocol
from uuid import UUID

from outbox import settings
from outbox.core.envelope import InboxMessage
from outbox.core.headers import TRACEPARENT, from_json
from outbox.ports import DeliveryFailure

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context as _Context
    from opentelemetry.propagators.textmap import Getter as _Getter

    #: Whether opentelemetry-api could be imported; everything below is a no-op without it.
    OTEL = True
except ImportError:  # pragma: no cover - the dev venv has it; tested by hiding the package
    OTEL = False

__all__ = [
    "OTEL",
    "Outgoing",
    "PublishSpans",
    "context_headers",
    "current_message",
    "handling",
    "inherited_ids",
    "publish_spans",
]

#: The message whose callback runs in this context (thread or task), set by the Handler.
_current: ContextVar[InboxMessage[Any] | None] = ContextVar("outbox_current_message", default=None)

MESSAGING_SYSTEM = "kafka"


def current_message() -> InboxMessage[Any] | None:
    """The message whose handler callback is running in this context, or None."""
    return _current.get()


def inherited_ids(correlation_id: UUID | str | None) -> tuple[UUID | str | None, UUID | None]:
    """(correlation id, causation id) of a message sent now.

    Inside a handler callback: the handled message's correlation id (unless the sender gave
    one) and its id as the causation. Outside: the given correlation id (None: the message
    will be its own correlation) and no causation.
    """
    handled = _current.get()
    if handled is None:
        return correlation_id, None
    return (correlation_id if correlation_id is not None else handled.correlation_id), handled.id


def context_headers(headers: object) -> dict[str, str] | None:
    """Headers carrying the current trace context, or None (no OpenTelemetry, no active span,
    or the sender supplied its own `traceparent`, which then wins)."""
    if not OTEL:
        return None
    if not _trace.get_current_span().get_span_context().is_valid:
        return None
    if isinstance(headers, Mapping) and any(
        isinstance(name, str) and name.lower() == TRACEPARENT for name in headers
    ):
        return None
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return carrier


class handling:  # lower case: used like a function, `with tracing.handling(message):`
    """Run a handler callback for `message`: the current message for `broker.send`, and (with
    an OpenTelemetry SDK installed) a CONSUMER span whose parent is the sender's context."""

    __slots__ = ("_message", "_span", "_token")

    def __init__(self, message: InboxMessage[Any]) -> None:
        self._message = message
        self._span: AbstractContextManager[Any] | None = None

    def __enter__(self) -> None:
        self._token = _current.set(self._message)
        if OTEL and _sdk_installed():
            self._span = _consumer_span(self._message)
            self._span.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._span is not None:
                self._span.__exit__(exc_type, exc, tb)
        finally:
            _current.reset(self._token)


class PublishSpans:
    """PRODUCER spans of the traced messages of one batch, ended with their delivery outcome."""

    def __init__(self, spans: list[tuple[int, Any]]) -> None:
        self._spans = spans

    def outcomes(self, results: Sequence[DeliveryFailure | None]) -> None:
        """End every span: OK when its message was acknowledged, ERROR with the reason if not."""
        for index, span in self._spans:
            failure = results[index]
            if failure is not None:
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, failure.error))
            span.end()
        self._spans = []

    def __enter__(self) -> PublishSpans:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Spans still open (publish raised) end as errors."""
        for _, span in self._spans:
            if exc is not None:
                span.record_exception(exc)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, "publish did not complete"))
            span.end()
        self._spans = []


_NO_SPANS = PublishSpans([])


class Outgoing(Protocol):
    """What the relay publishes: a `StoredMessage`, or a fetched row whose headers are the
    stored JSON text (None when there are none)."""

    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def message_id(self) -> object: ...
    @property
    def attempts(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str | bytes] | str | None: ...


def publish_spans(messages: Sequence[Outgoing]) -> PublishSpans:
    """Start a PRODUCER span for each message that carries a trace context."""
    if not OTEL or not _sdk_installed():
        return _NO_SPANS
    spans = []
    for index, message in enumerate(messages):
        headers = _traced(message.headers)
        if headers is not None:
            spans.append((index, _producer_span(message, headers)))
    return PublishSpans(spans) if spans else _NO_SPANS


def _traced(headers: Mapping[str, str | bytes] | str | None) -> Mapping[str, str | bytes] | None:
    """The headers, decoded if need be, when they carry a trace context; else None."""
    if headers is None or TRACEPARENT not in headers:
        return None  # on JSON text a substring test: cheap, and never wrong when it says no
    if isinstance(headers, str):
        headers = from_json(json.loads(headers))
        if TRACEPARENT not in headers:
            return None
    return headers


# -- OpenTelemetry details ---------------------------------------------------------------------


class _Sdk:
    """Whether the application installed a TracerProvider. Without one every span would be a
    no-op, and outbox skips making them: a no-op span still costs ~10 us per message, and even
    `get_tracer_provider()` a few (it looks up an environment variable on every call)."""

    seen = False
    #: Read the global directly where this version of opentelemetry-api has it, and when the
    #: provider cannot come from the environment; else ask the public (slower) function.
    direct = (
        OTEL
        and hasattr(_trace, "_TRACER_PROVIDER")
        and not os.environ.get(settings.OTEL_TRACER_PROVIDER)
    )


def _sdk_installed() -> bool:
    """Whether spans are worth making; once an SDK is installed it stays (OpenTelemetry
    refuses to replace a global TracerProvider)."""
    if _Sdk.seen:
        return True
    provider = _trace._TRACER_PROVIDER if _Sdk.direct else _trace.get_tracer_provider()
    _Sdk.seen = provider is not None and not isinstance(provider, _NO_SDK)
    return _Sdk.seen


@cache
def _tracer() -> Any:
    """outbox's tracer (a proxy until the application installs a TracerProvider)."""
    return _trace.get_tracer("outbox")


if OTEL:
    _NO_SDK = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)

    class _HeaderGetter(_Getter[Mapping[str, str | bytes]]):
        """Reads message headers for the propagator; bytes values are decoded as UTF-8."""

        def get(self, carrier: Mapping[str, str | bytes], key: str) -> list[str] | None:
            value = carrier.get(key)
            if value is None:
                return None
            return [value if isinstance(value, str) else value.decode(errors="replace")]

        def keys(self, carrier: Mapping[str, str | bytes]) -> list[str]:
            return list(carrier)

    _GETTER = _HeaderGetter()


def _sender_context(headers: Mapping[str, str | bytes]) -> Any:
    """The trace context recorded by the sender; an empty context when there is none."""
    return _propagate.extract(headers, context=_Context(), getter=_GETTER)


def _consumer_span(message: InboxMessage[Any]) -> AbstractContextManager[Any]:
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": message.topic,
        "messaging.message.id": str(message.id),
        "messaging.message.conversation_id": str(message.correlation_id),
        "outbox.attempt": message.attempt,
    }
    if message.key is not None:
        attributes["messaging.kafka.message.key"] = message.key.decode(errors="replace")
    if message.partition is not None:
        attributes["messaging.destination.partition.id"] = str(message.partition)
    if message.offset is not None:
        attributes["messaging.kafka.offset"] = message.offset
    if message.causation_id is not None:
        attributes["outbox.causation_id"] = str(message.causation_id)
    span: AbstractContextManager[Any] = _tracer().start_as_current_span(
        f"process {message.topic}",
        context=_sender_context(message.headers),
        kind=_trace.SpanKind.CONSUMER,
        attributes=attributes,
    )
    return span


def _producer_span(message: Outgoing, headers: Mapping[str, str | bytes]) -> Any:
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": message.topic,
        "messaging.message.id": str(message.message_id),
        "outbox.attempt": message.attempts + 1,
    }
    if message.key is not None:
        attributes["messaging.kafka.message.key"] = message.key.decode(errors="replace")
    return _tracer().start_span(
        f"send {message.topic}",
        context=_sender_context(headers),
        kind=_trace.SpanKind.PRODUCER,
        attributes=attributes,
    )
