"""`outbox asyncapi`: its documents pass the official AsyncAPI parser, and the command's errors
are one line.

The parser is npm's @asyncapi/parser, which `./run test` installs in .cache/asyncapi (or
OUTBOX_ASYNCAPI_PARSER_DIR); node runs tests/asyncapi/validate.cjs with it. A missing parser
FAILS these tests: only OUTBOX_TEST_SKIP_ASYNCAPI=1 skips the validation.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox import Topic
from outbox.asyncapi import SCHEMAS, build_document, dumps, kafka_servers, log_servers
from tests.asyncapi_support import typed_registry

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = ROOT / "tests" / "asyncapi" / "validate.cjs"
SKIP = os.environ.get("OUTBOX_TEST_SKIP_ASYNCAPI", "").strip().lower() in {"1", "true", "yes"}


def _parser_dir() -> Path:
    return Path(os.environ.get("OUTBOX_ASYNCAPI_PARSER_DIR") or ROOT / ".cache" / "asyncapi")


def validate(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """The official parser's exit code and diagnostics for the document at `path`."""
    if SKIP:
        pytest.skip("OUTBOX_TEST_SKIP_ASYNCAPI is set: the document is not validated")
    node = shutil.which("node")
    if node is None:
        pytest.fail(
            "node not found: the AsyncAPI document cannot be validated (./run test installs "
            "nodejs and @asyncapi/parser; OUTBOX_TEST_SKIP_ASYNCAPI=1 skips this test)"
        )
    parser = _parser_dir()
    if not (parser / "node_modules" / "@asyncapi" / "parser").is_dir():
        pytest.fail(
            f"@asyncapi/parser is not installed in {parser}: run ./run test (which installs "
            "it) or `npm install --prefix .cache/asyncapi @asyncapi/parser`; "
            "OUTBOX_TEST_SKIP_ASYNCAPI=1 skips this test"
        )
    result = subprocess.run(
        [node, str(VALIDATE), str(parser), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr
    diagnostics = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return result.returncode, diagnostics


def assert_valid(path: Path) -> None:
    code, diagnostics = validate(path)
    problems = [d for d in diagnostics if d["severity"] in ("error", "warning")]
    assert code == 0 and not problems, json.dumps(diagnostics, indent=2)


def _write(tmp_path: Path, document: dict[str, Any], name: str = "asyncapi.json") -> Path:
    path = tmp_path / name
    path.write_text(dumps(document, "yaml" if name.endswith(".yaml") else "json"))
    return path


class Status(enum.Enum):
    OPEN = "open"
    PAID = "paid"


@dataclasses.dataclass
class Line:
    sku: str
    quantity: int = 1


@dataclasses.dataclass
class OrderPlaced:
    order_id: uuid.UUID
    placed_at: datetime.datetime
    total: decimal.Decimal
    status: Status
    lines: list[Line]
    note: str | None = None


def _typed_document(monkeypatch: pytest.MonkeyPatch, *, pydantic: bool) -> dict[str, Any]:
    if not pydantic:
        monkeypatch.setitem(sys.modules, "pydantic", None)
    placed = Topic("orders.placed", OrderPlaced, key="order_id", description="Orders.")
    paid = Topic("orders.paid", Line, key=lambda line: line.sku)
    raw = Topic("files", None, content_type="application/octet-stream")
    handlers = typed_registry(
        {"orders.placed": (None, placed), "payments": (Line, None), "untyped": (None, None)},
        sent=[placed, paid, raw],
    )
    servers, schemes = kafka_servers(
        "k1:9092,k2:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    )
    return build_document(handlers, title="orders", servers=servers, security_schemes=schemes)


@pytest.mark.parametrize("pydantic", [True, False], ids=["pydantic", "fallback"])
@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_a_document_with_typed_payloads_is_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pydantic: bool, suffix: str
) -> None:
    if pydantic:
        pytest.importorskip("pydantic")
    document = _typed_document(monkeypatch, pydantic=pydantic)
    assert document["components"]["messages"]["orders.placed"]["payload"]["title"] == "OrderPlaced"
    assert_valid(_write(tmp_path, document, f"asyncapi.{suffix}"))


def test_a_document_with_no_handlers_on_the_log_is_valid(tmp_path: Path) -> None:
    handlers = typed_registry({}, sent=[Topic("payments", None)])
    for url in ("postgresql://app:pw@db:5432/log", None):
        document = build_document(handlers, title="s", servers=log_servers(url, "outbox_log"))
        assert_valid(_write(tmp_path, document))


def test_the_validator_reports_a_dangling_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = _typed_document(monkeypatch, pydantic=False)
    document["components"]["messages"]["untyped"]["payload"] = {"$ref": SCHEMAS + "Line"}
    code, diagnostics = validate(_write(tmp_path, document))
    assert code == 1
    assert any(
        d["severity"] == "error" and d["code"] == "invalid-ref" and "Line" in d["message"]
        for d in diagnostics
    ), diagnostics


SERVICE = textwrap.dedent(
    '''
    from outbox import Handlers

    handlers = Handlers()


    @handlers.handler("orders.created")
    def on_created(message, conn):
        """Record a created order."""


    @handlers.batch_handler("audit")
    def on_audit(messages, conn):
        pass


    nothing = Handlers()
    not_a_registry = 42
    '''
)


#: A service that only sends: a module of Topics, no Handlers.
CONTRACTS = textwrap.dedent(
    """
    import dataclasses
    import decimal

    import pydantic

    from outbox import Topic


    @dataclasses.dataclass
    class OrderPlaced:
        order_id: int
        total: decimal.Decimal


    class Paid(pydantic.BaseModel):
        order_id: int
        via: str = pydantic.Field(description="the payment's <b>method</b>")


    PLACED = Topic("orders.placed", OrderPlaced, key="order_id", description="Orders placed.")
    PAID = Topic("orders.paid", Paid, description='Paid; "quoted" & <i>marked</i>.')
    ALIAS = PLACED  # the same Topic under a second name: one channel
    ALL = [PLACED, PAID]
    EMPTY = []
    MIXED = [PLACED, "orders.paid"]
    """
)

#: A module with a registry and Topics: the handled one is received, the other sent.
MIXED_SERVICE = textwrap.dedent(
    '''
    from outbox import Handlers, InboxMessage, Topic

    from contracts_asyncapi import PAID, PLACED

    REFUNDED = Topic("orders.refunded", None, description="Refunds.")
    handlers = Handlers()


    @handlers.handler(PLACED)
    def on_placed(message, conn):
        """Bill a placed order."""
    '''
)

#: A module with neither.
NOTHING = "VALUE = 1\n"


def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "service_asyncapi.py").write_text(SERVICE)
    (tmp_path / "contracts_asyncapi.py").write_text(CONTRACTS)
    (tmp_path / "mixed_asyncapi.py").write_text(MIXED_SERVICE)
    (tmp_path / "nothing_asyncapi.py").write_text(NOTHING)
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OUTBOX_") or key.startswith("OUTBOX_TEST")
    }
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "outbox", "asyncapi", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=environ,
    )


