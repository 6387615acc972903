"""What the console reads from a service database, bounded whatever the rows hold.

Long values are cut in PostgreSQL (`sql/console.sql`), never in this process: a list reads the
first characters of each error, a row the first bytes of its payload, and both the whole sizes.
Dead rows are read a page at a time, in id order after a cursor (the last id of the previous
page). The limits below, with the page size, bound every answer of the console (see
`MAX_RESPONSE_BYTES` in `outbox.console.server`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from outbox.core.wire import from_raw_json
from outbox.formatting import PAYLOAD_PREVIEW_BYTES
from outbox.postgres import operations as ops
from outbox.postgres.queries import queries

#: Dead rows per page of the list.
PAGE_ROWS = 50
#: Characters of a topic (and content type) read; Kafka's topic names are at most 249.
TOPIC_CHARS = 256
#: Bytes of a key read for the list, and for one row.
LIST_KEY_BYTES = 64
ROW_KEY_BYTES = 1024
#: Characters of an error read for the list (its summary is found in them), and for one row:
#: its first ..._CHARS, and of a longer one its last ..._TAIL_CHARS too.
LIST_ERROR_CHARS = 4096
LIST_ERROR_TAIL_CHARS = 1024
ROW_ERROR_CHARS = 8192
ROW_ERROR_TAIL_CHARS = 8192
#: Characters of an error summary shown in the list.
SUMMARY_CHARS = 300
#: Bytes of a payload read for its preview.
PREVIEW_BYTES = PAYLOAD_PREVIEW_BYTES
#: Headers (and a quarantined row's raw headers) larger than this, as JSON text, are not read.
HEADERS_BYTES = 16384


@dataclass(frozen=True, slots=True)
class DeadSummary:
    """One dead row of the list: its key and error cut, with their whole sizes."""

    id: int
    message_id: uuid.UUID
    topic: str
    key: bytes | None
    key_size: int | None
    attempts: int
    dead_at: datetime
    error_head: str | None
    error_size: int | None
    error_tail: str | None
    quarantined: bool

    @property
    def error_summary(self) -> str:
        """The telling line of the error (`outbox.postgres.operations.error_summary`) found in its
        first and last characters, cut to SUMMARY_CHARS."""
        summary = ops.error_summary(joined(self.error_head, self.error_tail))
        if len(summary) > SUMMARY_CHARS:
            return summary[: SUMMARY_CHARS - 1] + "…"
        return summary


def joined(head: str | None, tail: str | None) -> str | None:
    """The first and last characters of a text read apart, as one text with the line the
    tail starts in (cut) left out: enough for `error_summary` to find a traceback's last
    line."""
    if head is None or tail is None:
        return head
    rest = tail.partition("\n")[2] if "\n" in tail else tail
    return f"{head}\n{rest}"


@dataclass(frozen=True)
class DeadPage:
    """A page of dead rows matching a filter, how many match in all, and whether more follow."""

    queue: ops.Queue
    table: str
    topic: str | None
    text: str | None
    after: int | None
    rows: tuple[DeadSummary, ...]
    total: int
    more: bool

    @property
    def next_after(self) -> int | None:
        """The cursor of the next page (None on the last)."""
        return self.rows[-1].id if self.more and self.rows else None


@dataclass(frozen=True)
class RowView:
    """One row of a queue as the console shows it: long values cut, with their whole sizes.

    `headers` is None when they were too large to read (`headers_size` says how large)."""

    queue: ops.Queue
    table: str
    id: int
    message_id: uuid.UUID
    topic: str
    key: bytes | None
    key_size: int | None
    payload_head: bytes
    payload_size: int
    headers: dict[str, Any] | None
    headers_size: int
    content_type: str
    lane: int
    created_at: datetime
    attempts: int
    next_attempt_at: datetime
    error_head: str | None
    error_size: int | None
    #: The error's last characters when it is longer than `error_head` (else None).
    error_tail: str | None
    dead_at: datetime | None
    state: str
    source_partition: int | None = None
    source_offset: int | None = None
    received_at: datetime | None = None
    processed_at: datetime | None = None
    #: A quarantined row's headers as received (None for any other row, or when too large).
    raw_headers: tuple[tuple[bytes, bytes | None], ...] | None = None
    #: The size of raw_headers as JSON text (None for a row that is not quarantined).
    raw_headers_size: int | None = None

    @property
    def quarantined(self) -> bool:
        """Stored dead on arrival (see `outbox.postgres.operations.QueueRow.quarantined`)."""
        return self.raw_headers_size is not None


def dead_page(
    conn: psycopg.Connection[Any],
    schema: str,
    queue: ops.Queue,
    *,
    topic: str | None = None,
    text: str | None = None,
    after: int | None = None,
    limit: int = PAGE_ROWS,
) -> DeadPage:
    """The dead rows of `queue` after id `after`, at most `limit`, with the filters of
    `outbox.postgres.operations.list_dead_letters`, and how many match in all."""
    sql = queries(schema)
    params = {
        "topic": topic,
        "text": text or None,
        "after": after,
        "limit": limit + 1,
        "topic_chars": TOPIC_CHARS,
        "key_bytes": LIST_KEY_BYTES,
        "error_chars": LIST_ERROR_CHARS,
        "tail_chars": LIST_ERROR_TAIL_CHARS,
    }
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(sql[f"console_{queue}_dead_page"], params).fetchall()
        counted = cur.execute(sql[f"console_{queue}_dead_count"], params).fetchone()
    summaries = tuple(
        DeadSummary(
            id=int(id_),
            message_id=message_id,
            topic=topic_,
            key=None if key is None else bytes(key),
            key_size=key_size,
            attempts=int(attempts),
            dead_at=dead_at,
            error_head=error,
            error_size=error_size,
            error_tail=_tail(error, error_tail, LIST_ERROR_CHARS),
            quarantined=bool(quarantined),
        )
        for (
            id_,
            message_id,
            topic_,
            key,
            key_size,
            attempts,
            dead_at,
            error,
            error_size,
            error_tail,
            quarantined,
        ) in rows[:limit]
    )
    return DeadPage(
        queue=queue,
        table=ops.DEAD_TABLES[queue],
        topic=topic,
        text=text or None,
        after=after,
        rows=summaries,
        total=int(counted[0]) if counted else 0,
        more=len(rows) > limit,
    )


def show_row(
    conn: psycopg.Connection[Any], schema: str, queue: ops.Queue, row_id: ops.RowId
) -> RowView:
    """One row of a queue, in any state, by id or message UUID, its long values cut;
    `outbox.postgres.operations.NoSuchDeadLetter` if absent."""
    params: dict[str, Any] = {
        "id": row_id if isinstance(row_id, int) else None,
        "message_id": None if isinstance(row_id, int) else row_id,
        "topic_chars": TOPIC_CHARS,
        "key_bytes": ROW_KEY_BYTES,
        "payload_bytes": PREVIEW_BYTES,
        "headers_bytes": HEADERS_BYTES,
        "error_chars": ROW_ERROR_CHARS,
        "tail_chars": ROW_ERROR_TAIL_CHARS,
    }
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(queries(schema)[f"console_{queue}_show"], params).fetchone()
    if row is None:
        raise ops.NoSuchDeadLetter(ops.no_row(queue, row_id))
    consumer: dict[str, Any] = {}
    if queue == "consumer":
        partition, offset, received_at, processed_at, raw, raw_size = row[19:25]
        consumer = {
            "source_partition": partition,
            "source_offset": offset,
            "received_at": received_at,
            "processed_at": processed_at,
            "raw_headers_size": raw_size,
        }
        if raw is not None:
            consumer["raw_headers"] = from_raw_json(raw)
    return RowView(
        queue=queue,
        table=ops.DEAD_TABLES[queue] if row[17] == "dead" else ops.TABLES[queue],
        id=int(row[0]),
        message_id=row[1],
        topic=row[2],
        key=None if row[3] is None else bytes(row[3]),
        key_size=row[4],
        payload_head=bytes(row[5] or b""),
        payload_size=int(row[6] or 0),
        headers=None if row[7] is None else dict(row[7]),
        headers_size=int(row[8] or 0),
        content_type=row[9],
        lane=int(row[10]),
        created_at=row[11],
        attempts=int(row[12]),
        next_attempt_at=row[13],
        error_head=row[14],
        error_size=row[15],
        dead_at=row[16],
        state=row[17],
        error_tail=_tail(row[14], row[18], ROW_ERROR_CHARS),
        **consumer,
    )


def _tail(head: str | None, tail: str | None, chars: int) -> str | None:
    """The tail read with `head`, when the text is longer than `head` (PostgreSQL reads a tail
    by the text's size in bytes; a text of multi-byte characters may be all in `head`)."""
    return tail if head is not None and len(head) >= chars else None


def preview(head: bytes, size: int) -> tuple[str, str, bool]:
    """(text, or hex digits, of the payload's first bytes `head`; "utf-8" or "hex"; whether the
    payload is longer than `head`). A character cut in two at the end of `head` is dropped."""
    truncated = size > len(head)
    candidates = [head]
    if truncated:  # a multi-byte character may be cut in two at the end
        candidates += [head[:-n] for n in (1, 2, 3) if len(head) > n]
    for candidate in candidates:
        try:
            text = candidate.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.replace("\n", "").replace("\r", "").replace("\t", "").isprintable():
            return text, "utf-8", truncated
        break
    return head.hex(), "hex", truncated


def received_after(counters: Counters | None) -> int | None:
    """The `after` of the next sample: the highest consumer_queue id the last one saw."""
    return None if counters is None else counters.top_received_id


@dataclass(frozen=True, slots=True)
class Counters:
    """One throughput sample of a database at `taken_at`.

    `written` and `relayed` are cumulative (PostgreSQL's statistics: rows inserted into
    producer_queue; rows deleted from it after an acknowledgement, not those moved to
    producer_dead); `received` (rows stored into consumer_queue) and `handled` count the rows
    since the previous sample (0 in the first)."""

    taken_at: datetime
    written: int
    relayed: int
    received: int
    top_received_id: int
    handled: int


def counters(conn: psycopg.Connection[Any], schema: str, last: Counters | None = None) -> Counters:
    """The throughput sample now; `last` is the previous sample (None for the first)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            queries(schema)["console_throughput"],
            {
                "schema": schema,
                "since": None if last is None else last.taken_at,
                "after": received_after(last),
            },
        ).fetchone()
    assert row is not None
    taken_at, written, relayed, received, top, handled = row
    return Counters(taken_at, int(written), int(relayed), int(received), int(top), int(handled))
