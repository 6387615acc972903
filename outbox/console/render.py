"""HTML fragments of the console, from the dataclasses of `outbox.postgres.operations` and the lag.

Every value that comes from a database or a broker (topics, keys, payloads, headers, errors,
relay ids) goes through `esc`, which escapes HTML and shows control characters as `\\xNN`
escapes; bytes that are not UTF-8 are shown as hex (`outbox.formatting.bytes_text`). The
page's Content-Security-Policy allows no inline script either, so an escaping slip would still
not run a script.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence

from outbox.console.reads import DeadPage, RowView, preview
from outbox.console.throughput import Rate
from outbox.core.lag import GroupLag, PartitionLag
from outbox.formatting import age, cut, key_cell, key_text, process_state, raw_header_json, when
from outbox.postgres import operations as ops

#: Rows of a table of the page at most (topics of a queue, processes, claims, partitions of
#: the lag): with the page size of the dead letters, they bound the size of every answer.
MAX_TABLE_ROWS = 200
#: Characters of a topic or group name shown in a table.
NAME_CHARS = 256


def esc(value: object) -> str:
    """`value` as text safe inside HTML elements and quoted attributes.

    Control characters other than newline and tab become `\\xNN` escapes (a NUL cannot reach
    the page), then `&<>"'` are escaped.
    """
    text = str(value)
    if not all(ch.isprintable() or ch in "\n\t" for ch in text):
        text = "".join(
            ch if ch.isprintable() or ch in "\n\t" else ch.encode("unicode_escape").decode("ascii")
            for ch in text
        )
    return html.escape(text, quote=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], css: str = "") -> str:
    """A table; `header` is plain text, each cell already HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    cls = f' class="{esc(css)}"' if css else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _count(count: ops.Count, state: str) -> str:
    if count.rows == 0:
        return '<span class="zero">-</span>'
    warn = " bad" if state == "dead" else ""
    return (
        f'<span class="n{warn}">{count.rows}</span> '
        f'<span class="age" title="age of the oldest row">{esc(age(count.oldest_age))}</span>'
    )


def queues(status: ops.Status) -> str:
    """One table per queue: rows by topic and state, with the age of the oldest."""
    parts = []
    for q in status.queues:
        topics = list(q.topics.items())
        rows = [
            [esc(cut(topic, NAME_CHARS)), *(_count(per_state[s], s) for s in q.states)]
            for topic, per_state in topics[:MAX_TABLE_ROWS]
        ]
        if len(topics) > MAX_TABLE_ROWS:
            rows.append([_more(len(topics) - MAX_TABLE_ROWS, "topics"), *("" for _ in q.states)])
        rows.append(["<b>total</b>", *(_count(q.totals[s], s) for s in q.states)])
        parts.append(
            f"<h3>{esc(q.table)} <small>rows (age of the oldest by {esc(q.age_column)})</small>"
            f"</h3>" + _table(["topic", *q.states], rows, "queue")
        )
    return "".join(parts)


def _more(count: int, what: str) -> str:
    """The last cell of a table that was cut."""
    return f'<span class="none">… and {count} more {esc(what)}</span>'


def processes(status: ops.Status) -> str:
    """The registered daemons: host, own pid, backend pid, state, lanes; then the claims."""
    if not status.processes:
        return '<p class="none">No process registered in relay_state.</p>'
    rows = [
        [
            esc(cut(p.host or "-", NAME_CHARS)),
            esc(p.pid if p.pid is not None else "-"),
            esc(p.queue),
            esc(p.backend_pid),
            esc(process_state(p, status.taken_at)),
            esc(p.lanes),
            esc(age(p.since_update)),
            f"<code>{esc(cut(p.relay_id, NAME_CHARS))}</code>",
        ]
        for p in status.processes[:MAX_TABLE_ROWS]
    ]
    if len(status.processes) > MAX_TABLE_ROWS:
        rows.append([_more(len(status.processes) - MAX_TABLE_ROWS, "processes")] + [""] * 7)
    html_ = _table(
        ["host", "pid", "queue", "backend pid", "state", "lanes", "since", "relay id"],
        rows,
        "processes",
    )
    if status.claims:
        claims = [
            [esc(c.backend_pid), esc(c.state), esc(age(c.age))]
            for c in status.claims[:MAX_TABLE_ROWS]
        ]
        if len(status.claims) > MAX_TABLE_ROWS:
            claims.append([_more(len(status.claims) - MAX_TABLE_ROWS, "transactions"), "", ""])
        html_ += "<h3>handler transactions in flight</h3>" + _table(
            ["backend pid", "state", "age"], claims
        )
    return html_