def test_the_command_writes_a_valid_document_for_kafka_to_stdout(tmp_path: Path) -> None:
    result = _cli(tmp_path, "service_asyncapi:handlers", OUTBOX_KAFKA_BOOTSTRAP="kafka:9092")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["servers"]["kafka"]["host"] == "kafka:9092"
    assert set(document["operations"]) == {"receive-orders.created", "receive-audit"}
    assert document["info"]["title"] == "service_asyncapi:handlers"
    assert_valid(_write(tmp_path, document))


def test_the_command_on_the_log_never_prints_the_password(tmp_path: Path) -> None:
    output = tmp_path / "service.yaml"
    result = _cli(
        tmp_path,
        "service_asyncapi:handlers",
        "--transport",
        "postgres",
        "--output",
        str(output),
        "--title",
        "Orders",
        OUTBOX_LOG_URL="postgresql://app:hunter2-secret@logdb:6543/log",
    )
    assert result.returncode == 0, result.stderr
    text = output.read_text()
    assert "hunter2" not in text + result.stdout + result.stderr
    document = yaml.safe_load(text)  # YAML, from the file's suffix
    assert document["servers"]["log"]["host"] == "logdb:6543"
    assert document["info"]["title"] == "Orders"
    assert_valid(output)


def test_the_command_with_no_server_and_no_handlers_gives_a_placeholder(tmp_path: Path) -> None:
    result = _cli(tmp_path, "service_asyncapi:nothing", "--format", "yaml")
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert document["servers"]["kafka"]["host"] == "{bootstrap}"
    assert document["channels"] == {}
    assert_valid(_write(tmp_path, document))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["service_asyncapi:not_a_registry"], "not an outbox.Handlers registry"),
        (["service_asyncapi:missing"], "has no attribute 'missing'"),
        (["no_such_module_asyncapi:h"], "cannot import 'no_such_module_asyncapi'"),
        (["nothing_asyncapi"], "has no outbox.Topic and no outbox.Handlers registry"),
        (["service_asyncapi:"], "give the service as MODULE or MODULE:ATTRIBUTE"),
        (["contracts_asyncapi:EMPTY"], "contracts_asyncapi:EMPTY is an empty list"),
        (["contracts_asyncapi:MIXED"], "contracts_asyncapi:MIXED[1] is a str, not an outbox"),
        (["service_asyncapi:handlers", "--output", "/nonexistent/dir/a.json"], "cannot write"),
    ],
)
def test_the_command_fails_in_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    result = _cli(tmp_path, *args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert result.stdout == ""


def test_a_module_of_topics_is_a_service_that_only_sends(tmp_path: Path) -> None:
    result = _cli(tmp_path, "contracts_asyncapi")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document["channels"]) == {"orders.placed", "orders.paid"}
    assert set(document["operations"]) == {"send-orders.placed", "send-orders.paid"}
    description = document["info"]["description"]
    assert "Sends: orders.placed, orders.paid. Receives: nothing." in description
    assert document["channels"]["orders.paid"]["description"] == 'Paid; "quoted" & <i>marked</i>.'
    assert_valid(_write(tmp_path, document))


