"""Properties of `broker.send` over arbitrary arguments (Hypothesis), with a real database.

1. Whatever the arguments, `send` either raises an `OutboxError` (and only that: never a
   UnicodeEncodeError, a psycopg error, a RecursionError...) having written nothing, with the
   caller's transaction still good for another send; or it returns an id, and once the
   transaction commits the row holds exactly what was given.
2. What `send` accepts goes all the way through the relay, the broker, the Consumer and the
   handler unchanged: same topic, key, payload and headers.

The hand-written catalogue of bad inputs and their messages is tests/integration/
test_bad_input.py; this file explores the space around it. One database (and one topic) per
test function, emptied between examples.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from outbox import Broker, Handlers, InboxMessage, OutboxError
from outbox.core.serializers import JSON, TEXT
from outbox.core.wire import text_or_bytes
from outbox.testing import DrainResult, drain
from outbox.testing.plugin import TANSU_CONSUMER_SETTINGS, TopicFactory
from outbox.testing.servers import Servers, TansuBroker

broker = Broker()  # the default limit: 1 MiB of encoded payload
LIMIT = broker.max_payload_bytes

SHARED = {
    "deadline": None,
    "database": None,  # nothing stored under .hypothesis/
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,  # one database per test function, on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
}

#: No "explain" phase (it replays failing examples under coverage: a drain costs a second).
NO_EXPLAIN = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]

# -- strategies ----------------------------------------------------------------------------------

#: Any code point: NUL, lone surrogates and the rest (st.characters() alone leaves out Cs).
ODD = ["\x00", "\ud800", "\udfff", "\udc80", "\ufffe", "\uffff", "\U0010ffff", "é", "€", "\n"]
chars = st.one_of(
    st.sampled_from(ODD),
    st.characters(exclude_categories=()),
    st.characters(categories=["Cs"]),
)
texts = st.text(chars, max_size=30)
odd_bytes = st.one_of(
    st.binary(max_size=30),
    st.sampled_from([b"\x00", b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc", b"a\x00b"]),
)


class HugeText(str):
    """A long str printed as `piece * n`, so that a falsifying example stays readable."""

    def __new__(cls, piece: str, n: int) -> HugeText:
        self = super().__new__(cls, piece * n)
        self.shown = f"{piece!r} * {n}"
        return self

    def __repr__(self) -> str:
        return self.shown

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.shown)


class HugeBytes(bytes):
    """Long bytes printed as `piece * n`."""

    def __new__(cls, piece: bytes, n: int) -> HugeBytes:
        self = super().__new__(cls, piece * n)
        self.shown = f"{piece!r} * {n}"
        return self

    def __repr__(self) -> str:
        return self.shown

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.shown)


def huge(pieces: st.SearchStrategy[Any], top: int = 2_200_000) -> st.SearchStrategy[Any]:
    """A short piece repeated to up to `top` characters or bytes (megabytes, cheaply)."""
    sizes = st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1, 100_000, top]) | st.integers(1, top)

    def build(piece: Any, size: int) -> Any:
        n = max(1, min(size, top) // len(piece))
        return HugeText(piece, n) if isinstance(piece, str) else HugeBytes(piece, n)

    return st.builds(build, pieces.filter(len), sizes)


legal_topics = st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True).filter(
    lambda t: t not in (".", "..")
)
topics = st.one_of(
    legal_topics,
    legal_topics,
    st.sampled_from(["", ".", "..", "a" * 249, "a" * 250, "a b", "t\x00", "t\ud800", "tö"]),
    texts,
    odd_bytes,
    st.none(),
    st.integers(),
)
keys = st.one_of(
    st.none(),
    texts,
    odd_bytes,
    huge(texts, 300_000),
    huge(odd_bytes, 300_000),
    st.integers(),
    st.floats(),
    st.lists(st.integers(), max_size=2),
    st.builds(bytearray, odd_bytes),
)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities are refused
    texts,
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


class Deep(list):  # type: ignore[type-arg]
    """A list `depth` levels deep (json.dumps recurses once per level), printed short."""

    def __init__(self, depth: int) -> None:
        value: list[Any] = []
        for _ in range(depth - 1):
            value = [value]
        super().__init__([value])
        self.depth = depth

    def __repr__(self) -> str:
        return f"Deep({self.depth})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


class Circular(list):  # type: ignore[type-arg]
    """A list that contains itself."""

    def __init__(self) -> None:
        super().__init__()
        self.append(self)

    def __repr__(self) -> str:
        return "Circular()"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


payloads = st.one_of(
    json_values,
    texts,
    odd_bytes,
    huge(texts),
    huge(odd_bytes),
    st.builds(bytearray, odd_bytes),
    st.builds(memoryview, odd_bytes),
    st.dictionaries(st.integers() | st.tuples(st.integers()), json_leaves, max_size=3),
    st.builds(object),
    st.sets(st.integers(), max_size=3),
    st.builds(Deep, st.sampled_from([10, 500, 5_000, 100_000])),
    st.builds(Circular),
)
header_names = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True),
    texts,
    st.sampled_from(["outbox-message-id", "OUTBOX-X", "content-type", "Content-Type", "x\x00"]),
    odd_bytes,
    st.integers(),
)
header_values = st.one_of(
    texts, odd_bytes, huge(texts, 200_000), st.none(), st.integers(), st.lists(texts, max_size=2)
)
headers = st.one_of(
    st.none(),
    st.dictionaries(header_names, header_values, max_size=4),
    st.dictionaries(st.from_regex(r"h[a-z]{0,5}", fullmatch=True), texts | odd_bytes, max_size=4),
    st.lists(st.tuples(texts, texts), max_size=2),
    texts,
    st.integers(),
)
message_ids = st.one_of(
    st.none(),
    st.uuids(),
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: f"{{{u}}}"),
    st.uuids().map(lambda u: f"urn:uuid:{u}"),
    texts,
    odd_bytes,
    st.uuids().map(lambda u: u.bytes),
    st.integers(),
    st.floats(),
)


@dataclass
class SendArgs:
    topic: Any
    payload: Any
    key: Any = None
    headers: Any = None
    message_id: Any = None

    def send(self, conn: psycopg.Connection[Any]) -> uuid.UUID:
        return broker.send(
            conn,
            self.topic,
            self.payload,
            key=self.key,
            headers=self.headers,
            message_id=self.message_id,
        )


send_args = st.builds(
    SendArgs,
    topic=topics,
    payload=payloads,
    key=keys,
    headers=headers,
    message_id=message_ids,
)

# -- what a stored or handled message should hold -------------------------------------------------


def expected_key(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


def expected_payload(payload: Any) -> tuple[Any, str]:
    """(what the payload decodes to, content type): bytes as bytes, str as text, else JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), "application/octet-stream"
    if isinstance(payload, str):
        return payload, TEXT
    return json.loads(json.dumps(payload)), JSON