def lag(groups: Sequence[GroupLag] | None, note: str | None = None) -> str:
    """Each group's lag per topic and partition, with the totals; at most MAX_TABLE_ROWS
    partitions in all (the totals count every partition)."""
    if groups is None:
        return f'<p class="none">{esc(note or "Lag needs --kafka-bootstrap.")}</p>'
    if not groups:
        return f'<p class="none">{esc(note or "No consumer group.")}</p>'
    parts = []
    budget = MAX_TABLE_ROWS
    for shown, g in enumerate(groups):
        if budget <= 0:
            parts.append(f"<p>{_more(len(groups) - shown, 'groups')}</p>")
            break
        name = esc(cut(g.group, NAME_CHARS))
        if g.error is not None:
            parts.append(f'<h3>{name}</h3><p class="bad">{esc(cut(g.error, 1000))}</p>')
            budget -= 1
            continue
        rows = [
            [
                esc(cut(p.topic, NAME_CHARS)),
                esc(p.partition),
                esc(p.committed),
                esc(p.end),
                esc(p.lag) + _past_end(p) + _went_back(p),
            ]
            for p in g.partitions[:budget]
        ]
        if len(g.partitions) > budget:
            rows.append([_more(len(g.partitions) - budget, "partitions"), "", "", "", ""])
        budget -= len(rows)
        topics = list(g.topics().items())
        for topic, total in topics[:MAX_TABLE_ROWS]:
            rows.append(
                [f"<b>{esc(cut(topic, NAME_CHARS))}</b>", "all", "", "", f"<b>{esc(total)}</b>"]
            )
        budget -= min(len(topics), MAX_TABLE_ROWS)
        parts.append(
            f'<h3>group {name} <small>total lag <span class="n">{g.total}</span>'
            "</small></h3>"
            + (
                _table(["topic", "partition", "committed", "end", "lag"], rows, "lag")
                if g.partitions
                else '<p class="none">No committed offsets.</p>'
            )
        )
    if note:
        parts.append(f'<p class="none">{esc(note)}</p>')
    return "".join(parts)


def _past_end(p: PartitionLag) -> str:
    """A mark for a partition whose committed offset is past its end (records published there
    are not delivered until the end passes it; `PartitionLag.past_end`)."""
    return ' <span class="bad">committed past the end</span>' if p.past_end else ""


def _went_back(p: PartitionLag) -> str:
    """A mark for a partition under which the log went back (restored from a backup, rolled
    back by hand: `PartitionLag.went_back`), with the last time in its title."""
    if not p.went_back:
        return ""
    times = "time" if p.went_back == 1 else "times"
    w = p.last_went_back
    title = (
        ""
        if w is None
        else f' title="last at {esc(when(w.at))}: position {w.position}, end {w.end}, read '
        f'again from offset {w.read_from}"'
    )
    return f' <span class="bad"{title}>log went back {p.went_back} {times}</span>'


#: Series of the throughput chart: (attribute of Rate, label, colour); `{transport}` in a label
#: is the label of the transport the console was started for ("Kafka", "the PostgreSQL log").
SERIES = (
    ("written", "written to producer_queue", "#6c8ebf"),
    ("relayed", "relayed to {transport}", "#2f9e44"),
    ("received", "received into consumer_queue", "#e8590c"),
    ("handled", "handled", "#9c36b5"),
)


