"""The console's AsyncAPI page: a service's AsyncAPI document as HTML a person reads.

`outbox console --asyncapi MODULE[:ATTRIBUTE]` builds the document once, at start-up, as
`outbox asyncapi` would (`outbox.asyncapi`), and serves it at `/asyncapi` (this page) and
`/asyncapi.json` (the document itself). The page lists what the service sends and what it
receives, then each channel: its description, its operations, its message's content type, key,
headers and payload schema (a table of properties, nested objects inline, `$ref`s linked to
the named schemas at the end), with the schema's JSON under a disclosure.

Plain HTML from the server, the console's style sheet and no script: nothing is fetched from
anywhere else, so the page works offline. Every text of the document (topic names, descriptions,
docstrings, schema titles, enum values, hosts) goes through `render.esc`; links and ids are
made here from positions, never from the document's text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.console.render import esc

#: How deep nested object schemas are laid out as tables (deeper: their JSON only).
MAX_DEPTH = 6
#: Characters of a schema's JSON shown under its disclosure at most.
MAX_JSON_CHARS = 200_000
_SCHEMAS = "#/components/schemas/"


class _Anchors:
    """Ids of the page's sections, from positions (a name may hold anything)."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        channels = _mapping(document.get("channels"))
        schemas = _mapping(_mapping(document.get("components")).get("schemas"))
        self.channels = {name: f"channel-{i}" for i, name in enumerate(channels)}
        self.schemas = {name: f"schema-{i}" for i, name in enumerate(schemas)}
        self.named: Mapping[str, Any] = schemas

    def target(self, ref: object) -> Mapping[str, Any] | None:
        """The named schema a `$ref` points at, if it is one of the document's."""
        if isinstance(ref, str) and ref.startswith(_SCHEMAS):
            found = self.named.get(ref[len(_SCHEMAS) :])
            return found if isinstance(found, Mapping) else None
        return None

    def ref(self, ref: object) -> str:
        """A link to a named schema, or the reference as text when it names none."""
        if isinstance(ref, str) and ref.startswith(_SCHEMAS):
            name = ref[len(_SCHEMAS) :]
            anchor = self.schemas.get(name)
            if anchor is not None:
                return f'<a href="#{anchor}"><code>{esc(name)}</code></a>'
        return f"<code>{esc(ref)}</code>"


def page(document: Mapping[str, Any], *, source: str) -> str:
    """The whole HTML page of `document` (an AsyncAPI 3.0 document), built from `source`."""
    anchors = _Anchors(document)
    info = _mapping(document.get("info"))
    title = str(info.get("title", source))
    channels = _mapping(document.get("channels"))
    operations = _mapping(document.get("operations"))
    by_channel: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for name, operation in operations.items():
        operation = _mapping(operation)
        channel = str(_mapping(operation.get("channel")).get("$ref", "")).rpartition("/")[2]
        by_channel.setdefault(channel, []).append((str(name), operation))
    sends = [c for c in channels if _actions(by_channel.get(c, ())) & {"send"}]
    receives = [c for c in channels if _actions(by_channel.get(c, ())) & {"receive"}]
    messages = _mapping(_mapping(document.get("components")).get("messages"))
    parts = [
        _head(title),
        '<header><h1>outbox console</h1><a class="db" href="/">← queues and dead letters</a>',
        f'<span class="status">AsyncAPI {esc(document.get("asyncapi", ""))} · '
        f'<a href="/asyncapi.json">the document (JSON)</a></span></header>',
        '<main class="asyncapi">',
        f'<section class="wide"><h2>{esc(title)} <small>version '
        f"{esc(info.get('version', ''))}</small></h2>",
        f"<p>{esc(info.get('description', ''))}</p>",
        _servers(_mapping(document.get("servers"))),
        "<h3>Sends</h3>",
        _channel_list(sends, anchors, "This service sends to no topic."),
        "<h3>Receives</h3>",
        _channel_list(receives, anchors, "This service handles no topic."),
        "</section>",
    ]
    for name, channel in channels.items():
        parts.append(
            _channel(
                str(name),
                _mapping(channel),
                by_channel.get(str(name), []),
                messages,
                anchors,
            )
        )
    schemas = _mapping(_mapping(document.get("components")).get("schemas"))
    if schemas:
        parts.append('<section class="wide"><h2>Named schemas</h2>')
        for name, schema in schemas.items():
            parts.append(
                f'<h3 id="{anchors.schemas[name]}"><code>{esc(name)}</code></h3>'
                + _schema(schema, anchors)
            )
        parts.append("</section>")
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def _head(title: str) -> str:
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>AsyncAPI: {esc(title)}</title>\n"
        '<link rel="stylesheet" href="/static/console.css">\n</head>\n<body>'
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _actions(operations: Sequence[tuple[str, Mapping[str, Any]]]) -> set[str]:
    return {str(op.get("action")) for _name, op in operations}


def _channel_list(names: Sequence[str], anchors: _Anchors, none: str) -> str:
    if not names:
        return f'<p class="none">{esc(none)}</p>'
    items = "".join(
        f'<li><a href="#{anchors.channels[n]}"><code>{esc(n)}</code></a></li>' for n in names
    )
    return f"<ul>{items}</ul>"


