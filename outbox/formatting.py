"""How the operator tools show what `outbox.postgres.operations` returns: shared by the
`outbox` command (outbox/cli/status.py, dead_letters.py) and the console (outbox/console/),
which is below the CLI and so cannot import it.

Nothing here reads a database or prints. Times are shown in UTC; ages are short (`4m05s`);
bytes (keys, payloads, headers) are text when they are printable UTF-8, else hex.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from outbox.postgres import operations as ops

#: `dead-letters show` and the console show at most this many bytes of a payload.
PAYLOAD_PREVIEW_BYTES = 4096
#: Keys longer than this are cut in tables.
KEY_COLUMN_CHARS = 40
#: The `format_version` of `outbox status --json` (keys are only ever added).
STATUS_FORMAT_VERSION = 1


def cut(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with an ellipsis when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def timestamp(value: datetime | None) -> str | None:
    """An ISO 8601 time in UTC, for JSON; None stays None."""
    return None if value is None else value.astimezone(UTC).isoformat()


def when(value: datetime | None) -> str:
    """A time in UTC to the second (`2024-05-01 12:00:00Z`), `-` for None."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def process_state(process: ops.Process, taken_at: datetime) -> str:
    """What a registered process is doing: busy, sleeping, gone (its session is), or parked
    (idle for --idle-disconnect seconds) since when and for how long."""
    if process.parked_since is not None:
        since = process.parked_since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        parked_for = max(0.0, (taken_at - process.parked_since).total_seconds())
        return f"parked since {since} ({age(parked_for)})"
    if not process.alive:
        return "gone"
    return "sleeping" if process.sleeping else "busy"


def age(seconds: float | None) -> str:
    """A short age: 12s, 4m05s, 3h02m, 2d04h; `-` for None."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def bytes_text(data: bytes, *, multiline: bool) -> tuple[str, str]:
    """(text, "utf-8") when `data` is printable UTF-8 (with `multiline`, line breaks and tabs
    allowed), else (hex digits, "hex")."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex(), "hex"
    check = text.replace("\n", "").replace("\r", "").replace("\t", "") if multiline else text
    if check.isprintable():
        return text, "utf-8"
    return data.hex(), "hex"


def encoded_key(key: bytes | None) -> tuple[str | None, str | None]:
    """A key as `bytes_text` shows it on one line; (None, None) for a message without one."""
    if key is None:
        return None, None
    return bytes_text(key, multiline=False)


def key_text(key: bytes) -> str:
    """A key as text, or `hex:<digits>` when it is not printable UTF-8."""
    text, encoding = bytes_text(key, multiline=False)
    return text if encoding == "utf-8" else f"hex:{text}"


def key_cell(key: bytes | None) -> str:
    """A key for a table cell: `key_text` cut to KEY_COLUMN_CHARS, `(none)` without one."""
    if key is None:
        return "(none)"
    return cut(key_text(key), KEY_COLUMN_CHARS)


def payload_preview(row: ops.QueueRow) -> tuple[str, str, bool]:
    """(text or hex of the first PAYLOAD_PREVIEW_BYTES of the payload, encoding, truncated)."""
    text, encoding = bytes_text(row.payload, multiline=True)
    truncated = len(row.payload) > PAYLOAD_PREVIEW_BYTES
    if truncated:
        head = row.payload[:PAYLOAD_PREVIEW_BYTES]
        # The whole payload is valid UTF-8, so "ignore" drops only a character cut in two.
        text = head.decode("utf-8", "ignore") if encoding == "utf-8" else head.hex()
    return text, encoding, truncated


def raw_header_json(name: bytes, value: bytes | None) -> dict[str, Any]:
    """A quarantined row's header: name and value as text or hex (as keys are shown)."""
    name_text, name_encoding = bytes_text(name, multiline=False)
    value_text, value_encoding = (
        (None, None) if value is None else bytes_text(value, multiline=False)
    )
    return {
        "name": name_text,
        "name_encoding": name_encoding,
        "value": value_text,
        "value_encoding": value_encoding,
    }


def count_json(count: ops.Count) -> dict[str, Any]:
    """{"count": rows, "oldest_age_seconds": <float to the millisecond, or null>}."""
    oldest = None if count.oldest_age is None else round(count.oldest_age, 3)
    return {"count": count.rows, "oldest_age_seconds": oldest}


def scheduled_json(scheduled: Sequence[ops.Scheduled]) -> dict[str, Any]:
    """The messages due later, per topic and in all, of `outbox status --json`."""
    return {
        "topics": {
            s.topic: {
                "rows": s.rows,
                "overdue": s.overdue,
                "next_due_at": timestamp(s.next_due_at),
                "next_due_in_seconds": round(s.next_due_in, 3),
            }
            for s in scheduled
        },
        "rows": sum(s.rows for s in scheduled),
        "overdue": sum(s.overdue for s in scheduled),
        "next_due_at": (timestamp(min(s.next_due_at for s in scheduled)) if scheduled else None),
    }


def status_json(status: ops.Status) -> dict[str, Any]:
    """The document of `outbox status --json` without the lag and the check (whose shape the
    docstring of outbox/cli/status.py gives); the console serves it too."""
    queues: dict[str, Any] = {}
    for q in status.queues:
        queues[q.queue] = {
            "table": q.table,
            "age_column": q.age_column,
            "states": list(q.states),
            "topics": {
                topic: {
                    **{s: count_json(c) for s, c in per_state.items()},
                    "total": count_json(sum(per_state.values(), ops.Count())),
                }
                for topic, per_state in q.topics.items()
            },
            "totals": {
                **{s: count_json(c) for s, c in q.totals.items()},
                "total": count_json(q.total),
            },
        }
    return {
        "format_version": STATUS_FORMAT_VERSION,
        "schema": status.schema,
        "taken_at": timestamp(status.taken_at),
        "queues": queues,
        "scheduled": scheduled_json(status.scheduled),
        "processes": [
            {
                "relay_id": p.relay_id,
                "queue": p.queue,
                "host": p.host,
                "pid": p.pid,
                "backend_pid": p.backend_pid,
                "sleeping": p.sleeping,
                "alive": p.alive,
                "seconds_since_update": round(p.since_update, 3),
                "lanes": p.lanes,
                "parked": p.parked,
                "parked_since": timestamp(p.parked_since),
            }
            for p in status.processes
        ],
        "claims": [
            {"backend_pid": c.backend_pid, "state": c.state, "age_seconds": round(c.age, 3)}
            for c in status.claims
        ],
        "connections": None
        if status.connections is None
        else {
            "outbox": dict(status.connections.outbox),
            "database": status.connections.database,
            "server": status.connections.server,
            "max_connections": status.connections.max_connections,
        },
    }