def chart(
    rates: Sequence[Rate], *, transport: str = "Kafka", width: int = 720, height: int = 180
) -> str:
    """Rows per second over the sampled minutes, as an inline SVG (numbers only); `transport`
    names where the relayed rows went."""
    series = [(name, label.format(transport=transport), c) for name, label, c in SERIES]
    if len(rates) < 2:
        return '<p class="none">Sampling: the chart appears after two samples.</p>'
    left, bottom, top, right = 48, 22, 8, 8
    span = max((rates[-1].at - rates[0].at), 1e-9)
    peak = max((getattr(r, name) for r in rates for name, _, _ in series), default=0.0)
    peak = max(peak, 1.0)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(at: float) -> float:
        return left + (at - rates[0].at) / span * plot_w

    def y(value: float) -> float:
        return top + plot_h - value / peak * plot_h

    lines = []
    for name, label, colour in series:
        points = " ".join(f"{x(r.at):.1f},{y(getattr(r, name)):.1f}" for r in rates)
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}">'
            f"<title>{esc(label)}</title></polyline>"
        )
    minutes = span / 60
    axis = (
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" '
        f'stroke="#888"/><line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" '
        f'stroke="#888"/>'
        f'<text x="{left - 4}" y="{top + 10}" text-anchor="end" font-size="11">{peak:.0f}/s</text>'
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" font-size="11">0</text>'
        f'<text x="{left}" y="{height - 4}" font-size="11">-{minutes:.1f} min</text>'
        f'<text x="{width - right}" y="{height - 4}" text-anchor="end" font-size="11">now</text>'
    )
    legend = "".join(
        f'<span class="legend"><svg width="10" height="10" aria-hidden="true">'
        f'<rect width="10" height="10" fill="{colour}"/></svg> '
        f"{esc(label)}: {getattr(rates[-1], name):.1f}/s</span>"
        for name, label, colour in series
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="throughput" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">'
        f"{axis}{''.join(lines)}</svg>"
    )
    return f'<div class="chart">{svg}<div class="legends">{legend}</div></div>'


def dead_letters(page: DeadPage, *, read_only: bool) -> str:
    """A page of the dead rows of the filter, each with a button to open it, and the buttons
    to the first and the next page."""
    where = f" of topic {page.topic}" if page.topic else ""
    if page.total == 0 and page.after is None:
        return f'<p class="none" id="dead-count">No dead rows in {esc(page.table)}{esc(where)}.</p>'
    if page.rows:
        first, last = page.rows[0].id, page.rows[-1].id
        shown = f", showing {len(page.rows)} (ids {first} to {last})"
    else:
        shown = ", none after this page"
    rows = [
        [
            esc(r.id),
            f"<code>{esc(r.message_id)}</code>",
            esc(r.topic),
            esc(_key(r.key, r.key_size)),
            esc(r.attempts),
            esc(when(r.dead_at)),
            f'<span class="error">{"(quarantined) " if r.quarantined else ""}'
            f"{esc(r.error_summary)}</span>",
            f'<button type="button" class="open" data-queue="{esc(page.queue)}" '
            f'data-id="{esc(r.id)}">open</button>',
        ]
        for r in page.rows
    ]
    del read_only  # the actions are on the opened row
    pager = '<p class="pager">'
    if page.after is not None:
        pager += '<button type="button" class="page" data-after="">first page</button> '
    if page.next_after is not None:
        pager += (
            f'<button type="button" class="page" id="dead-more" '
            f'data-after="{esc(page.next_after)}">next page</button>'
        )
    pager += "</p>"
    return (
        f'<p id="dead-count">{page.total} dead row{"s" if page.total != 1 else ""} in '
        f"{esc(page.table)}{esc(where)}{esc(shown)}</p>"
        + _table(
            ["id", "message id", "topic", "key", "attempts", "dead at", "error", ""], rows, "dead"
        )
        + pager
    )


def _key(key: bytes | None, size: int | None) -> str:
    """A key cell: `key_cell` of its first bytes."""
    shown = key_cell(key)
    if key is not None and size is not None and size > len(key) and not shown.endswith("…"):
        shown += "…"
    return shown


def _size(size: int) -> str:
    return f"{size} byte" if size == 1 else f"{size} bytes"


