"""The AsyncAPI 3.0 document of a service: what it receives (its handlers) and what it sends
(its `Topic`s, or the topics its registry declares with `handlers.sends`), over Kafka or the
PostgreSQL log.

A service is given as a `Handlers` registry, a `Topic` or a list of them, or a module holding
its registries and Topics (`load_service`): a service that only sends needs no registry.

Each topic is a channel with one message: its payload's JSON Schema as the payload travels (a
pydantic model's by pydantic, a dataclass's by the codec's rules, `outbox.core.codecs`; any
JSON when the topic declares no type), its key, and the headers outbox puts on every record. Named
schemas live in `components/schemas` and every `$ref` points there. Secrets never reach the
document: a log URL gives only its host, port and database.

Pure code: building the document imports the service's registry and nothing connects.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from outbox._version import version as outbox_version
from outbox.core.codecs import is_model, json_schema
from outbox.core.errors import ConfigurationError
from outbox.core.handlers import Handlers, HandlerSpec, load_handlers
from outbox.core.headers import (
    CAUSATION_ID,
    CONTENT_TYPE,
    CORRELATION_ID,
    CREATED_AT,
    MESSAGE_ID,
    TRACEPARENT,
    TRACESTATE,
)
from outbox.core.serializers import BYTES, JSON
from outbox.core.text import first_line
from outbox.core.topics import Topic

ASYNCAPI_VERSION = "3.0.0"
#: Where named schemas live and how a `$ref` names one.
SCHEMAS = "#/components/schemas/"
#: The Kafka bindings' version the message and operation bindings follow.
KAFKA_BINDING_VERSION = "0.5.0"
FORMATS = ("json", "yaml")


@dataclasses.dataclass
class _Channel:
    """What the document says about one topic, gathered from handlers and sent topics."""

    name: str
    payload: Any = None
    content_type: str | None = None
    description: str = ""
    key: Any = None
    receivers: list[HandlerSpec] = dataclasses.field(default_factory=list)
    sent: bool = False


# -- the service -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Service:
    """What a document describes: the handlers a service runs (what it receives) and the topics
    it sends, and the content type of payloads its registry's serializer writes."""

    receivers: tuple[HandlerSpec, ...] = ()
    sent: tuple[Topic[Any], ...] = ()
    content_type: str = JSON


def service_of(target: object, where: str = "the service") -> Service:
    """The `Service` of a `Handlers` registry, a `Topic`, a list (tuple, set) of Topics or a
    module; a `ConfigurationError` naming `where` for anything else."""
    if isinstance(target, Service):
        return target
    if isinstance(target, Handlers):
        return Service(tuple(target), target.sent_topics, target.serializer.content_type)
    if isinstance(target, Topic):
        return Service(sent=(target,))
    if isinstance(target, types.ModuleType):
        return _module_service(target)
    if isinstance(target, Iterable) and not isinstance(target, str | bytes | Mapping):
        topics = list(target)
        if not topics:
            raise ConfigurationError(f"{where} is an empty {type(target).__name__}: no Topic")
        for index, item in enumerate(topics):
            if not isinstance(item, Topic):
                raise ConfigurationError(
                    f"{where}[{index}] is a {type(item).__name__}, not an outbox.Topic"
                )
        return Service(sent=tuple(_distinct(topics)))
    raise ConfigurationError(
        f"{where} is a {type(target).__name__}, not an outbox.Handlers registry, a Topic or a "
        "list of Topics"
    )


def _distinct(items: Iterable[Any]) -> list[Any]:
    """`items` without repeats of one object, in order."""
    seen: dict[int, Any] = {}
    for item in items:
        seen.setdefault(id(item), item)
    return list(seen.values())