def decoded(raw: bytes, content_type: str) -> Any:
    if content_type == TEXT:
        return raw.decode()
    if content_type == JSON:
        return json.loads(raw)
    return raw


STORED = """
SELECT topic, key, payload, headers, content_type FROM outbox.producer_queue
WHERE message_id = %s
"""


def stored_headers(stored: dict[str, Any]) -> dict[str, str | bytes]:
    from outbox.core.headers import from_json

    return from_json(stored)


# -- property 1: send refuses cleanly or stores exactly ------------------------------------------


@pytest.fixture
def conn(outbox_database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(outbox_database_url) as connection:
        yield connection


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone()
    assert row is not None
    return int(row[0])


@settings(max_examples=300, **SHARED)
@given(args=send_args)
def test_send_refuses_with_an_outbox_error_or_stores_exactly(
    conn: psycopg.Connection[Any], args: SendArgs
) -> None:
    conn.rollback()  # a failed example may have left the transaction broken
    conn.execute("DELETE FROM outbox.producer_queue")
    conn.commit()
    try:
        message_id = args.send(conn)
    except OutboxError:
        # Nothing was written, and the same transaction still takes a good message.
        assert _count(conn) == 0
        good = broker.send(conn, "good.topic", {"n": 1}, key="k")
        conn.commit()
        assert _count(conn) == 1
        row = conn.execute(STORED, (good,)).fetchone()
        assert row is not None and row[0] == "good.topic"
        return
    # Any other exception escapes here and fails the property: send must raise OutboxError.
    conn.commit()
    assert _count(conn) == 1
    if isinstance(args.message_id, uuid.UUID | str):
        assert message_id == uuid.UUID(str(args.message_id))
    row = conn.execute(STORED, (message_id,)).fetchone()
    assert row is not None
    topic, key, payload, stored, content_type = row
    want_payload, want_type = expected_payload(args.payload)
    assert topic == args.topic
    assert (bytes(key) if key is not None else None) == expected_key(args.key)
    assert content_type == want_type
    assert decoded(bytes(payload), content_type) == want_payload
    assert stored_headers(stored) == dict(args.headers or {})


# -- property 2: what send accepts arrives unchanged at the handler -------------------------------

deliverable_keys = st.one_of(st.none(), texts, odd_bytes, huge(texts, 50_000))
deliverable_payloads = st.one_of(
    json_values, texts, odd_bytes, huge(texts, LIMIT), huge(odd_bytes, LIMIT)
)
deliverable_headers = st.one_of(
    st.none(),
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True) | texts.filter(len),
        texts | odd_bytes,
        max_size=4,
    ),
)