def _servers(servers: Mapping[str, Any]) -> str:
    if not servers:
        return ""
    rows = []
    for name, server in servers.items():
        server = _mapping(server)
        host = f"{server.get('host', '')}{server.get('pathname', '')}"
        rows.append(
            f"<tr><td>{esc(name)}</td><td>{esc(server.get('protocol', ''))}</td>"
            f"<td><code>{esc(host)}</code></td><td>{esc(server.get('description', ''))}</td></tr>"
        )
    return (
        "<h3>Servers</h3><table><thead><tr><th>server</th><th>protocol</th><th>host</th>"
        f"<th>description</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _channel(
    name: str,
    channel: Mapping[str, Any],
    operations: Sequence[tuple[str, Mapping[str, Any]]],
    messages: Mapping[str, Any],
    anchors: _Anchors,
) -> str:
    roles = sorted(_actions(operations))
    badges = " ".join(f'<span class="state {esc(role)}">{esc(role)}s</span>' for role in roles)
    parts = [
        f'<section class="wide" id="{anchors.channels[name]}">',
        f"<h2><code>{esc(channel.get('address', name))}</code> {badges}</h2>",
    ]
    if channel.get("description"):
        parts.append(f"<p>{esc(channel['description'])}</p>")
    for _op_name, operation in operations:
        line = f"<b>{esc(operation.get('action', ''))}</b>: {esc(operation.get('summary', ''))}"
        if operation.get("description"):
            line += f" — {esc(operation['description'])}"
        parts.append(f'<p class="operation">{line}</p>')
    for reference in _mapping(channel.get("messages")).values():
        ref = str(_mapping(reference).get("$ref", ""))
        message = _mapping(messages.get(ref.rpartition("/")[2]))
        parts.append(_message(message, anchors))
    parts.append("</section>")
    return "\n".join(parts)


def _message(message: Mapping[str, Any], anchors: _Anchors) -> str:
    key = _mapping(_mapping(_mapping(message.get("bindings")).get("kafka")).get("key"))
    content_type = esc(message.get("contentType", ""))
    parts = [
        f"<h3>Message <code>{esc(message.get('name', ''))}</code></h3>",
        "<table><tbody>",
        f"<tr><th>content type</th><td><code>{content_type}</code></td></tr>",
        f"<tr><th>key</th><td>{esc(key.get('description', ''))}</td></tr>",
        "</tbody></table>",
        "<h4>Payload</h4>",
        _schema(message.get("payload"), anchors),
        "<h4>Headers</h4>",
        _schema(message.get("headers"), anchors),
    ]
    return "\n".join(parts)


def _schema(schema: object, anchors: _Anchors) -> str:
    """A schema as a readable block, and its JSON under a disclosure."""
    shown = json.dumps(schema, indent=2, ensure_ascii=False, default=str)
    if len(shown) > MAX_JSON_CHARS:
        shown = shown[:MAX_JSON_CHARS] + "\n… (cut; the whole document is at /asyncapi.json)"
    return (
        f'<div class="schema">{_layout(schema, anchors, 0)}</div>'
        f"<details><summary>JSON Schema</summary><pre>{esc(shown)}</pre></details>"
    )


def _layout(schema: object, anchors: _Anchors, depth: int) -> str:
    """A schema's summary line, and a table of its properties (a `$ref` to a named object
    schema laid out in place), nested objects inline down to MAX_DEPTH."""
    if not isinstance(schema, Mapping):
        return f"<p>{esc(json.dumps(schema, default=str))}</p>"
    head = _summary(schema, anchors)
    target = anchors.target(schema.get("$ref"))
    if target is not None and depth < MAX_DEPTH and _mapping(target.get("properties")):
        return f"<p>{head}</p>" + _layout({**target, "title": None}, anchors, depth + 1)
    properties = _mapping(schema.get("properties"))
    if not properties or depth >= MAX_DEPTH:
        return f"<p>{head}</p>" if head else ""
    required = set(schema.get("required") or ())
    rows = []
    for name, sub in properties.items():
        nested = ""
        if isinstance(sub, Mapping) and (
            _mapping(sub.get("properties")) or anchors.target(sub.get("$ref")) is not None
        ):
            nested = _layout(sub, anchors, depth + 1)
        mark = "required" if name in required else ""
        rows.append(
            f"<tr><td><code>{esc(name)}</code></td><td>{nested or _summary(sub, anchors)}</td>"
            f'<td class="none">{mark}</td></tr>'
        )
    table = (
        "<table><thead><tr><th>property</th><th>schema</th><th></th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return (f"<p>{head}</p>" if head else "") + table


def _summary(schema: object, anchors: _Anchors) -> str:
    """One line: type, format, reference, enum or const, title and description."""
    if not isinstance(schema, Mapping):
        return esc(json.dumps(schema, default=str))
    bits = []
    if "$ref" in schema:
        bits.append(anchors.ref(schema["$ref"]))
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        items = schema.get("items")
        if "array" in kinds and isinstance(items, Mapping):
            bits.append(f"array of {_summary(items, anchors)}")
        else:
            bits.append(f"<code>{esc(' | '.join(str(k) for k in kinds))}</code>")
    if schema.get("format"):
        bits.append(f"({esc(schema['format'])})")
    for word in ("anyOf", "oneOf", "allOf"):
        options = schema.get(word)
        if isinstance(options, list) and options:
            joined = " | " if word != "allOf" else " & "
            bits.append(joined.join(_summary(o, anchors) for o in options))
    if "enum" in schema and isinstance(schema["enum"], list):
        values = [f"<code>{esc(json.dumps(v, default=str))}</code>" for v in schema["enum"]]
        bits.append(f"one of {', '.join(values)}")
    if "const" in schema:
        bits.append(f"always <code>{esc(json.dumps(schema['const'], default=str))}</code>")
    if isinstance(schema.get("additionalProperties"), Mapping) and not schema.get("properties"):
        bits.append(f"map of {_summary(schema['additionalProperties'], anchors)}")
    if schema.get("title"):
        bits.append(f"<b>{esc(schema['title'])}</b>")
    if schema.get("description"):
        bits.append(f'<span class="description">{esc(schema["description"])}</span>')
    return " ".join(bits)


__all__ = ["page"]