def _module_service(module: types.ModuleType) -> Service:
    """A module's service: the handlers of every `Handlers` registry at its top level, and its
    top-level Topics that none of them receives (a Topic handled here is received; declare
    with `handlers.sends` one this service both sends and receives), with the registries'
    declared sent topics."""
    values = list(vars(module).values())
    registries = _distinct(v for v in values if isinstance(v, Handlers))
    topics = _distinct(v for v in values if isinstance(v, Topic))
    name = module.__name__
    if not registries and not topics:
        raise ConfigurationError(
            f"module {name!r} has no outbox.Topic and no outbox.Handlers registry at its top "
            "level: name one as MODULE:ATTRIBUTE (a registry, a Topic or a list of Topics)"
        )
    receivers: list[HandlerSpec] = []
    handled: dict[str, HandlerSpec] = {}
    for registry in registries:
        for spec in registry:
            other = handled.get(spec.topic)
            if other is not None and other.func is not spec.func:
                raise ConfigurationError(
                    f"module {name!r}: topic {spec.topic!r} has two handlers in two registries "
                    f"({other.name} and {spec.name}); name one registry as MODULE:ATTRIBUTE"
                )
            if other is None:
                handled[spec.topic] = spec
                receivers.append(spec)
    content_types = {r.serializer.content_type for r in registries}
    if len(content_types) > 1:
        raise ConfigurationError(
            f"module {name!r}: its registries' serializers write {sorted(content_types)}; "
            "name one registry as MODULE:ATTRIBUTE"
        )
    declared = [t for r in registries for t in r.sent_topics]
    received = {id(s.declared) for s in receivers if s.declared is not None}
    sent = [t for t in topics if id(t) not in received and t.name not in handled]
    return Service(
        tuple(receivers),
        tuple(_distinct([*declared, *sent])),
        content_types.pop() if content_types else JSON,
    )


def load_service(path: str) -> Service:
    """The `Service` of `MODULE[:ATTRIBUTE]`: ATTRIBUTE a `Handlers` registry (which may have no
    handlers), a `Topic` or a list of Topics; MODULE alone, its registries and Topics. One
    `ConfigurationError` for every way that fails, the module's own exception included."""
    module_name, sep, attribute = path.partition(":")
    if not module_name or (sep and not attribute):
        raise ConfigurationError(
            "give the service as MODULE or MODULE:ATTRIBUTE (e.g. myservice.handlers:handlers, "
            f"or myservice.contracts for a module of Topics), got {path!r}"
        )
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself fails
        raise ConfigurationError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    if not sep:
        return _module_service(module)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(target, types.ModuleType):
        return _module_service(target)
    return service_of(target, path)


def load_registry(path: str) -> Handlers:
    """Import `package.module:attribute`, a `Handlers` registry (which may have no handlers: a
    service that only sends)."""
    return load_handlers(path, allow_empty=True)


# -- servers -----------------------------------------------------------------------------------

_SASL_SCHEMES = {
    "PLAIN": "plain",
    "SCRAM-SHA-256": "scramSha256",
    "SCRAM-SHA-512": "scramSha512",
    "GSSAPI": "gssapi",
}