def drain_alone(handlers: Handlers, database_url: str, servers: Servers) -> DrainResult:
    """`drain` through the session's broker, as a consumer group of its own.

    Through Tansu, a drain whose Consumer never received a record (nothing relayed, or the
    only message dead in producer_queue) leaves its group unable to receive in the following
    drains: a group per example keeps one example from failing the next.
    """
    settings = TANSU_CONSUMER_SETTINGS if isinstance(servers.kafka, TansuBroker) else None
    return drain(
        handlers,
        database_url,
        servers.kafka.bootstrap,
        group=f"props-{uuid.uuid4().hex}",
        consumer_kafka_config=settings,
    )


@dataclass
class Recorder:
    """What the handler was called with, by message id."""

    seen: dict[uuid.UUID, list[InboxMessage]] = field(default_factory=dict)

    def handlers(self, topic: str) -> Handlers:
        handlers = Handlers()

        @handlers.handler(topic, max_attempts=1)
        def record(message: InboxMessage, conn: Any) -> None:
            self.seen.setdefault(message.id, []).append(message)

        return handlers


@settings(max_examples=15, phases=NO_EXPLAIN, **SHARED)
@given(
    batch=st.lists(
        st.builds(
            SendArgs,
            topic=st.just(""),  # replaced by the test's topic
            payload=deliverable_payloads,
            key=deliverable_keys,
            headers=deliverable_headers,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_accepted_messages_reach_the_handler_unchanged(
    outbox_database_url: str,
    outbox_servers: Servers,
    outbox_topic_factory: TopicFactory,
    batch: list[SendArgs],
) -> None:
    # A topic per example: what one example left unconsumed is not read by the next.
    outbox_topic = outbox_topic_factory()
    with psycopg.connect(outbox_database_url, autocommit=True) as admin:
        admin.execute("DELETE FROM outbox.producer_queue")
        admin.execute("DELETE FROM outbox.consumer_queue")
    sent: dict[uuid.UUID, SendArgs] = {}
    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        for args in batch:
            args.topic = outbox_topic
            try:
                with conn.transaction():  # a savepoint: a failed send leaves the others
                    sent[args.send(conn)] = args
            except Exception:  # refused (rightly or not): property 1 checks refusals
                pass
    # Nothing accepted: nothing to carry (property 1 covers refusals).
    assume(sent)
    recorder = Recorder()
    result = drain_alone(recorder.handlers(outbox_topic), outbox_database_url, outbox_servers)
    assert result.dead == ()
    assert set(recorder.seen) == set(sent)
    for message_id, args in sent.items():
        (message,) = recorder.seen[message_id]
        want_payload, want_type = expected_payload(args.payload)
        assert message.topic == outbox_topic
        assert message.key == expected_key(args.key)
        assert message.content_type == want_type
        assert message.payload == want_payload
        # Kafka headers carry bytes: a value arrives as text when it is storable UTF-8 text,
        # as bytes otherwise, whatever type it was sent with (docs/inbox.md, "Headers").
        assert message.headers == {
            name: text_or_bytes(value.encode() if isinstance(value, str) else value)
            for name, value in (args.headers or {}).items()
        }
