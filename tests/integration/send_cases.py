"""Bad sends that both `Broker.send` and the SQL function `outbox.send` refuse, alike.

Each case is arguments SQL can express too (a text topic, key and tenant, a JSON payload and
headers) over the defaults `topic="ok.topic"`, `payload={"a": 1}`; the error class Python raises
(SQL gives its name as the error's DETAIL, SQLSTATE 22023); a fragment both messages hold; and
whether the two messages are the same text.
The limit of the record is `LIMIT` bytes: `Broker(max_message_bytes=LIMIT)` in Python, the
setting `outbox.max_message_bytes` in SQL.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from outbox import InvalidHeaders, InvalidTopic, OutboxError, PayloadTooLarge

LIMIT = 1024


class BadSend(NamedTuple):
    name: str
    arguments: dict[str, Any]
    error: type[OutboxError]
    fragment: str
    #: Whether SQL's message is Python's word for word (not where it names JSON's types).
    same_text: bool = True


BAD_SENDS: list[BadSend] = [
    BadSend("empty topic", {"topic": ""}, InvalidTopic, "topic must not be empty"),
    BadSend("long topic", {"topic": "t" * 250}, InvalidTopic, "250 characters long"),
    BadSend("dot topic", {"topic": "."}, InvalidTopic, "topic '.' is reserved by Kafka"),
    BadSend("dots topic", {"topic": ".."}, InvalidTopic, "is reserved by Kafka"),
    BadSend("space in topic", {"topic": "a b"}, InvalidTopic, "topic 'a b' contains ' '"),
    BadSend(
        "sql in topic",
        {"topic": "x'); DROP TABLE outbox.producer_queue; --"},
        InvalidTopic,
        "contains ' ', \"'\", ')', ';'; only ASCII",
    ),
    BadSend("unicode topic", {"topic": "café"}, InvalidTopic, "contains 'é'; only ASCII"),
    BadSend(
        "oversized payload",
        {"payload": {"s": "x" * LIMIT}},
        PayloadTooLarge,
        "-byte Kafka record (payload 1032 bytes encoded, key 0 bytes, headers with outbox's own",
    ),
    BadSend(
        "oversized key",
        {"key": "k" * LIMIT},
        PayloadTooLarge,
        "key 1024 bytes, headers with outbox's own",
    ),
    BadSend(
        "oversized headers",
        {"headers": {"h": "v" * 900}},
        PayloadTooLarge,
        "the limit is 1024 bytes",
    ),
    BadSend(
        "number header", {"headers": {"n": 1}}, InvalidHeaders, "header 'n' must be str", False
    ),
    BadSend(
        "null header", {"headers": {"n": None}}, InvalidHeaders, "header 'n' must be str", False
    ),
    BadSend(
        "list headers",
        {"headers": [["a", "b"]]},
        InvalidHeaders,
        "headers must be a mapping",
        False,
    ),
    BadSend("empty header name", {"headers": {"": "v"}}, InvalidHeaders, "non-empty str, got ''"),
    BadSend(
        "reserved header",
        {"headers": {"outbox-message-id": "x"}},
        InvalidHeaders,
        "header name 'outbox-message-id' is reserved by outbox",
    ),
    BadSend(
        "reserved header in capitals",
        {"headers": {"Outbox-Tenant": "x"}},
        InvalidHeaders,
        "header name 'Outbox-Tenant' is reserved by outbox",
    ),
    BadSend(
        "content-type header",
        {"headers": {"Content-Type": "text/plain"}},
        InvalidHeaders,
        "header name 'Content-Type' is reserved by outbox",
    ),
    BadSend(
        "tenant with a slash",
        {"tenant": "a/b"},
        InvalidHeaders,
        "tenant 'a/b' is not valid: a tenant is a database NAME",
    ),
    BadSend("empty tenant", {"tenant": ""}, InvalidHeaders, "tenant '' is not valid"),
    BadSend("long tenant", {"tenant": "t" * 64}, InvalidHeaders, "is not valid"),
    BadSend("tenant starting with a dot", {"tenant": ".t"}, InvalidHeaders, "is not valid"),
]