def kafka_servers(
    bootstrap: str | None, kafka_config: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `servers` of a service on Kafka, and the security schemes they use.

    The bootstrap list is the server's host; without one, a placeholder whose host is a
    variable. Only non-secret settings are read from `kafka_config` (security.protocol,
    sasl.mechanism): SSL makes the protocol kafka-secure, a SASL mechanism a security scheme.
    """
    from outbox.core.redact import redact_text

    config = {key.strip().lower(): str(value) for key, value in (kafka_config or {}).items()}
    security = config.get("security.protocol", "").strip().upper()
    server: dict[str, Any] = {"protocol": "kafka-secure" if "SSL" in security else "kafka"}
    if bootstrap and bootstrap.strip():
        hosts = [re.sub(r"^[A-Za-z_]+://", "", h.strip()) for h in bootstrap.split(",")]
        server["host"] = redact_text(",".join(h for h in hosts if h))
        server["description"] = "The Kafka cluster, by its bootstrap servers."
    else:
        server["host"] = "{bootstrap}"
        server["description"] = (
            "A placeholder: no Kafka bootstrap servers were given (--kafka-bootstrap)."
        )
        server["variables"] = {
            "bootstrap": {
                "description": "Kafka bootstrap servers, host:port[,...]",
                "default": "localhost:9092",
            }
        }
    schemes: dict[str, Any] = {}
    mechanism = config.get("sasl.mechanism", config.get("sasl.mechanisms", "")).strip().upper()
    if security.startswith("SASL") and mechanism in _SASL_SCHEMES:
        schemes["kafka-sasl"] = {
            "type": _SASL_SCHEMES[mechanism],
            "description": f"SASL {mechanism} (security.protocol {security})",
        }
        server["security"] = [{"$ref": "#/components/securitySchemes/kafka-sasl"}]
    return {"kafka": server}, schemes


def log_servers(url: str | None, schema: str) -> dict[str, Any]:
    """The `servers` of a service on the PostgreSQL log: host, port and database of `url`
    (never its user, password or other parameters); a placeholder without one."""
    description = (
        f"The outbox log in PostgreSQL (schema {schema!r}): Kafka-like topics, partitions and "
        "consumer groups kept in tables, read and written by outbox's daemons "
        "(--transport postgres)."
    )
    if not url:
        return {
            "log": {
                "host": "{host}",
                "pathname": "/{database}",
                "protocol": "postgresql",
                "description": f"{description} A placeholder: no --log-url was given.",
                "variables": {
                    "host": {"description": "host[:port] of the log database"},
                    "database": {"description": "the log database"},
                },
            }
        }
    from outbox.core.redact import parse_conninfo

    params = parse_conninfo(url)
    if params is None:
        raise ConfigurationError("--log-url is not a PostgreSQL URL libpq can parse")
    host = params.get("host") or params.get("hostaddr") or "localhost"
    ports = params.get("port")
    if ports:
        host = ",".join(
            f"{h}:{p}"
            for h, p in zip(host.split(","), _repeat(ports.split(","), host), strict=True)
        )
    server: dict[str, Any] = {"host": host, "protocol": "postgresql", "description": description}
    if params.get("dbname"):
        server["pathname"] = "/" + params["dbname"]
    return {"log": server}


def _repeat(ports: list[str], hosts: str) -> list[str]:
    """libpq's rule: one port for every host, or one port for them all."""
    count = len(hosts.split(","))
    return ports if len(ports) == count else [ports[0]] * count


# -- payload schemas ---------------------------------------------------------------------------


def is_json(content_type: str) -> bool:
    """True for application/json and the +json types (application/cloudevents+json, ...)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def payload_schemas(
    payload_types: Mapping[str, Any],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """JSON Schemas of payload types, by topic, and the named schemas they refer to, each
    describing the payload as it travels (what `JsonSerializer` writes and the handler reads).

    A pydantic model is described by pydantic in serialization mode, its named schemas moved to
    `components/schemas` (every `$ref` points there); any other type (a dataclass) by the
    codec's own rules, `outbox.core.codecs.json_schema` (Decimal as a string, bytes as base64),
    inline. An undescribable type is a `ConfigurationError` naming its topic.
    """
    models = {topic: tp for topic, tp in payload_types.items() if is_model(tp)}
    described, defs = _model_schemas(models) if models else ({}, {})
    schemas: dict[str, dict[str, Any]] = {}
    for topic, tp in payload_types.items():
        if topic in described:
            schemas[topic] = described[topic]
            continue
        try:
            schemas[topic] = json_schema(tp)
        except (NameError, TypeError) as exc:
            raise _undescribable(topic, tp, exc) from None
    return schemas, defs


def _model_schemas(
    models: Mapping[str, Any],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    from pydantic import PydanticUserError, TypeAdapter

    adapters: list[tuple[str, Any, TypeAdapter[Any]]] = []
    for topic, tp in models.items():
        try:
            adapters.append((topic, "serialization", TypeAdapter(tp)))
        except PydanticUserError as exc:
            raise _undescribable(topic, tp, exc) from None
    try:
        by_key, top = TypeAdapter.json_schemas(adapters, ref_template=SCHEMAS + "{model}")
    except PydanticUserError as exc:
        # json_schemas does not say which type failed: find it, one at a time.
        for topic, _mode, adapter in adapters:
            try:
                adapter.json_schema(ref_template=SCHEMAS + "{model}", mode="serialization")
            except PydanticUserError as one:
                raise _undescribable(topic, models[topic], one) from None
        raise ConfigurationError(f"cannot describe the payload types: {first_line(exc)}") from None
    schemas = {topic: schema for (topic, _mode), schema in by_key.items()}
    return schemas, dict(top.get("$defs", {}))


def _undescribable(topic: str, tp: Any, exc: BaseException) -> ConfigurationError:
    return ConfigurationError(
        f"topic {topic!r}: cannot describe its payload type {_type_name(tp)} in JSON Schema: "
        f"{first_line(exc)}"
    )


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _described_payload(content_type: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    """The payload schema of a message: the type's when JSON and typed; else by content type."""
    if not is_json(content_type):
        if content_type == BYTES:
            return {"type": "string", "format": "binary", "description": "raw bytes"}
        if content_type.lower().startswith("text/"):
            return {"type": "string", "description": f"text ({content_type})"}
        return {"description": f"bytes of content type {content_type}, not described here"}
    if schema is None:
        return {"description": "any JSON value: the topic declares no payload type"}
    return schema


# -- the document ------------------------------------------------------------------------------


def _gather(service: Service) -> dict[str, _Channel]:
    """The channels of a service: one per topic handled or sent, in that order."""
    channels: dict[str, _Channel] = {}
    default_type = service.content_type

    def merge(name: str, declared: Any, payload: Any, origin: str) -> _Channel:
        channel = channels.setdefault(name, _Channel(name))
        if payload is not None:
            if channel.payload is not None and channel.payload != payload:
                raise ConfigurationError(
                    f"topic {name!r} has two payload types: {_type_name(channel.payload)} and "
                    f"{_type_name(payload)} ({origin}); one topic carries one type"
                )
            channel.payload = payload
        if declared is not None:
            content_type = getattr(declared, "content_type", None)
            if content_type:
                if channel.content_type not in (None, content_type):
                    raise ConfigurationError(
                        f"topic {name!r} has two content types: {channel.content_type!r} and "
                        f"{content_type!r} ({origin})"
                    )
                channel.content_type = content_type
            channel.description = channel.description or getattr(declared, "description", "")
            if channel.key is None:
                channel.key = getattr(declared, "key", None)
        return channel

    for spec in service.receivers:
        declared = spec.declared
        payload = (declared.payload if declared is not None else None) or spec.payload_type
        merge(spec.topic, declared, payload, f"the handler {spec.name}").receivers.append(spec)
    for topic in service.sent:
        merge(topic.name, topic, topic.payload, "a sent topic").sent = True
    for channel in channels.values():
        channel.content_type = channel.content_type or default_type
    return channels


def _key_schema(key: Any) -> dict[str, Any]:
    if key is None:
        text = "the key the sender gives (key=), or none"
    elif isinstance(key, str):
        text = f"the payload's {key!r}, as text"
    else:
        text = f"derived from the payload by {getattr(key, '__qualname__', repr(key))}"
    return {
        "type": "string",
        "description": f"The record key: {text}. Messages of one key keep their order.",
    }


def _headers_schema(content_type: str) -> dict[str, Any]:
    """The headers every record carries: outbox's own, then the sender's (strings, or bytes)."""
    uuid_text = {"type": "string", "format": "uuid"}
    return {
        "type": "object",
        "properties": {
            MESSAGE_ID: {**uuid_text, "description": "The message's id, unique per message."},
            CREATED_AT: {
                "type": "string",
                "format": "date-time",
                "description": "When the message was written to the outbox (ISO 8601).",
            },
            CONTENT_TYPE: {
                "type": "string",
                "const": content_type,
                "description": "The payload's content type.",
            },
            CORRELATION_ID: {
                **uuid_text,
                "description": "The conversation's id; absent: the message's own id.",
            },
            CAUSATION_ID: {
                **uuid_text,
                "description": "The id of the message whose handler sent this one, if any.",
            },
            TRACEPARENT: {"type": "string", "description": "W3C trace context, if any."},
            TRACESTATE: {"type": "string", "description": "W3C trace state, if any."},
        },
        "required": [MESSAGE_ID, CREATED_AT, CONTENT_TYPE],
        "additionalProperties": {
            "type": "string",
            "description": "The sender's headers (names not starting with outbox-); a bytes "
            "value is carried as it is.",
        },
    }


def build_document(
    service: Handlers | Service | Topic[Any] | Iterable[Topic[Any]] | types.ModuleType,
    *,
    title: str,
    version: str = "1.0.0",
    servers: Mapping[str, Any] | None = None,
    security_schemes: Mapping[str, Any] | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of a service (`service_of`: a registry, a Topic or a list of
    them, a module): a channel and a message per topic, a receive operation per handler, a
    send operation per topic sent; `info.description` names both sets."""
    channels = _gather(service_of(service))
    typed = {
        name: channel.payload
        for name, channel in channels.items()
        if channel.payload is not None and is_json(channel.content_type or JSON)
    }
    schemas, defs = payload_schemas(typed)
    description = f"Generated by outbox {outbox_version()}"
    description += f" from {source}." if source else "."
    sends = [name for name, channel in channels.items() if channel.sent]
    receives = [name for name, channel in channels.items() if channel.receivers]
    description += f" Sends: {', '.join(sends) or 'nothing'}."
    description += f" Receives: {', '.join(receives) or 'nothing'}."
    document: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {"title": title, "version": version, "description": description},
        "defaultContentType": JSON,
        "servers": dict(servers or kafka_servers(None)[0]),
        "channels": {},
        "operations": {},
        "components": {"messages": {}},
    }
    for name, channel in channels.items():
        content_type = channel.content_type or JSON
        message: dict[str, Any] = {
            "name": getattr(channel.payload, "__name__", None) or name,
            "title": f"A message on {name}",
            "contentType": content_type,
            "headers": _headers_schema(content_type),
            "payload": _described_payload(content_type, schemas.get(name)),
            "correlationId": {
                "description": "The conversation a message belongs to.",
                "location": f"$message.header#/{CORRELATION_ID}",
            },
            "bindings": {
                "kafka": {"key": _key_schema(channel.key), "bindingVersion": KAFKA_BINDING_VERSION}
            },
        }
        document["components"]["messages"][name] = message
        entry: dict[str, Any] = {
            "address": name,
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }
        if channel.description:
            entry["description"] = channel.description
        document["channels"][name] = entry
        reference = {"$ref": f"#/channels/{name}"}
        messages = [{"$ref": f"#/channels/{name}/messages/{name}"}]
        for spec in channel.receivers:
            operation: dict[str, Any] = {
                "action": "receive",
                "channel": reference,
                "messages": messages,
                "summary": f"{'Batch handler' if spec.batch else 'Handler'} {spec.name}",
            }
            doc = (spec.func.__doc__ or "").strip()
            if doc:
                operation["description"] = doc.splitlines()[0]
            document["operations"][f"receive-{name}"] = operation
        if channel.sent:
            document["operations"][f"send-{name}"] = {
                "action": "send",
                "channel": reference,
                "messages": messages,
                "summary": f"Sent to {name} through the outbox",
            }
    if defs:
        document["components"]["schemas"] = defs
    if security_schemes:
        document["components"]["securitySchemes"] = dict(security_schemes)
    return document


# -- output ------------------------------------------------------------------------------------


def dumps(document: Mapping[str, Any], format: str = "json") -> str:
    """The document as JSON (indented) or YAML (block style, every string quoted), ending in a
    newline. The YAML is written here, not by PyYAML: it needs no extra and reads back as the
    JSON does in any YAML 1.1 or 1.2 parser."""
    if format == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if format == "yaml":
        lines: list[str] = []
        _yaml(document, 0, lines)
        return "\n".join(lines) + "\n"
    raise ConfigurationError(f"--format must be json or yaml, got {format!r}")


# Characters a YAML stream must not hold raw (outside the printable set), or that a reader
# may take for a line break; escaped in double quotes.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")
_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.\-]*")
# Plain words YAML 1.1 reads as booleans or null.
_YAML_WORDS = frozenset(["y", "n", "yes", "no", "on", "off", "true", "false", "null"])


def _yaml_str(text: str) -> str:
    quoted = json.dumps(text, ensure_ascii=False)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _yaml_key(key: str) -> str:
    if _PLAIN_KEY.fullmatch(key) and key.lower() not in _YAML_WORDS:
        return key
    return _yaml_str(key)


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, str):
        return _yaml_str(value)
    if isinstance(value, float):
        text = json.dumps(value)
        # YAML 1.1 reads 1e+300 as a string: a float needs a dot before its exponent.
        return text if "." in text or "e" not in text else text.replace("e", ".0e", 1)
    if value is None or isinstance(value, bool | int):
        return json.dumps(value)  # null, true, false, integers: the same in YAML
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, list | tuple) and not value:
        return "[]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _yaml(value: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            if isinstance(item, Mapping | list | tuple) and item:
                lines.append(f"{pad}{_yaml_key(str(key))}:")
                _yaml(item, indent + 2, lines)
            else:
                lines.append(f"{pad}{_yaml_key(str(key))}: {_yaml_scalar(item)}")
    elif isinstance(value, list | tuple) and value:
        for item in value:
            if isinstance(item, Mapping | list | tuple) and item:
                nested: list[str] = []
                _yaml(item, indent + 2, nested)
                lines.append(f"{pad}- {nested[0].lstrip()}")
                lines.extend(nested[1:])
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    else:
        lines.append(pad + _yaml_scalar(value))


__all__ = [
    "ASYNCAPI_VERSION",
    "FORMATS",
    "Service",
    "build_document",
    "dumps",
    "kafka_servers",
    "load_registry",
    "load_service",
    "log_servers",
    "payload_schemas",
    "service_of",
]
