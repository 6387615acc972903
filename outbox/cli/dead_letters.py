"""`outbox dead-letters list|show|requeue|purge`: the rows that gave up, and acting on them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from outbox import formatting as fmt
from outbox.cli.arguments import (
    add_database,
)
from outbox.cli.common import _connection, _print, _safe, _table, _topic
from outbox.core.numbers import flag_type
from outbox.postgres import operations as ops

#: The error column of `dead-letters list` is cut to this many characters.
ERROR_COLUMN_CHARS = 120


def _add_queue(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queue",
        choices=("consumer", "producer"),
        default="consumer",
        help="consumer (the inbox's consumer_queue; default) or producer (the outbox: its dead "
        "rows are in producer_dead)",
    )


def _row_id(text: str) -> ops.RowId:
    try:
        return ops.parse_row_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_dead_letters(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `dead-letters` to the `outbox` command's subparsers."""
    dead = commands.add_parser(
        "dead-letters",
        help="list, show, requeue or purge the rows that gave up",
        description="Inspect and act on dead rows: those of consumer_queue (default) or, with "
        "--queue producer, producer_dead. "
        "See docs/how-to/dead-letters.md.",
    )
    actions = dead.add_subparsers(
        dest="dead_letters_command",
        required=True,
        metavar="ACTION",
    )

    listing = actions.add_parser("list", help="the dead rows of a queue, oldest first")
    add_database(listing)
    _add_queue(listing)
    listing.add_argument("--topic", type=_topic, help="only the rows of this topic")
    listing.add_argument(
        "--limit", type=flag_type("count"), default=100, help="show at most N rows (default 100)"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")

    show = actions.add_parser("show", help="everything about one row, with the whole error")
    add_database(show)
    _add_queue(show)
    show.add_argument("id", type=_row_id, metavar="ID", help="row id or message UUID")
    show.add_argument("--json", action="store_true", help="print one JSON document")

    for name, what in (
        ("requeue", "make dead rows pending again and wake the daemon"),
        ("purge", "delete dead rows for good"),
    ):
        change = actions.add_parser(
            name,
            help=what,
            description=f"{what[0].upper()}{what[1:]}. Select them by ID (row ids or message "
            "UUIDs; each must name a dead row, else nothing changes), by --topic, or --all."
            + (
                " A requeued consumer row runs after the later messages of its key that were "
                "handled while it was dead (requeue warns, with their count); a quarantined "
                "row's handler gets its raw payload as bytes and no headers."
                if name == "requeue"
                else ""
            ),
        )
        add_database(change)
        _add_queue(change)
        change.add_argument(
            "ids", nargs="*", type=_row_id, metavar="ID", help="row ids or message UUIDs"
        )
        change.add_argument("--topic", type=_topic, help="every dead row of this topic")
        change.add_argument(
            "--all", dest="all_rows", action="store_true", help="every dead row of the queue"
        )


def _usage_error(args: argparse.Namespace, message: str) -> int:
    print(f"outbox {args.command} {args.dead_letters_command}: error: {message}", file=sys.stderr)
    return 2


def _dead_letters(args: argparse.Namespace) -> int:
    action = args.dead_letters_command
    queue: ops.Queue = args.queue
    if action in ("requeue", "purge"):
        chosen = sum((bool(args.ids), args.topic is not None, bool(args.all_rows)))
        if chosen != 1:
            return _usage_error(
                args,
                "give row IDs, --topic T or --all (exactly one of them)"
                if chosen == 0
                else "IDs, --topic and --all cannot be combined; give exactly one of them",
            )
        selection = ops.Selection(ids=tuple(args.ids), topic=args.topic, everything=args.all_rows)
        warnings: tuple[ops.Overtaken, ...] = ()
        with _connection(args) as conn:
            if action == "requeue":
                if queue == "consumer":
                    warnings = ops.overtaken(conn, args.schema, selection)
                count = ops.requeue(conn, args.schema, queue, selection)
            else:
                count = ops.purge(conn, args.schema, queue, selection)
        _print(_changed(action, count, ops.TABLES[queue], args.topic))
        for warning in warnings:
            messages = "message" if warning.later == 1 else "messages"
            were = "was" if warning.later == 1 else "were"
            _print(
                f"warning: row {warning.id} (key {fmt.key_text(warning.key)}): {warning.later} "
                f"later {messages} of the same key {were} already handled; it runs after them"
            )
        return 0
    if action == "list":
        with _connection(args) as conn:
            page = ops.list_dead_letters(
                conn, args.schema, queue, topic=args.topic, limit=args.limit
            )
        _print(json.dumps(_page_json(page), indent=2) if args.json else _page_text(page))
    else:
        with _connection(args) as conn:
            row = ops.show_row(conn, args.schema, queue, args.id)
        _print(json.dumps(_row_json(row), indent=2) if args.json else _row_text(row))
    return 0


def _changed(action: str, count: int, table: str, topic: str | None) -> str:
    rows = "row" if count == 1 else "rows"
    where = f" (topic {topic})" if topic is not None else ""
    return f"{action}d {count} {rows} of {table}{where}"


def _page_json(page: ops.DeadLetterPage) -> dict[str, Any]:
    rows = []
    for r in page.rows:
        key, key_encoding = fmt.encoded_key(r.key)
        rows.append(
            {
                "id": r.id,
                "message_id": str(r.message_id),
                "topic": r.topic,
                "key": key,
                "key_encoding": key_encoding,
                "attempts": r.attempts,
                "dead_at": fmt.timestamp(r.dead_at),
                "error": r.error_summary,
                "quarantined": r.quarantined,
            }
        )
    return {
        "queue": page.queue,
        "table": page.table,
        "topic": page.topic,
        "total": page.total,
        "rows": rows,
    }


def _page_text(page: ops.DeadLetterPage) -> list[str]:
    where = f" of topic {page.topic}" if page.topic is not None else ""
    if page.total == 0:
        return [f"{page.table}: no dead rows{where}"]
    shown = "" if len(page.rows) == page.total else f", showing the first {len(page.rows)}"
    rows = "row" if page.total == 1 else "rows"
    body = [
        [
            str(r.id),
            str(r.message_id),
            _safe(r.topic),
            fmt.key_cell(r.key),
            str(r.attempts),
            fmt.when(r.dead_at),
            fmt.cut(
                _safe(("(quarantined) " if r.quarantined else "") + r.error_summary),
                ERROR_COLUMN_CHARS,
            ),
        ]
        for r in page.rows
    ]
    header = ["ID", "MESSAGE_ID", "TOPIC", "KEY", "ATTEMPTS", "DEAD_AT", "ERROR"]
    return [f"{page.table}: {page.total} dead {rows}{where}{shown}", *_table(header, body)]


def _row_json(row: ops.QueueRow) -> dict[str, Any]:
    key, key_encoding = fmt.encoded_key(row.key)
    payload, payload_encoding, truncated = fmt.payload_preview(row)
    doc: dict[str, Any] = {
        "queue": row.queue,
        "table": row.table,
        "id": row.id,
        "message_id": str(row.message_id),
        "state": row.state,
        "topic": row.topic,
        "key": key,
        "key_encoding": key_encoding,
        "lane": row.lane,
        "content_type": row.content_type,
        "headers": row.headers,
        "attempts": row.attempts,
        "created_at": fmt.timestamp(row.created_at),
        "next_attempt_at": fmt.timestamp(row.next_attempt_at),
        "dead_at": fmt.timestamp(row.dead_at),
        "last_error": row.last_error,
        "payload": payload,
        "payload_encoding": payload_encoding,
        "payload_bytes": len(row.payload),
        "payload_truncated": truncated,
    }
    if row.queue == "consumer":
        doc["source_partition"] = row.source_partition
        doc["source_offset"] = row.source_offset
        doc["received_at"] = fmt.timestamp(row.received_at)
        doc["processed_at"] = fmt.timestamp(row.processed_at)
        doc["quarantined"] = row.quarantined
        doc["raw_headers"] = (
            None if row.raw_headers is None else [fmt.raw_header_json(*h) for h in row.raw_headers]
        )
    return doc


def _indented(text: str) -> list[str]:
    return ["  " + line.rstrip() for line in text.splitlines()] or ["  "]


def _row_text(row: ops.QueueRow) -> list[str]:
    fields: list[tuple[str, str]] = [
        ("message_id", str(row.message_id)),
        ("state", row.state),
        ("topic", _safe(row.topic)),
        ("key", "(none)" if row.key is None else fmt.key_text(row.key)),
        ("lane", str(row.lane)),
        ("content_type", _safe(row.content_type)),
        ("headers", json.dumps(row.headers, ensure_ascii=True, sort_keys=True)),
        ("attempts", str(row.attempts)),
        ("created_at", fmt.when(row.created_at)),
    ]
    if row.queue == "consumer":
        fields += [
            ("received_at", fmt.when(row.received_at)),
            ("source_partition", _number(row.source_partition)),
            ("source_offset", _number(row.source_offset)),
        ]
    fields += [
        ("next_attempt_at", fmt.when(row.next_attempt_at)),
        ("dead_at", fmt.when(row.dead_at)),
    ]
    if row.queue == "consumer":
        fields.append(("processed_at", fmt.when(row.processed_at)))
    lines = [f"{row.table} row {row.id}", *_table(["FIELD", "VALUE"], fields, indent="  ")[1:]]
    if row.raw_headers is not None:
        lines.append(
            "quarantined: stored dead on arrival, it could not be an ordinary row (reason in "
            "last_error); requeued, its handler gets the raw payload as bytes and no headers"
        )
        lines.append(f"raw headers ({len(row.raw_headers)}, as received):")
        lines.extend(
            f"  {name!r}: {'(no value)' if value is None else repr(value)}"
            for name, value in row.raw_headers
        )
    lines.append("last_error:" if row.last_error else "last_error: (none)")
    if row.last_error:
        lines.extend(_indented(_escape_lines(row.last_error)))
    payload, encoding, truncated = fmt.payload_preview(row)
    size = f"{len(row.payload)} bytes"
    note = f", showing the first {fmt.PAYLOAD_PREVIEW_BYTES}" if truncated else ""
    if encoding == "hex":
        lines.append(f"payload ({size}, not UTF-8 text: hex{note}):")
        lines.extend("  " + payload[i : i + 64] for i in range(0, len(payload), 64))
    else:
        lines.append(f"payload ({size}, UTF-8{note}):")
        lines.extend(_indented(payload))
    if truncated:
        lines.append(f"  ... ({len(row.payload) - fmt.PAYLOAD_PREVIEW_BYTES} more bytes not shown)")
    return lines


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


def _escape_lines(text: str) -> str:
    """Keep line breaks and tabs, escape every other control character."""
    return "\n".join(_safe(line.replace("\t", "    ")) for line in text.splitlines())
