"""The transport registry (outbox/transports.py): `--transport NAME` is one entry, or one error
naming the registered ones; and the classifications the Consumer stores through
(outbox/core/retriable.py), which know no driver."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from outbox import transports
from outbox.core.errors import ConfigurationError
from outbox.core.retriable import database_error, refused_for_data

ROOT = Path(__file__).resolve().parents[2]


def test_each_registered_transport_is_found_by_its_name() -> None:
    assert transports.names() == ("kafka", "postgres", "memory")
    assert [transports.get(name).name for name in transports.names()] == list(transports.names())
    assert transports.get("kafka") is transports.KAFKA
    assert transports.get("postgres") is transports.LOG
    # The CLI's daemons are offered those whose records other processes see.
    assert transports.names("processes") == ("kafka", "postgres")
    assert transports.names("start") == ("kafka",)


def test_each_built_in_transport_is_one_line_naming_its_adapters_entry() -> None:
    assert transports.BUILT_IN == {
        "kafka": "outbox.kafka.transport:KAFKA",
        "postgres": "outbox.pglog.transport:LOG",
        "memory": "outbox.testing.memory:MEMORY",
    }


def test_an_unknown_transport_is_one_error_listing_the_registered_ones() -> None:
    with pytest.raises(ConfigurationError) as raised:
        transports.get("rabbitmq", what="--transport", hint=" (from OUTBOX_TRANSPORT?)")
    assert str(raised.value) == (
        "--transport must be one of kafka, postgres, memory, got 'rabbitmq' "
        "(from OUTBOX_TRANSPORT?)"
    )


def test_a_transport_reads_its_own_endpoint_from_its_own_options() -> None:
    kafka = transports.settings_of(
        "kafka", kafka_bootstrap="k:9092", log_url="postgresql://u:secret@h/log"
    )
    log = transports.settings_of(
        "postgres", kafka_bootstrap="k:9092", log_url="postgresql://u:secret@h/log"
    )
    assert transports.KAFKA.endpoint(kafka.options) == "k:9092"
    assert transports.LOG.endpoint(log.options) == "postgresql://u:secret@h/log"
    assert "secret" not in transports.LOG.shown(transports.LOG.endpoint(log.options))
    # The other transport's endpoint, given, is remembered to be warned about.
    assert kafka.unused == ("--log-url (or OUTBOX_LOG_URL)",)
    assert log.unused == ("--kafka-bootstrap (or OUTBOX_KAFKA_BOOTSTRAP)",)


def test_a_transport_declares_which_of_its_settings_are_secret() -> None:
    kafka = transports.settings_of(
        "kafka", kafka_config={"sasl.password": "kpw", "linger.ms": "5"}
    ).options
    log = transports.settings_of("postgres", log_url="postgresql://u:lpw@h/log").options
    assert "kpw" in set(transports.KAFKA.secrets(kafka))
    assert "5" not in set(transports.KAFKA.secrets(kafka))
    assert "lpw" in set(transports.LOG.secrets(log))


def test_a_transport_says_what_a_daemons_start_up_line_shows() -> None:
    kafka_options = transports.settings_of(
        "kafka", kafka_bootstrap="k:9092", kafka_config={"linger.ms": "7"}
    ).options
    log_options = transports.settings_of("postgres", log_url="postgresql://u:secret@h/log").options
    kafka = transports.KAFKA.in_force(kafka_options, "consumer", "billing")
    assert kafka["kafka_bootstrap"] == "k:9092"
    assert kafka["kafka_config"]["group.id"] == "billing"  # the client's settings in force
    assert kafka["kafka_config"]["enable.auto.commit"] == "false"  # outbox's forced one
    producer = transports.KAFKA.in_force(kafka_options, "producer", "")
    assert producer["kafka_config"]["linger.ms"] == "7"
    assert set(transports.LOG.in_force(log_options, "producer", "")) == {
        "log_url",
        "log_schema",
        "log_partitions",
        "log_retention",
    }
    assert set(transports.LOG.in_force(log_options, "consumer", "g")) == {
        "log_url",
        "log_schema",
        "log_session_timeout",
    }


def test_the_log_refuses_a_start_position_for_its_consumers() -> None:
    from outbox import Handlers
    from outbox.runtime import App, Databases, Settings

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)

    def consumer(name: str, **values: str) -> None:
        App(
            Settings(
                databases=Databases.of("postgresql://h/d"),
                group="g",
                transport=transports.settings_of(name, start="latest", **values),
            ),
            handlers,
        ).consumer()

    with pytest.raises(ConfigurationError, match="not to --transport postgres"):
        consumer("postgres", log_url="postgresql://h/log")
    consumer("kafka", kafka_bootstrap="k:9092")  # builds; connects to nothing


def test_a_transport_of_another_module_registers_itself_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "third_transport.py").write_text(
        "import dataclasses\n"
        "from outbox import transports\n"
        "from outbox.testing.memory import MEMORY\n"
        "THIRD = transports.register(dataclasses.replace(MEMORY, name='third'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OUTBOX_TRANSPORT_MODULES", "third_transport")
    monkeypatch.setattr(transports, "_REGISTERED", {})
    monkeypatch.setattr(transports, "_LOADED_MODULES", set())
    assert transports.names() == ("kafka", "postgres", "memory", "third")
    assert transports.get("third").name == "third"
    with pytest.raises(ConfigurationError, match="'third' is registered already"):
        transports.register(dataclasses.replace(transports.get("memory"), name="third"))
    with pytest.raises(ConfigurationError, match="'kafka' is registered already"):
        transports.register(dataclasses.replace(transports.get("memory"), name="kafka"))


def test_a_module_that_cannot_be_imported_is_one_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_TRANSPORT_MODULES", "no_such_transport_module")
    monkeypatch.setattr(transports, "_LOADED_MODULES", set())
    with pytest.raises(ConfigurationError, match="OUTBOX_TRANSPORT_MODULES names "):
        transports.names()


@pytest.mark.parametrize(
    ("steps", "drivers"),
    [
        (
            "transports.settings_of('postgres', log_url='postgresql://h/log')\n"
            "transports.settings_of('kafka', kafka_bootstrap='k:9092')\n"
            "transports.entries()\n",
            ("psycopg", "confluent_kafka"),
        ),
        # The CLI's parser adds every transport's flags (its operator commands load psycopg).
        (
            "from outbox.cli import build_parser\n"
            "build_parser().parse_args(['status', '--transport', 'postgres'])\n",
            ("confluent_kafka",),
        ),
    ],
    ids=["registry", "parser"],
)
def test_choosing_a_transport_by_its_name_loads_no_driver(
    steps: str, drivers: tuple[str, ...]
) -> None:
    code = (
        "import sys\n"
        "from outbox import transports\n"
        f"{steps}"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {drivers!r}))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert found.stdout.strip() == "[]", found.stderr


class _Driver(Exception):
    """A PEP 249 driver's error with a SQLSTATE."""

    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


class Error(Exception):
    """A PEP 249 driver's base class."""


class DataError(Error):
    """A driver refusing a value it cannot send (no SQLSTATE)."""


@pytest.mark.parametrize(
    ("error", "refused", "of_the_database"),
    [
        (_Driver("22021"), True, True),  # invalid byte sequence
        (_Driver("23505"), True, True),  # unique violation
        (_Driver("54000"), True, True),  # program limit (an index row too large)
        (_Driver("42501"), False, True),  # a missing privilege: not the data's
        (_Driver("08006"), False, True),  # a lost connection
        (DataError("NUL byte"), True, True),
        (Error("server closed the connection"), False, True),
        (UnicodeEncodeError("utf-8", "x", 0, 1, "surrogate"), True, False),
        (ValueError("a bug"), False, False),
    ],
)
def test_refused_for_data_and_database_error_know_no_driver(
    error: Exception, refused: bool, of_the_database: bool
) -> None:
    assert refused_for_data(error) is refused
    assert database_error(error) is of_the_database
