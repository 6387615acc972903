"""Pure checks of what `Broker.send` accepts, without any server."""

from __future__ import annotations

import uuid

import pytest

from outbox import (
    Broker,
    ConfigurationError,
    InvalidHeaders,
    InvalidKey,
    InvalidTopic,
    OutboxError,
    PayloadTooLarge,
    SerializationError,
)
from outbox.core.envelope import compose
from outbox.core.headers import from_json, to_json, validate_headers
from outbox.core.lanes import LANES, lane_for
from outbox.core.serializers import BYTES, JSON, TEXT, JsonSerializer, decode_payload
from outbox.core.topics import validate_topic


def _compose(topic: object = "t", payload: object = b"x", **kw: object) -> object:
    args: dict[str, object] = {"key": None, "headers": None, "message_id": None}
    args.update(kw)
    return compose(
        topic,
        payload,
        serializer=JsonSerializer(),
        max_message_bytes=int(args.pop("limit", 1000)),  # type: ignore[call-overload]
        **args,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("topic", "fragment"),
    [
        ("", "must not be empty"),
        ("a" * 250, "250 characters long"),
        ("orders created", "' '"),
        ("orders;DROP TABLE x", "';'"),
        ("orders'--", '"\'"'),
        ("ordérs", "'é'"),
        (".", "reserved"),
        (None, "must be a str"),
        (42, "must be a str"),
    ],
)
def test_topics_kafka_refuses_are_rejected(topic: object, fragment: str) -> None:
    with pytest.raises(InvalidTopic) as info:
        validate_topic(topic)
    assert fragment in str(info.value)


@pytest.mark.parametrize("topic", ["a", "orders.created", "A-b_c.9", "x" * 249])
def test_legal_topics_pass(topic: str) -> None:
    assert validate_topic(topic) == topic


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ([("a", "b")], "must be a mapping"),
        ({"a": 1}, "'a' must be str or bytes, got int"),
        ({"a": None}, "got NoneType"),
        ({1: "x"}, "non-empty str"),
        ({"": "x"}, "non-empty str"),
        ({"outbox-message-id": "x"}, "reserved"),
        ({"Content-Type": "x"}, "reserved"),
    ],
)
def test_bad_headers_are_rejected(headers: object, fragment: str) -> None:
    with pytest.raises(InvalidHeaders) as info:
        validate_headers(headers)
    assert fragment in str(info.value)


def test_headers_round_trip_through_their_stored_form() -> None:
    headers = {"trace": "abc", "blob": b"\x00\xff", "empty": ""}
    assert from_json(to_json(headers)) == headers


def test_payload_forms_and_content_types() -> None:
    serializer = JsonSerializer()
    for payload, content_type in [(b"\x00raw", BYTES), ("text é", TEXT), ({"a": [1, 2]}, JSON)]:
        message = _compose(payload=payload, limit=1000)
        assert message.content_type == content_type  # type: ignore[attr-defined]
        decoded = decode_payload(message.payload, content_type, serializer)  # type: ignore[attr-defined]
        assert decoded == payload


@pytest.mark.parametrize("payload", [object(), {"a": {1, 2}}, float("nan")])
def test_unserializable_payloads_raise_serialization_error(payload: object) -> None:
    with pytest.raises(SerializationError) as info:
        _compose(payload=payload, limit=1000)
    assert "JSON" in str(info.value)


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_a_payload_nested_too_deeply_raises_serialization_error(depth: int) -> None:
    """json.dumps raises RecursionError past Python's recursion limit: a caller catching
    OutboxError around send would have seen it escape (found by test_send_properties)."""
    with pytest.raises(SerializationError, match="nested too deeply"):
        _compose(payload=_nested(depth), limit=10_000_000)


def test_json_nested_too_deeply_to_decode_raises_serialization_error() -> None:
    data = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(SerializationError, match="nested too deeply"):
        JsonSerializer().loads(data)


def test_the_limit_bounds_the_whole_record_and_names_the_sizes() -> None:
    from outbox.core.envelope import HEADER_OVERHEAD_BYTES, record_size

    key, headers = b"k" * 10, {"h": "v" * 20, "blob": b"\x00" * 30}
    base = record_size(key, b"", BYTES, headers)
    # Each header costs its name, its value and HEADER_OVERHEAD_BYTES; outbox adds three.
    assert base == 10 + (1 + 20 + 4 + 30 + 2 * HEADER_OVERHEAD_BYTES) + record_size(
        None, b"", BYTES, {}
    )
    limit = base + 100
    message = _compose(key=key, headers=headers, payload=b"x" * 100, limit=limit)
    assert record_size(message.key, message.payload, BYTES, message.headers) == limit  # type: ignore[attr-defined]
    with pytest.raises(PayloadTooLarge) as info:
        _compose(topic="big.one", key=key, headers=headers, payload=b"x" * 101, limit=limit)
    text = str(info.value)
    assert "'big.one'" in text and f"{limit + 1}-byte" in text and f"{limit} bytes" in text
    assert "payload 101 bytes" in text and "key 10 bytes" in text
    # Header bytes count as much as payload bytes: a big header is refused too.
    with pytest.raises(PayloadTooLarge, match="headers"):
        _compose(headers={"h": "v" * 2000}, payload=b"", limit=1000)
    with pytest.raises(PayloadTooLarge):
        _compose(key=b"k" * 2000, payload=b"", limit=1000)


