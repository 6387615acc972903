"""The handlers the handler and retention benchmarks run: one INSERT in the handler's transaction.

Run as `outbox handler benchmarks.bench_handlers:handlers` (or `:pipelined_handlers`, the same
handler with `Handlers(pipeline=True)`) from the repository root. The topics
come from OUTBOX_BENCH_TOPICS (comma-separated; default `bench.handler`), because the
benchmarks create fresh topics with random names. The database needs a table
`effects (id bigserial PRIMARY KEY, message_id uuid NOT NULL)`.
"""

from __future__ import annotations

import os
from typing import Any

from outbox import Handlers, InboxMessage

TOPICS_ENV = "OUTBOX_BENCH_TOPICS"
DEFAULT_TOPIC = "bench.handler"
EFFECTS_TABLE = "CREATE TABLE effects (id bigserial PRIMARY KEY, message_id uuid NOT NULL)"

handlers = Handlers()
pipelined_handlers = Handlers(pipeline=True)


def record_effect(message: InboxMessage, conn: Any) -> None:
    """The business effect: one row, committed together with 'processed' or not at all."""
    conn.execute("INSERT INTO effects (message_id) VALUES (%s)", (message.id,))


for _topic in os.environ.get(TOPICS_ENV, DEFAULT_TOPIC).split(","):
    if _topic.strip():
        handlers.handler(_topic.strip())(record_effect)
        pipelined_handlers.handler(_topic.strip())(record_effect)
