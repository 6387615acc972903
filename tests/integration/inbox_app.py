"""A service's handlers, run by `outbox handler tests.integration.inbox_app:handlers` in tests.

The topic comes from INBOX_APP_TOPIC. Each handled message inserts one row into `effects` in the
handler's transaction; payload fields steer failures: {"fail_times": n} raises on the first n
attempts, {"poison": true} raises until a row exists in `cured`, {"sleep": s} sleeps first,
{"hang": s} writes its effect and then hangs for s seconds on the first attempt (past a lease).
"""

from __future__ import annotations

import os
import time
from typing import Any

from outbox import Handlers, InboxMessage

TOPIC = os.environ.get("INBOX_APP_TOPIC", "inbox.app")
handlers = Handlers()


@handlers.handler(TOPIC, max_attempts=3)
def record(message: InboxMessage, conn: Any) -> None:
    body = message.payload
    if body.get("sleep"):
        time.sleep(body["sleep"])
    conn.execute(
        "INSERT INTO effects (message_id, attempt, body) VALUES (%s, %s, %s)",
        (message.id, message.attempt, message.raw_payload.decode()),
    )
    if body.get("hang") and message.attempt == 1:
        time.sleep(body["hang"])
    if message.attempt <= body.get("fail_times", 0):
        raise RuntimeError(f"planned failure on attempt {message.attempt}")
    if body.get("poison") and conn.execute("SELECT count(*) FROM cured").fetchone()[0] == 0:
        raise ValueError("poison message")


SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    message_id uuid NOT NULL, attempt int NOT NULL, body text, seq bigserial
);
CREATE TABLE IF NOT EXISTS cured (x int);
"""