def test_the_default_limit_fits_librdkafkas_default_message_max_bytes() -> None:
    from outbox.core.envelope import (
        DEFAULT_MAX_MESSAGE_BYTES,
        LIBRDKAFKA_MESSAGE_MAX_BYTES,
        RECORD_OVERHEAD_BYTES,
    )

    assert Broker().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES
    assert DEFAULT_MAX_MESSAGE_BYTES + RECORD_OVERHEAD_BYTES == LIBRDKAFKA_MESSAGE_MAX_BYTES
    # librdkafka counts 36 bytes of record framing, a record batch header is 61 bytes.
    assert RECORD_OVERHEAD_BYTES >= 36 + 61
    with pytest.raises(PayloadTooLarge):
        Broker()._compose("t", b"x" * DEFAULT_MAX_MESSAGE_BYTES, None, None, None)


def test_max_payload_bytes_is_an_alias_of_max_message_bytes() -> None:
    assert Broker(max_payload_bytes=5000).max_message_bytes == 5000
    assert Broker(max_message_bytes=5000).max_payload_bytes == 5000
    with pytest.raises(ConfigurationError, match="not both"):
        Broker(max_message_bytes=5000, max_payload_bytes=5000)
    with pytest.raises(ConfigurationError, match="max_message_bytes"):
        Broker(max_message_bytes=0)


def test_keys_and_message_ids() -> None:
    with pytest.raises(InvalidKey):
        _compose(key=42)
    with pytest.raises(OutboxError, match="not a UUID"):
        _compose(message_id="nope")
    mid = uuid.uuid4()
    message = _compose(key="k", message_id=str(mid))
    assert message.message_id == mid  # type: ignore[attr-defined]
    assert message.key == b"k"  # type: ignore[attr-defined]


def test_lanes_are_stable_per_key_and_in_range() -> None:
    ids = [uuid.uuid4() for _ in range(200)]
    lanes_of_k = {lane_for(b"order-1", i) for i in ids}
    assert len(lanes_of_k) == 1
    spread = {lane_for(None, i) for i in ids}
    assert len(spread) > LANES // 2
    assert all(0 <= lane < LANES for lane in spread)


def test_broker_options_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        Broker(schema="bad-schema; drop")
    with pytest.raises(ConfigurationError, match="max_payload_bytes"):
        Broker(max_payload_bytes=0)


def test_send_many_rejects_duplicate_ids_and_names_the_bad_item() -> None:
    from outbox import Message

    broker = Broker()
    mid = uuid.uuid4()
    with pytest.raises(OutboxError, match="same message_id twice"):
        broker.send_many(
            object(), [Message("t", 1, message_id=mid), Message("t", 2, message_id=mid)]
        )
    with pytest.raises(InvalidTopic, match="item 1"):
        broker.send_many(object(), [Message("t", 1), Message("bad topic", 2)])


def test_message_ids_are_uuid7_and_ordered_by_time() -> None:
    import time

    from outbox.core.ids import uuid7

    first = uuid7()
    time.sleep(0.002)
    ids = [uuid7() for _ in range(1000)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == 1000
    assert all(first < i for i in ids)  # a later millisecond sorts later
    assert abs(int(ids[0].int >> 80) - time.time() * 1000) < 5000


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ({"a\x00": "v"}, "header name"),
        ({"\udcff": "v"}, "header name"),
        ({"h": "\x00"}, "use bytes for binary values"),
        ({"h": "x\ud83d"}, "use bytes for binary values"),
    ],
)
def test_headers_postgresql_cannot_store_are_rejected(headers: object, fragment: str) -> None:
    with pytest.raises(InvalidHeaders) as info:
        validate_headers(headers)
    assert fragment in str(info.value)


def test_bytes_header_values_may_hold_anything() -> None:
    assert validate_headers({"h": b"\x00\xed\xb0\x80"}) == {"h": b"\x00\xed\xb0\x80"}


def test_unencodable_keys_and_payloads_name_the_problem() -> None:
    with pytest.raises(InvalidKey, match="lone surrogate"):
        _compose(key="k\udc80")
    for payload in ["\udc80", {"a": ["\ud800"]}, float("inf")]:
        with pytest.raises(SerializationError, match=r"'the\.topic'"):
            _compose(topic="the.topic", payload=payload, limit=1000)


def test_a_serializer_raising_its_own_error_type_becomes_serialization_error() -> None:
    class Strict:
        content_type = "application/x-strict"

        def dumps(self, payload: object) -> bytes:
            raise TypeError("no thanks")

        def loads(self, data: bytes) -> object:
            return data

    with pytest.raises(SerializationError, match=r"Strict.*no thanks"):
        compose(
            "t",
            {"a": 1},
            key=None,
            headers=None,
            message_id=None,
            serializer=Strict(),
            max_message_bytes=1000,
        )
