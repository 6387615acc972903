"""An OpenTelemetry SDK set up once per test process, exporting spans to memory."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_INSTALLED: list[TracerProvider] = []


def in_memory_spans() -> InMemorySpanExporter:
    """The exporter of the process-wide TracerProvider (installed on first call), emptied."""
    if not _INSTALLED:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
        _INSTALLED.append(provider)
    _EXPORTER.clear()
    return _EXPORTER


def tracer() -> trace.Tracer:
    """A tracer of the test's "business code"."""
    return trace.get_tracer("tests.business")
