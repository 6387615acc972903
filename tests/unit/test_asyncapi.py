"""The AsyncAPI document of a registry: channels, messages, schemas, servers, YAML.

Typed topics are built with the real `Topic` and `Handlers` (`tests/asyncapi_support.py`).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox import Handlers, Topic
from outbox.asyncapi import (
    build_document,
    dumps,
    kafka_servers,
    load_service,
    log_servers,
    payload_schemas,
    service_of,
)
from outbox.core.errors import ConfigurationError
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID
from outbox.core.serializers import BYTES
from tests.asyncapi_support import typed_registry


def _noop(message: Any, conn: Any) -> None:
    """Do nothing."""


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Line:
    sku: str
    quantity: int = 1


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    placed_at: datetime.datetime
    total: decimal.Decimal
    colour: Colour
    lines: list[Line]
    tags: dict[str, str]
    note: str | None = None


class Opaque:
    """A class neither pydantic nor the fallback can describe."""


@dataclasses.dataclass
class Holder:
    thing: Opaque


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [ref for item in value.values() for ref in _refs(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in _refs(item)]
    return []


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _assert_refs_resolve(document: dict[str, Any]) -> None:
    for ref in _refs(document):
        _resolve(document, ref)
    assert "$defs" not in json.dumps(document)


def test_an_untyped_handler_gets_a_channel_a_receive_operation_and_any_json() -> None:
    handlers = Handlers()
    handlers.handler("orders.created")(_noop)
    document = build_document(handlers, title="svc", version="2.0.0")

    assert document["asyncapi"] == "3.0.0"
    assert document["info"]["title"] == "svc" and document["info"]["version"] == "2.0.0"
    assert document["channels"]["orders.created"]["address"] == "orders.created"
    operation = document["operations"]["receive-orders.created"]
    assert operation["action"] == "receive"
    assert operation["channel"] == {"$ref": "#/channels/orders.created"}
    assert operation["description"] == "Do nothing."
    message = document["components"]["messages"]["orders.created"]
    assert message["contentType"] == "application/json"
    assert set(message["payload"]) == {"description"}  # any JSON value
    headers = message["headers"]
    assert headers["required"] == [MESSAGE_ID, CREATED_AT, CONTENT_TYPE]
    assert headers["properties"][CONTENT_TYPE]["const"] == "application/json"
    assert headers["additionalProperties"]["type"] == "string"  # the user's headers
    assert "sender gives" in message["bindings"]["kafka"]["key"]["description"]
    assert not [op for op in document["operations"].values() if op["action"] == "send"]
    _assert_refs_resolve(document)


def test_typed_payloads_put_their_schemas_in_components_and_refs_resolve() -> None:
    pytest.importorskip("pydantic")
    from pydantic import BaseModel

    class Customer(BaseModel):
        id: uuid.UUID
        lines: list[Line]

    orders = Topic("orders", Order, key="id", description="Orders placed.")
    customers = Topic("customers", Customer)
    handlers = typed_registry(
        {"orders": (None, orders), "customers": (Customer, None)}, sent=[orders]
    )
    document = build_document(handlers, title="svc")

    schemas = document["components"]["schemas"]
    assert {"Line", "Customer"} <= set(schemas)  # the model's, by pydantic
    messages = document["components"]["messages"]
    order = messages["orders"]["payload"]  # a dataclass's, inline, as it travels
    assert order["title"] == "Order" and messages["orders"]["name"] == "Order"
    assert order["properties"]["id"]["format"] == "uuid"
    assert order["properties"]["total"]["type"] == "string"  # a Decimal travels as a string
    assert messages["customers"]["payload"] == {"$ref": "#/components/schemas/Customer"}
    by_pydantic = Customer.model_json_schema(
        ref_template="#/components/schemas/{model}", mode="serialization"
    )
    assert schemas["Customer"] == {k: v for k, v in by_pydantic.items() if k != "$defs"}
    assert "'id'" in messages["orders"]["bindings"]["kafka"]["key"]["description"]
    assert document["channels"]["orders"]["description"] == "Orders placed."
    assert document["operations"]["send-orders"]["action"] == "send"
    assert document["operations"]["receive-orders"]["action"] == "receive"
    del customers
    _assert_refs_resolve(document)


def test_a_dataclass_is_described_as_it_travels_with_or_without_pydantic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_pydantic = payload_schemas({"orders": Order})
    monkeypatch.setitem(sys.modules, "pydantic", None)  # import pydantic raises ImportError
    schemas, defs = payload_schemas({"orders": Order})
    assert (schemas, defs) == with_pydantic
    assert defs == {}
    order = schemas["orders"]
    assert order["required"] == ["id", "placed_at", "total", "colour", "lines", "tags"]
    properties = order["properties"]
    assert properties["id"] == {"type": "string", "format": "uuid"}
    assert properties["placed_at"] == {"type": "string", "format": "date-time"}
    assert properties["total"]["type"] == "string"  # Decimal: a string keeps its digits
    assert properties["colour"]["enum"] == ["red", "blue"]
    assert properties["lines"]["items"]["required"] == ["sku"]
    assert properties["tags"] == {"type": "object", "additionalProperties": {"type": "string"}}


def test_two_classes_of_one_name_are_described_apart() -> None:
    def make() -> type:
        @dataclasses.dataclass
        class Line:
            price: float

        return Line

    schemas, defs = payload_schemas({"a": Line, "b": make()})
    assert schemas["a"] != schemas["b"] and defs == {}


def test_pydantic_refusing_a_type_is_a_configuration_error_naming_the_topic() -> None:
    pytest.importorskip("pydantic")
    from pydantic import BaseModel, ConfigDict

    class Odd(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        thing: Opaque

    with pytest.raises(ConfigurationError, match=r"topic 'odd'.*Odd"):
        payload_schemas({"odd": Odd})


def test_content_types_other_than_json_are_described_as_such() -> None:
    raw = Topic("raw", None, content_type=BYTES)
    text = Topic("text", None, content_type="text/plain; charset=utf-8")
    events = Topic("events", None, content_type="application/cloudevents+json")
    document = build_document(typed_registry({}, sent=[raw, text, events]), title="svc")
    messages = document["components"]["messages"]
    assert messages["raw"]["payload"]["format"] == "binary"
    assert messages["raw"]["contentType"] == BYTES
    assert messages["text"]["payload"]["type"] == "string"
    assert "any JSON" in messages["events"]["payload"]["description"]
    assert messages["raw"]["headers"]["properties"][CONTENT_TYPE]["const"] == BYTES


def test_a_registry_without_handlers_describes_what_it_sends() -> None:
    sent = Topic("payments", None)
    document = build_document(typed_registry({}, sent=[sent]), title="svc")
    assert list(document["operations"]) == ["send-payments"]
    assert document["channels"]["payments"]["address"] == "payments"


def test_one_topic_with_two_payload_types_is_refused() -> None:
    orders = Topic("orders", Order)
    handlers = typed_registry({"orders": (Line, None)}, sent=[orders])
    with pytest.raises(ConfigurationError, match="two payload types"):
        build_document(handlers, title="svc")


def test_kafka_servers_and_the_placeholder() -> None:
    servers, schemes = kafka_servers("PLAINTEXT://k1:9092, k2:9092")
    assert servers == {
        "kafka": {
            "protocol": "kafka",
            "host": "k1:9092,k2:9092",
            "description": "The Kafka cluster, by its bootstrap servers.",
        }
    }
    assert schemes == {}
    placeholder, _ = kafka_servers(None)
    assert placeholder["kafka"]["host"] == "{bootstrap}"
    assert "bootstrap" in placeholder["kafka"]["variables"]
    secure, schemes = kafka_servers(
        "k:9093",
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.password": "pw"},
    )
    assert secure["kafka"]["protocol"] == "kafka-secure"
    assert schemes["kafka-sasl"]["type"] == "scramSha512"
    assert "pw" not in json.dumps([secure, schemes])


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cr%40t-pw@db.example:5433/logs?sslmode=require",
        "host=db.example port=5433 dbname=logs user=app password='s3cr@t-pw'",
        "postgresql+psycopg://app:s3cr%40t-pw@db.example:5433/logs",
    ],
)
def test_the_log_server_has_host_port_and_database_never_the_password(url: str) -> None:
    servers = log_servers(url, "outbox_log")
    assert servers["log"]["host"] == "db.example:5433"
    assert servers["log"]["pathname"] == "/logs"
    assert servers["log"]["protocol"] == "postgresql"
    text = json.dumps(servers)
    assert "s3cr" not in text and "app" not in text.replace("application", "")


def test_the_log_server_placeholder_and_an_unparseable_url() -> None:
    assert log_servers(None, "outbox_log")["log"]["host"] == "{host}"
    with pytest.raises(ConfigurationError, match="libpq"):
        log_servers("postgresql://[broken", "outbox_log")


TRICKY = [
    "yes",
    "on",
    "No",
    "~",
    "null",
    "1.0",
    "0x1f",
    "a: b # c",
    "- item",
    "line\nbreak\ttab",
    'quote " and \\ backslash',
    "ünïcödé 😀",
    "\x85 \u2028 \ufeff \x7f",
    "",
    " leading and trailing ",
    "{not: a map}",
    "@at",
    "`tick",
    "*alias",
    "&anchor",
    "!tag",
    "%percent",
]


def test_yaml_output_reads_back_as_the_json_does() -> None:
    document: dict[str, Any] = {
        "asyncapi": "3.0.0",
        "strings": TRICKY,
        "keys": {word: word for word in TRICKY},
        "numbers": [0, -1, 1.5, 1e300, True, False, None],
        "empty": {"map": {}, "list": []},
        "nested": [[1, [2, {}]], {"a": [{"b": {"c": []}}]}, []],
        "$ref": "#/components/schemas/X",
    }
    assert yaml.safe_load(dumps(document, "yaml")) == document
    assert json.loads(dumps(document, "json")) == document


def test_a_whole_document_reads_back_from_yaml() -> None:
    orders = Topic("orders", Order, key="id")
    document = build_document(typed_registry({"orders": (None, orders)}), title="svc")
    assert yaml.safe_load(dumps(document, "yaml")) == document


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="json or yaml"):
        dumps({}, "toml")


def test_the_how_to_commands_parse() -> None:
    from pathlib import Path

    from outbox.cli import build_parser
    from tests.unit.test_docs_commands import outbox_commands

    page = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "asyncapi.md"
    commands = outbox_commands(page.read_text())
    assert len(commands) == 5
    for args in commands:
        assert build_parser().parse_args(args).command == "asyncapi"


# -- any service: Topics, a Topic list, a module ----------------------------------------------


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def test_a_list_of_topics_is_a_service_that_only_sends() -> None:
    placed, paid = Topic("orders.placed", Line), Topic("orders.paid", None)
    for given in ([placed, paid], (placed, paid), [placed, paid, placed]):
        document = build_document(given, title="s")
        assert list(document["operations"]) == ["send-orders.placed", "send-orders.paid"]
        assert (
            "Sends: orders.placed, orders.paid. Receives: nothing."
            in (document["info"]["description"])
        )
    assert list(build_document(placed, title="s")["channels"]) == ["orders.placed"]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "the service is an empty list: no Topic"),
        ([Topic("a", None), "b"], r"the service\[1\] is a str, not an outbox.Topic"),
        (42, "is a int, not an outbox.Handlers registry, a Topic or a list of Topics"),
        ("orders", "is a str, not an outbox.Handlers registry"),
        ({"orders": Topic("a", None)}, "is a dict, not"),
    ],
)
def test_what_is_not_a_service_is_named(given: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        service_of(given)


def test_a_module_receives_what_its_registries_handle_and_sends_its_other_topics() -> None:
    placed = Topic("orders.placed", Line, description="<b>placed</b>")
    paid = Topic("orders.paid", None)
    refunded = Topic("orders.refunded", None)
    handlers = Handlers()
    handlers.handler(placed)(_noop)
    audit = Handlers()
    audit.handler("audit")(_noop)
    audit.sends(refunded)
    module = _module(
        "svc", handlers=handlers, again=handlers, audit=audit, PLACED=placed, PAID=paid
    )
    service = service_of(module)
    assert [s.topic for s in service.receivers] == ["orders.placed", "audit"]
    assert [t.name for t in service.sent] == ["orders.refunded", "orders.paid"]
    document = build_document(module, title="svc")
    assert set(document["operations"]) == {
        "receive-orders.placed",
        "receive-audit",
        "send-orders.refunded",
        "send-orders.paid",
    }
    assert document["channels"]["orders.placed"]["description"] == "<b>placed</b>"


def test_a_topic_a_module_both_sends_and_receives_is_declared_with_sends() -> None:
    notes = Topic("notes", None)
    handlers = Handlers()
    handlers.handler(notes)(_noop)
    handlers.sends(notes)
    document = build_document(_module("svc", handlers=handlers, NOTES=notes), title="svc")
    assert set(document["operations"]) == {"receive-notes", "send-notes"}


def test_a_module_with_nothing_or_two_handlers_of_a_topic_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"module 'empty' has no outbox\.Topic"):
        service_of(_module("empty", VALUE=1, Topic=Topic, Handlers=Handlers))
    one, two = Handlers(), Handlers()
    one.handler("orders")(_noop)
    two.handler("orders")(lambda message, conn: None)
    with pytest.raises(ConfigurationError, match="'orders' has two handlers in two registries"):
        service_of(_module("svc", one=one, two=two))
    json_registry, other = Handlers(), Handlers(serializer=_Plain())
    with pytest.raises(ConfigurationError, match="serializers write"):
        service_of(_module("svc", a=json_registry, b=other))


class _Plain:
    content_type = "text/csv"

    def dumps(self, payload: Any) -> bytes:
        return str(payload).encode()

    def loads(self, data: bytes) -> Any:
        return data.decode()


def test_load_service_takes_a_module_or_an_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "svc_contracts_unit.py").write_text(
        "from outbox import Topic\n\nA = Topic('a', None)\nB = Topic('b', None)\nBOTH = [A, B]\n"
        "import json\n"
    )
    (tmp_path / "svc_broken_unit.py").write_text("raise RuntimeError('at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [t.name for t in load_service("svc_contracts_unit").sent] == ["a", "b"]
    assert [t.name for t in load_service("svc_contracts_unit:BOTH").sent] == ["a", "b"]
    assert [t.name for t in load_service("svc_contracts_unit:B").sent] == ["b"]
    with pytest.raises(ConfigurationError, match=r"'json' has no outbox\.Topic"):
        load_service("svc_contracts_unit:json")  # a module attribute: described as a module
    with pytest.raises(ConfigurationError, match="RuntimeError: at import"):
        load_service("svc_broken_unit")
    for bad in ("", ":x", "svc_contracts_unit:"):
        with pytest.raises(ConfigurationError, match="MODULE or MODULE:ATTRIBUTE"):
            load_service(bad)
