"""The handlers the handler and retention benchmarks run: one INSERT in the handler's transaction.

Run as `outbox handler benchmarks.bench_handlers:handlers` (or `:pipelined_handlers`, the same
handler with `Handlers(pipeline=True)`, or `:batch_handlers`, the same effect written by a
`batch_handler` with one `executemany` per transaction) from the repository root. The topics
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
batch_handlers = Handlers()


def record_effect(message: InboxMessage, conn: Any) -> None:
    """The business effect: one row, committed together with 'processed' or not at all."""
    conn.execute("INSERT INTO effects (message_id) VALUES (%s)", (message.id,))


def record_effects(messages: list[InboxMessage], conn: Any) -> None:
    """The same effect for a list of messages: one row each, in one executemany."""
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO effects (message_id) VALUES (%s)", [(m.id,) for m in messages])


for _topic in os.environ.get(TOPICS_ENV, DEFAULT_TOPIC).split(","):
    if _topic.strip():
        handlers.handler(_topic.strip())(record_effect)
        pipelined_handlers.handler(_topic.strip())(record_effect)
        batch_handlers.batch_handler(_topic.strip())(record_effects)
