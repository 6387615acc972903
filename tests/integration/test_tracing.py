"""Trace context and correlation ids through the real relay, broker, inbox and handler."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import Broker, Handlers, InboxMessage
from outbox.core.headers import CAUSATION_ID, CORRELATION_ID
from outbox.testing.plugin import Drain, TopicFactory

from ..otel_support import in_memory_spans, tracer

broker = Broker()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return in_memory_spans()


def chain(
    first: str, second: str, seen: list[InboxMessage], *, run_async: bool = False
) -> Handlers:
    """`first`'s handler sends a message to `second`; both note what they handled in `seen`."""
    handlers = Handlers()

    if run_async:

        @handlers.handler(first)
        async def forward_async(message: InboxMessage, conn: psycopg.AsyncConnection[Any]) -> None:
            seen.append(message)
            await broker.send_async(conn, second, {"from": str(message.id)})

    else:

        @handlers.handler(first)
        def forward(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
            seen.append(message)
            broker.send(conn, second, {"from": str(message.id)})

    @handlers.handler(second)
    def arrive(message: InboxMessage, conn: Any) -> None:
        seen.append(message)

    return handlers


def by_name(spans: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    finished = spans.get_finished_spans()
    named = {s.name: s for s in finished}
    assert len(named) == len(finished), [s.name for s in finished]
    return named


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def parent_id(span: ReadableSpan) -> int | None:
    return int(span.parent.span_id) if span.parent is not None else None


def test_one_trace_from_the_business_transaction_through_kafka_to_the_handlers(
    outbox_database_url: str,
    outbox_drain: Drain,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: TopicFactory,
    spans: InMemorySpanExporter,
) -> None:
    orders, invoices = outbox_topic_factory(), outbox_topic_factory()
    seen: list[InboxMessage] = []
    with tracer().start_as_current_span("place order") as business:
        with psycopg.connect(outbox_database_url) as conn, conn.transaction():
            sent = broker.send(conn, orders, {"order": 42}, key="order-42")
    result = outbox_drain(chain(orders, invoices, seen), transport=outbox_kafka_bootstrap)
    assert result.handled == 2 and result.dead == ()

    named = by_name(spans)
    assert set(named) == {
        "place order",
        f"send {orders}",
        f"process {orders}",
        f"send {invoices}",
        f"process {invoices}",
    }
    trace_id = business.get_span_context().trace_id
    assert {s.context.trace_id for s in named.values() if s.context} == {trace_id}
    # The relay and the handler are children of the business span; the second hop is a child
    # of the first handler's span, in which it was sent.
    assert parent_id(named[f"send {orders}"]) == span_id(named["place order"])
    handler = named[f"process {orders}"]
    assert parent_id(handler) == span_id(named["place order"])
    assert handler.kind is trace.SpanKind.CONSUMER
    assert parent_id(named[f"send {invoices}"]) == span_id(handler)
    assert parent_id(named[f"process {invoices}"]) == span_id(handler)
    attributes = dict(handler.attributes or {})
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.destination.name"] == orders
    assert attributes["messaging.message.id"] == str(sent)
    assert attributes["messaging.kafka.message.key"] == "order-42"

    first, second = seen
    assert (first.id, first.correlation_id, first.causation_id) == (sent, sent, None)
    assert second.causation_id == sent and second.correlation_id == sent
    assert second.headers[CAUSATION_ID] == str(sent)


def test_without_an_active_span_nothing_breaks_and_no_trace_context_is_sent(
    outbox_database_url: str, outbox_drain: Drain, spans: InMemorySpanExporter
) -> None:
    seen: list[InboxMessage] = []
    given = uuid.uuid4()
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        broker.send(conn, "orders.created", {"order": 1}, correlation_id=given)
        row = conn.execute("SELECT headers FROM outbox.producer_queue").fetchone()
    assert row is not None and row[0] == {CORRELATION_ID: str(given)}
    result = outbox_drain(chain("orders.created", "invoices.due", seen))
    assert result.handled == 2
    first, second = seen
    assert "traceparent" not in first.headers
    assert first.correlation_id == given and second.correlation_id == given
    assert second.causation_id == first.id
    # Each handler span starts a trace of its own; the second hop continues the first's.
    named = by_name(spans)
    assert named["process orders.created"].parent is None
    assert parent_id(named["process invoices.due"]) == span_id(named["process orders.created"])


def test_async_handlers_pass_the_ids_on_too(
    outbox_database_url: str, outbox_drain: Drain, spans: InMemorySpanExporter
) -> None:
    seen: list[InboxMessage] = []
    with tracer().start_as_current_span("import"):
        with psycopg.connect(outbox_database_url) as conn, conn.transaction():
            sent = broker.send(conn, "rows.imported", {"n": 1})
    outbox_drain(chain("rows.imported", "rows.indexed", seen, run_async=True))
    first, second = seen
    assert second.causation_id == sent and second.correlation_id == first.correlation_id == sent
    named = by_name(spans)
    assert parent_id(named["process rows.imported"]) == span_id(named["import"])
    assert parent_id(named["process rows.indexed"]) == span_id(named["process rows.imported"])
    # The inbox stored each message's trace context; its rows left the inbox once handled
    # (decision 17), so the handled messages show the headers they were stored with.
    assert "traceparent" in first.headers and "traceparent" in second.headers
