"""Trace context and correlation ids in the headers, without servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import InboxMessage, tracing
from outbox.broker import Broker
from outbox.core.envelope import StoredMessage, compose
from outbox.core.errors import InvalidHeaders, OutboxError
from outbox.core.headers import CAUSATION_ID, CORRELATION_ID
from outbox.core.serializers import JsonSerializer
from outbox.ports import DeliveryFailure

from ..otel_support import in_memory_spans, tracer

SENDER_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return in_memory_spans()


def outgoing(headers: Any = None, **kwargs: Any) -> Any:
    """What `broker.send` would write (compose with the tracing context), without a database."""
    return Broker()._compose("orders.created", {"n": 1}, None, headers, None, **kwargs)


def inbox_message(headers: dict[str, str | bytes] | None = None) -> InboxMessage:
    now = datetime.now(UTC)
    return InboxMessage(
        id=uuid.uuid4(),
        topic="orders.created",
        key=b"order-1",
        payload={},
        raw_payload=b"{}",
        content_type="application/json",
        headers=headers or {},
        attempt=1,
        created_at=now,
        received_at=now,
        partition=2,
        offset=7,
    )


def test_send_records_the_current_span_in_w3c_headers(spans: InMemorySpanExporter) -> None:
    with tracer().start_as_current_span("business") as span:
        message = outgoing({"tenant": "acme"})
    context = span.get_span_context()
    version, trace_id, span_id, flags = str(message.headers["traceparent"]).split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    assert int(trace_id, 16) == context.trace_id
    assert int(span_id, 16) == context.span_id
    assert message.headers["tenant"] == "acme"


def test_without_an_active_span_no_trace_headers_are_added(spans: InMemorySpanExporter) -> None:
    message = outgoing()
    assert message.headers == {}
    assert tracing.context_headers(None) is None


def test_a_traceparent_given_by_the_sender_wins(spans: InMemorySpanExporter) -> None:
    with tracer().start_as_current_span("business"):
        message = outgoing({"traceparent": SENDER_TRACEPARENT})
    assert message.headers == {"traceparent": SENDER_TRACEPARENT}  # no tracestate added either


def test_the_tracestate_of_the_span_travels_too(spans: InMemorySpanExporter) -> None:
    parent = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("vendor", "value")]),
    )
    with trace.use_span(trace.NonRecordingSpan(parent)):
        message = outgoing()
    assert message.headers["tracestate"] == "vendor=value"


def test_handling_runs_the_callback_in_a_consumer_span_child_of_the_sender(
    spans: InMemorySpanExporter,
) -> None:
    message = inbox_message({"traceparent": SENDER_TRACEPARENT})
    with tracing.handling(message):
        inside = trace.get_current_span().get_span_context()
        assert tracing.current_message() is message
    assert tracing.current_message() is None
    (span,) = spans.get_finished_spans()
    assert span.name == "process orders.created"
    assert span.kind is trace.SpanKind.CONSUMER
    assert span.context is not None and span.context.span_id == inside.span_id
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "orders.created",
        "messaging.message.id": str(message.id),
        "messaging.message.conversation_id": str(message.id),
        "messaging.kafka.message.key": "order-1",
        "messaging.destination.partition.id": "2",
        "messaging.kafka.offset": 7,
        "outbox.attempt": 1,
    }


def test_a_failing_callback_marks_its_span_as_an_error(spans: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError, match="boom"), tracing.handling(inbox_message()):
        raise ValueError("boom")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.parent is None  # no trace context in the headers: a new trace
    assert [e.name for e in span.events] == ["exception"]


def test_a_message_sent_from_a_handler_names_its_cause_and_conversation(
    spans: InMemorySpanExporter,
) -> None:
    handled = inbox_message()
    assert handled.correlation_id == handled.id and handled.causation_id is None
    with tracing.handling(handled):
        first = outgoing()
    assert first.headers[CAUSATION_ID] == str(handled.id)
    assert first.headers[CORRELATION_ID] == str(handled.id)
    # the next hop keeps the conversation of the first message
    received = inbox_message({k: v for k, v in first.headers.items() if k.startswith("outbox-")})
    with tracing.handling(received):
        second = outgoing()
    assert second.headers[CORRELATION_ID] == str(handled.id)
    assert second.headers[CAUSATION_ID] == str(received.id)
    assert received.correlation_id == handled.id
    assert received.causation_id == handled.id


def test_outside_a_handler_the_correlation_id_is_the_message_itself_unless_given() -> None:
    message = outgoing()
    assert CORRELATION_ID not in message.headers and CAUSATION_ID not in message.headers
    given = uuid.uuid4()
    assert outgoing(correlation_id=given).headers[CORRELATION_ID] == str(given)
    assert outgoing(correlation_id=str(given)).headers[CORRELATION_ID] == str(given)
    with pytest.raises(OutboxError, match="correlation_id 'nope' is not a UUID"):
        outgoing(correlation_id="nope")
    own = uuid.uuid4()
    kept = compose(
        "t",
        {},
        key=None,
        headers=None,
        message_id=own,
        serializer=JsonSerializer(),
        max_message_bytes=1000,
        correlation_id=own,
    )
    assert kept.headers == {}  # "its own id" is what an absent header means


def test_reserved_id_headers_cannot_be_set_by_hand() -> None:
    with pytest.raises(InvalidHeaders, match="reserved"):
        outgoing({CORRELATION_ID: str(uuid.uuid4())})


def test_foreign_or_broken_id_headers_are_ignored() -> None:
    message = inbox_message({CORRELATION_ID: "not-a-uuid", CAUSATION_ID: b"\xff"})
    assert message.correlation_id == message.id
    assert message.causation_id is None


def test_the_current_message_is_per_async_task() -> None:
    first, second = inbox_message(), inbox_message()

    async def handle(message: InboxMessage) -> uuid.UUID | None:
        with tracing.handling(message):
            await asyncio.sleep(0.01)
            current = tracing.current_message()
            return current.id if current else None

    async def both() -> list[uuid.UUID | None]:
        return list(await asyncio.gather(handle(first), handle(second)))

    assert asyncio.run(both()) == [first.id, second.id]


def test_publish_spans_end_with_the_delivery_outcome(spans: InMemorySpanExporter) -> None:
    def stored(headers: dict[str, str | bytes]) -> StoredMessage:
        return StoredMessage(
            id=1,
            message_id=uuid.uuid4(),
            topic="orders.created",
            key=None,
            payload=b"{}",
            content_type="application/json",
            headers=headers,
            created_at=datetime.now(UTC),
            attempts=0,
        )

    traced: dict[str, str | bytes] = {"traceparent": SENDER_TRACEPARENT}
    rows = [stored(traced), stored({}), stored(traced)]
    with tracing.publish_spans(rows) as publishing:
        publishing.outcomes([None, None, DeliveryFailure("MSG_TIMED_OUT: gone")])
    finished = spans.get_finished_spans()
    assert [s.name for s in finished] == ["send orders.created"] * 2  # untraced: no span
    assert {s.kind for s in finished} == {trace.SpanKind.PRODUCER}
    assert all(s.parent and s.parent.span_id == 0xB7AD6B7169203331 for s in finished)
    assert [s.status.status_code for s in finished] == [
        trace.StatusCode.UNSET,
        trace.StatusCode.ERROR,
    ]


def test_without_opentelemetry_nothing_is_traced_and_ids_still_flow(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    monkeypatch.setattr(tracing, "OTEL", False)
    handled = inbox_message({"traceparent": SENDER_TRACEPARENT})
    with tracer().start_as_current_span("business"), tracing.handling(handled):
        message = outgoing()
    assert set(message.headers) == {CORRELATION_ID, CAUSATION_ID}
    assert [s.name for s in spans.get_finished_spans()] == ["business"]


def test_outbox_works_when_opentelemetry_is_not_installed() -> None:
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the package were not installed
from outbox import Broker, tracing
assert tracing.OTEL is False
message = Broker()._compose("t", {}, None, {"a": "b"}, None)
assert message.headers == {"a": "b"}, message.headers
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_publish_spans_read_headers_stored_as_json_text(spans: InMemorySpanExporter) -> None:
    class Row(NamedTuple):  # the relay's fetched row: headers as the stored JSON, or None
        topic: str
        key: bytes | None
        message_id: str
        attempts: int
        headers: str | None

    rows = [
        Row("t", b"k", "m1", 0, json.dumps({"traceparent": SENDER_TRACEPARENT})),
        Row("t", None, "m2", 0, None),
        Row("t", None, "m3", 2, json.dumps({"note": "traceparent"})),
    ]
    with tracing.publish_spans(rows) as publishing:
        publishing.outcomes([None, None, None])
    (span,) = spans.get_finished_spans()
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    assert dict(span.attributes or {})["messaging.message.id"] == "m1"