def row_detail(row: RowView, *, read_only: bool) -> str:
    """Everything about one row: fields, headers, the error (a long one's first and last
    characters), a preview of the payload with its size."""
    key = "(none)" if row.key is None else key_text(row.key)
    if row.key is not None and row.key_size is not None and row.key_size > len(row.key):
        key += f"… ({_size(row.key_size)}, showing the first {len(row.key)})"
    fields: list[tuple[str, str]] = [
        ("table", row.table),
        ("id", str(row.id)),
        ("message id", str(row.message_id)),
        ("state", row.state),
        ("topic", row.topic),
        ("key", key),
        ("content type", row.content_type),
        ("lane", str(row.lane)),
        ("attempts", str(row.attempts)),
        ("created at", when(row.created_at)),
        ("next attempt at", when(row.next_attempt_at)),
        ("dead at", when(row.dead_at)),
    ]
    if row.queue == "consumer":
        fields += [
            ("received at", when(row.received_at)),
            (
                "source partition",
                "-" if row.source_partition is None else str(row.source_partition),
            ),
            ("source offset", "-" if row.source_offset is None else str(row.source_offset)),
            ("processed at", when(row.processed_at)),
        ]
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in fields)
    if row.headers is None:
        headers = f"(too large to show: {_size(row.headers_size)} of JSON)"
    else:
        headers = json.dumps(row.headers, ensure_ascii=True, sort_keys=True, indent=2)
    payload, encoding, truncated = preview(row.payload_head, row.payload_size)
    what = "UTF-8" if encoding == "utf-8" else "not UTF-8 text: hex"
    cut_ = f", showing the first {len(row.payload_head)}" if truncated else ""
    error = row.error_head or "(none)"
    head, size, tail = row.error_head, row.error_size, row.error_tail
    if head is not None and size is not None and tail is not None:
        error += (
            f"\n\n… ({_size(size)} in all: showing the first {len(head)} and the last "
            f"{len(tail)} characters; `outbox dead-letters show` prints it all) …\n\n{tail}"
        )
    actions = ""
    if row.state == "dead" and not read_only:
        actions = (
            '<div class="actions">'
            f'<button type="button" class="act requeue" data-action="requeue" '
            f'data-queue="{esc(row.queue)}" data-id="{esc(row.id)}">requeue</button> '
            f'<button type="button" class="act purge" data-action="purge" '
            f'data-queue="{esc(row.queue)}" data-id="{esc(row.id)}">purge</button></div>'
        )
    elif row.state == "dead":
        actions = '<p class="none">Read-only console: requeue and purge are disabled.</p>'
    return (
        f'<h3 id="detail-title">{esc(row.table)} row {esc(row.id)} '
        f'<span class="state {esc(row.state)}">{esc(row.state)}</span></h3>'
        f'{actions}<table class="fields">{table}</table>'
        f"<h4>headers</h4><pre>{esc(headers)}</pre>"
        f"{_raw_headers(row)}"
        f'<h4>error</h4><pre class="error">{esc(error)}</pre>'
        f'<h4>payload <small id="payload-size">{esc(_size(row.payload_size))}, {esc(what)}'
        f"{esc(cut_)}</small></h4>"
        f'<pre class="payload">{esc(payload)}</pre>'
    )


def _raw_headers(row: RowView) -> str:
    """A quarantined row's headers as received: names and values as text, else as hex."""
    if row.raw_headers_size is None:
        return ""
    if row.raw_headers is None:
        return (
            f'<h4>raw headers <small id="raw-headers-count">too large to show: '
            f"{esc(_size(row.raw_headers_size))} of JSON</small></h4>"
        )

    def cell(text: str | None, encoding: str | None) -> str:
        if text is None:
            return '<span class="none">(no value)</span>'
        return esc(text) if encoding == "utf-8" else f"<code>hex:{esc(text)}</code>"

    rows = []
    for name, value in row.raw_headers:
        doc = raw_header_json(name, value)
        rows.append(
            [cell(doc["name"], doc["name_encoding"]), cell(doc["value"], doc["value_encoding"])]
        )
    return (
        f'<h4>raw headers <small id="raw-headers-count">{len(rows)}, as received</small></h4>'
        '<p class="none">Quarantined: stored dead on arrival, it could not be an ordinary row '
        "(reason in the error). Requeued, its handler gets the raw payload as bytes and no "
        "headers.</p>" + _table(["name", "value"], rows, "raw-headers")
    )


def databases(
    names: Sequence[str],
    current: str,
    described: Mapping[str, str],
    errors: Mapping[str, str] | None = None,
) -> str:
    """The database selector: one link per database, with its redacted connection string; a
    database the console could not read last time (`errors`: name -> why) is marked, the
    reason in its title."""
    errors = errors or {}
    links = []
    for n in names:
        classes = "db" + (" current" if n == current else "") + (" down" if n in errors else "")
        title = described[n] + (f" \u2014 cannot read: {errors[n]}" if n in errors else "")
        mark = ' <span class="down-mark">(cannot read)</span>' if n in errors else ""
        links.append(
            f'<a class="{classes}" href="/?db={esc(_q(n))}" title="{esc(title)}">{esc(n)}{mark}</a>'
        )
    return "".join(links)


def _q(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")