@pytest.mark.parametrize("target", ["contracts_asyncapi:ALL", "contracts_asyncapi:PAID"])
def test_a_topic_or_a_list_of_topics(tmp_path: Path, target: str) -> None:
    result = _cli(tmp_path, target, "--format", "yaml")
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert all(op["action"] == "send" for op in document["operations"].values())
    assert "orders.paid" in document["channels"]
    assert_valid(_write(tmp_path, document, "asyncapi.yaml"))


def test_a_module_with_a_registry_says_what_it_receives_and_what_it_sends(tmp_path: Path) -> None:
    result = _cli(tmp_path, "mixed_asyncapi")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document["operations"]) == {
        "receive-orders.placed",  # its handler's
        "send-orders.paid",  # imported, no handler here: sent
        "send-orders.refunded",
    }
    assert document["operations"]["receive-orders.placed"]["description"] == "Bill a placed order."
    assert "Receives: orders.placed." in document["info"]["description"]
    assert_valid(_write(tmp_path, document))


def test_the_fastapi_example_sends_and_receives_its_topic(tmp_path: Path) -> None:
    result = _cli(tmp_path, "examples.fastapi_app.app")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert set(document["operations"]) == {"receive-notes.created", "send-notes.created"}
    payload = document["components"]["messages"]["notes.created"]["payload"]
    assert payload["$ref"] == SCHEMAS + "NoteCreated"
    assert_valid(_write(tmp_path, document))
