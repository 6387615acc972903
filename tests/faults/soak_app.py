"""The handlers of a test service, run by `outbox handler tests.faults.soak_app:handlers`.

Configured by environment variables (each daemon process is one service):

- FAULTS_APP_SERVICE: the service's name; its tables are `<name>_received` and `<name>_sent`.
- FAULTS_APP_SCHEMA: the outbox schema of the service (for `broker.send` of replies).
- FAULTS_APP_TOPICS: comma-separated topics this service handles.
- FAULTS_APP_REPLIES: comma-separated `in=out`: a message on `in` whose payload says
  {"reply": true} is answered on `out`, with `broker.send` in the handler transaction.

A handled message inserts one row into `<name>_received` in the handler's transaction (no
unique constraint: a message handled twice shows as two rows). A payload {"fail": kind}
raises an exception whose text is odd (a NUL, a lone surrogate, ...) on every attempt, so the
message goes dead after MAX_ATTEMPTS. A payload that is not a soak message (a poison record
that decoded after all) is refused, so it goes dead too.
"""

from __future__ import annotations

import os
from typing import Any

from outbox import Broker, Handlers, InboxMessage
from outbox.core.retry import Backoff

MAX_ATTEMPTS = 3
BACKOFF = Backoff(initial=0.2, maximum=1.0)

#: Exception texts a handler may raise; none of them can be stored as-is in a text column.
ODD_TEXTS = {
    "nul": "failed \x00 with a NUL inside",
    "surrogate": "failed with a lone surrogate \udcff here",
    "high_surrogate": "\ud800",
    "nul_only": "\x00",
    "mixed": "bad \x00\udc80\x01\x7f bytes \U0001f4a5 and a very long tail " + "x" * 5000,
}


def tables(service: str) -> str:
    """DDL of a service's own tables (in the public schema of its database)."""
    return f"""
CREATE TABLE IF NOT EXISTS {service}_received (
    n bigserial PRIMARY KEY, message_id uuid NOT NULL, topic text NOT NULL, key text,
    seq int, attempt int, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {service}_sent (
    message_id uuid PRIMARY KEY, topic text NOT NULL, key text NOT NULL, seq int NOT NULL,
    fail text, reply boolean NOT NULL DEFAULT false,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


SERVICE = os.environ.get("FAULTS_APP_SERVICE", "svc")
SCHEMA = os.environ.get("FAULTS_APP_SCHEMA", "outbox")
TOPICS = [t for t in os.environ.get("FAULTS_APP_TOPICS", "").split(",") if t]
REPLIES = dict(
    pair.split("=", 1) for pair in os.environ.get("FAULTS_APP_REPLIES", "").split(",") if pair
)

broker = Broker(schema=SCHEMA)
handlers = Handlers()


def _handle(message: InboxMessage, conn: Any) -> None:
    body = message.payload
    if not isinstance(body, dict) or "seq" not in body or "key" not in body:
        raise ValueError(f"not a soak message: {message.raw_payload[:40]!r}")
    if body.get("fail"):
        raise RuntimeError(ODD_TEXTS.get(body["fail"], body["fail"]))
    conn.execute(
        f"INSERT INTO {SERVICE}_received (message_id, topic, key, seq, attempt)"
        " VALUES (%s, %s, %s, %s, %s)",
        (message.id, message.topic, body["key"], body["seq"], message.attempt),
    )
    out = REPLIES.get(message.topic)
    if out and body.get("reply"):
        key = f"r-{body['key']}"
        reply_id = broker.send(conn, out, {"key": key, "seq": body["seq"]}, key=key)
        conn.execute(
            f"INSERT INTO {SERVICE}_sent (message_id, topic, key, seq) VALUES (%s, %s, %s, %s)",
            (reply_id, out, key, body["seq"]),
        )


for _topic in TOPICS:
    handlers.handler(_topic, max_attempts=MAX_ATTEMPTS, backoff=BACKOFF)(_handle)
