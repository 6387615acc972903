"""The handler of scenario (e), run by `outbox handler benchmarks.latency_handlers:handlers`.

The topic comes from LATENCY_TOPIC. The callback's first act is to read the clock; it then
records that time in `arrivals`, with the message's `received_at` (the start of the Consumer's
insert: handled rows leave `consumer_queue`, so it is kept here), the start of the handler's
transaction (`now()`: its first statement is the claim), and the record's partition and offset
(to find its time on the log), in the handler's own transaction, so a message counts as arrived
only if its handling committed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from outbox import Handlers, InboxMessage

TOPIC = os.environ.get("LATENCY_TOPIC", "bench.latency")
handlers = Handlers()

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS arrivals (message_id uuid NOT NULL, started double precision "
    "NOT NULL, received double precision NOT NULL, claimed double precision, "
    "source_partition integer, source_offset bigint)"
)


@handlers.handler(TOPIC)
def arrived(message: InboxMessage, conn: Any) -> None:
    started = time.time()
    conn.execute(
        "INSERT INTO arrivals (message_id, started, received, claimed, source_partition, "
        "source_offset) VALUES (%s, %s, %s, extract(epoch FROM now()), %s, %s)",
        (message.id, started, message.received_at.timestamp(), message.partition, message.offset),
    )
