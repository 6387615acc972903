"""The composition root (outbox/runtime/, decision 20): one settings object in, running parts out.

That only the root imports both a daemon and an adapter (indirect imports counted) is an
import-linter contract ([tool.importlinter] in pyproject.toml; tests/unit/test_import_contracts.py
shows it breaks). Here what import-linter cannot see: importing outbox or a daemon loads no
driver at run time (outbox.broker reaches psycopg, in functions); the daemons' configs hold
tuning only, and a config or a daemon built the old way says where its settings went; `outbox
run` takes every flag of the three daemons (bar the short list it renames); the flags reach the
root through one function.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from outbox.cli import build_parser
from outbox.cli.command import RUN_RENAMED, main
from outbox.cli.reference import walk
from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError
from outbox.runtime import (
    App,
    ConsumerConfig,
    Databases,
    HandlerConfig,
    OutboxRuntime,
    ProducerConfig,
    Settings,
    TransportSettings,
)
from outbox.runtime.app import Supervised
from outbox.transports import settings_of

ROOT = Path(__file__).resolve().parents[2]

#: The adapters: the transports' and the stores' packages, and their drivers.
ADAPTERS = ("outbox.postgres", "outbox.kafka", "outbox.pglog")
DRIVERS = ("psycopg", "confluent_kafka", "sqlalchemy")


@pytest.mark.parametrize(
    "module",
    [
        "outbox",
        "outbox.daemons.producer",
        "outbox.daemons.consumer",
        "outbox.daemons.handler",
        "outbox.observability.runtime",
    ],
)
def test_importing_a_daemon_loads_no_driver_and_no_adapter(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {DRIVERS!r} "
        f"or m.startswith({ADAPTERS!r}))\n"
        "print(loaded)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert found.stdout.strip() == "[]", f"{module} loads {found.stdout.strip()}"


def test_nothing_is_registered_at_import() -> None:
    import outbox.ports

    assert not hasattr(outbox.ports, "use_relay_stores")
    assert not hasattr(outbox.ports, "default_inbox_writers")


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: ProducerConfig(database_url="postgresql://h/d"), "database_url"),
        (lambda: ProducerConfig("postgresql://h/d"), "database_url"),
        (
            lambda: ProducerConfig(kafka_bootstrap="k:9092", kafka_config={}),
            "kafka_bootstrap, kafka_config",
        ),
        (lambda: ConsumerConfig(topics=["t"], group="g"), "topics, group"),
        (lambda: HandlerConfig("postgresql://h/d", concurrency=2), "database_url"),
        (lambda: HandlerConfig(schema="s", observability=None), "schema, observability"),
    ],
)
def test_a_config_built_the_old_way_says_where_its_settings_went(build: object, names: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        build()  # type: ignore[operator]
    said = str(refused.value)
    assert f"give {names} to the composition root" in said
    assert "outbox.runtime.App(Settings(...))" in said and "\n" not in said


def test_a_daemon_built_without_its_stores_says_how_to_build_it() -> None:
    from outbox.daemons.handler import HandlerRunner
    from outbox.daemons.producer import Producer
    from outbox.memory import InMemoryTransport

    with pytest.raises(ConfigurationError, match=r"Producer needs stores= and database=.*App"):
        Producer(ProducerConfig(), InMemoryTransport().publisher)
    from outbox import Handlers

    with pytest.raises(ConfigurationError, match=r"HandlerRunner needs stores= and database="):
        HandlerRunner(HandlerConfig(), Handlers())


def _flags(command: str) -> set[str]:
    parsers = {c.path: c.parser for c in walk(build_parser())}
    return {
        option
        for action in parsers[(command,)]._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help",)
    }


def test_run_takes_every_flag_of_the_three_daemons_or_says_which_it_renames() -> None:
    daemons = _flags("producer") | _flags("consumer") | _flags("handler")
    run = _flags("run")
    assert daemons - (run - set(RUN_RENAMED)) == set(RUN_RENAMED), (
        "give `outbox run` these flags, or say in RUN_RENAMED why it cannot take them: "
        f"{sorted(daemons - run)}"
    )
    assert {"--database-turns", "--idle-disconnect", "--databases-file"} <= run
    assert {"--route-header", "--quarantine-database"} <= run


def test_a_renamed_flag_given_to_run_is_one_line_naming_the_new_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "m:h", "--batch-size", "5"])
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--batch-size is not a flag of `outbox run`" in line
    assert "--producer-batch-size, --consumer-batch-size and --handler-batch-size" in line


def test_the_flags_reach_the_root_as_one_settings_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outbox.cli import arguments

    monkeypatch.setenv("OUTBOX_KAFKA_CONFIG_SASL_USERNAME", "from-env")
    monkeypatch.setenv("OUTBOX_GROUP", "billing")
    tenants = tmp_path / "tenants.txt"
    tenants.write_text("initech=postgresql://h/initech\n")
    args = build_parser().parse_args(
        [
            "run",
            "svc:h",
            "--database-url",
            "acme=postgresql://h/acme",
            "--database-url",
            "globex/billing=postgresql://h/globex",
            "--databases-file",
            str(tenants),
            "--database-turns",
            "3",
            "--idle-disconnect",
            "0",
            "--route-header",
            "x-tenant",
            "--quarantine-database",
            "globex",
            "--kafka-bootstrap",
            "k:9092",
            "--kafka-config",
            "linger.ms=7",
            "--start",
            "latest",
            "--producer-batch-size",
            "10",
            "--consumer-batch-size",
            "20",
            "--handler-batch-size",
            "30",
            "--concurrency",
            "5",
            "--health-port",
            "8081",
        ]
    )
    settings = arguments.settings_of(args)
    databases = settings.databases
    assert [(d.name, d.schema) for d in databases.fixed] == [
        ("acme", "outbox"),
        ("globex", "billing"),
    ]
    assert [d.name for d in databases.listed()] == ["acme", "globex", "initech"]
    assert (databases.file, databases.turns, databases.idle_disconnect) == (str(tenants), 3, 0)
    assert (databases.route_header, databases.quarantine) == ("x-tenant", "globex")
    assert databases.several and databases.routed
    transport = settings.transport
    assert (transport.name, transport.options.bootstrap, transport.start) == (
        "kafka",
        "k:9092",
        "latest",
    )
    assert transport.options.config == {"linger.ms": "7", "sasl.username": "from-env"}
    assert settings.group == "billing"
    assert (settings.producer.batch_size, settings.consumer.batch_size) == (10, 20)
    assert (settings.handler.batch_size, settings.handler.concurrency) == (30, 5)
    assert settings.observability.health_port == 8081


def test_several_databases_make_a_relay_per_database_and_a_routing_consumer() -> None:
    settings = Settings(
        databases=replace(
            Databases.of("acme=postgresql://h/acme", "globex=postgresql://h/globex"),
            quarantine="globex",
        ),
        transport=settings_of("kafka", kafka_bootstrap="k:9092"),
        group="g",
    )
    from outbox import Handlers

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    app = App(settings, handlers)
    assert isinstance(app.part("producer"), Supervised)
    assert isinstance(app.part("handler"), Supervised)
    consumer = app.consumer()  # builds; connects to nothing
    assert consumer.routing is not None
    assert [d.name for d in consumer.routing.databases] == ["acme", "globex"]
    assert consumer.database.name == "globex"  # the quarantine database, as named
    with pytest.raises(ConfigurationError, match="several databases"):
        app.producer()
    one = App(Settings(databases=Databases.of("postgresql://h/app")), handlers)
    assert one.part("handler").__class__.__name__ == "HandlerRunner"


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (Settings(databases=Databases.of("postgresql://h/d")), "--group is required"),
        (Settings(group="g"), "--database-url is required"),
        (
            Settings(databases=Databases.of("postgresql://h/d"), group="g"),
            "--kafka-bootstrap is required (or set OUTBOX_KAFKA_BOOTSTRAP)",
        ),
        (
            Settings(
                databases=Databases.of("postgresql://h/d"),
                group="g",
                transport=TransportSettings(name="postgres"),
            ),
            "--log-url is required (or set OUTBOX_LOG_URL)",
        ),
        (
            Settings(
                databases=Databases.of("postgresql://h/d"),
                group="g",
                transport=TransportSettings(name="nats"),
            ),
            "--transport must be one of kafka, postgres, memory, got 'nats'",
        ),
    ],
)
def test_what_is_missing_is_one_line_naming_its_flag(settings: Settings, said: str) -> None:
    from outbox import Handlers

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    with pytest.raises(ConfigurationError) as refused:
        App(settings, handlers).part("consumer")
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_the_runtime_takes_settings_or_the_keywords_of_one_database_not_both() -> None:
    from outbox import Handlers

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    settings = Settings(
        databases=Databases.of("postgresql://h/d"),
        transport=settings_of("kafka", kafka_bootstrap="k:9092"),
        group="g",
    )
    with pytest.raises(ConfigurationError, match="not both"):
        OutboxRuntime(handlers, settings=settings, database_url="postgresql://h/d")
    with pytest.raises(ConfigurationError, match="needs database_url="):
        OutboxRuntime(handlers, group="g", kafka_bootstrap="k:9092")
    runtime = OutboxRuntime(handlers, settings=settings)  # builds; starts nothing
    assert runtime.settings is settings


def test_one_outbox_run_asks_the_registry_for_its_transport_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from outbox import Handlers, transports

    asked: list[str] = []
    registered = transports.get

    def counted(name: str, **kwargs: object) -> transports.Transport[object]:
        asked.append(name)
        return registered(name, **kwargs)  # type: ignore[arg-type]

    where = settings_of("kafka", kafka_bootstrap="k:9092")  # the flags', parsed before
    monkeypatch.setattr(transports, "get", counted)
    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    OutboxRuntime(
        handlers,
        settings=Settings(
            databases=replace(
                Databases.of("a=postgresql://h/a", "b=postgresql://h/b"), quarantine="a"
            ),
            transport=where,
            group="g",
        ),
    )
    assert asked == ["kafka"]


def test_a_quarantine_database_of_its_own_is_given_as_an_entry() -> None:
    from outbox import Handlers
    from outbox.cli.arguments import settings_of

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    flags = ["consumer", "--topic", "t", "--group", "g", "--kafka-bootstrap", "k:9092"]
    flags += ["--database-url", "acme=postgresql://h/acme", "--database-url", "b=postgresql://h/b"]
    args = build_parser().parse_args([*flags, "--quarantine-database", "q/dead=postgresql://h/q"])
    settings = settings_of(args)
    assert settings.databases.quarantine_database() == Database("q", "postgresql://h/q", "dead")
    consumer = App(settings, handlers).consumer()
    assert consumer.routing is not None and consumer.routing.dedicated is not None
    assert consumer.database.name == "q"  # where the unroutable go, and /readyz looks
    assert [d.name for d in consumer.routing.databases] == ["acme", "b"]  # q is no tenant
    named = settings_of(build_parser().parse_args([*flags, "--quarantine-database", "b"]))
    assert named.databases.quarantine_database() is None
    with pytest.raises(ConfigurationError, match=r"database name '' is not valid.*quarantine"):
        Databases(quarantine="=postgresql://h/q")


@pytest.mark.parametrize(
    "databases",
    [
        Databases.of("acme=postgresql://h/acme", "globex=postgresql://h/globex"),
        replace(Databases.of("acme=postgresql://h/acme"), route_header="x-tenant"),
    ],
    ids=["several databases", "a route header"],
)
def test_routing_without_a_quarantine_database_is_refused_at_start_up_naming_the_flag(
    databases: Databases,
) -> None:
    """No silent default: the records of no tenant went to the first tenant's database."""
    from outbox import Handlers

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    settings = Settings(
        databases=databases, transport=settings_of("kafka", kafka_bootstrap="k:9092"), group="g"
    )
    with pytest.raises(ConfigurationError) as refused:
        OutboxRuntime(handlers, settings=settings)
    said = str(refused.value)
    assert said.startswith("routing records by tenant needs --quarantine-database NAME")
    assert "(one of acme" in said and "\n" not in said
    # The producer and the handler route nothing: several databases need no quarantine there.
    assert App(settings, handlers).part("handler") is not None


def test_run_and_consumer_without_a_quarantine_database_say_so_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Refused before any connection (nothing answers at these addresses), as the other
    # settings of a routing consumer are: `outbox: error: ...`, exit 1.
    monkeypatch.delenv("OUTBOX_QUARANTINE_DATABASE", raising=False)
    (tmp_path / "svc_handlers.py").write_text(
        "from outbox import Handlers\nh = Handlers()\nh.handler('t')(lambda m, c: None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    two = ["--database-url", "acme=postgresql://nowhere/a", "--database-url", "b=postgresql://x/b"]
    common = ["--group", "g", "--kafka-bootstrap", "nowhere:1", *two]
    for argv in (["run", "svc_handlers:h", *common], ["consumer", "--topic", "t", *common]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("outbox: error: routing records by tenant")
        assert "needs --quarantine-database NAME" in err
        assert "(one of acme, b, or one of its own, NAME=URL)" in err


def test_the_parts_of_one_process_share_one_connection_budget() -> None:
    """`outbox run`: the producer's, the handler's and the consumer's connections come from
    one budget of `max_connections`; a handler runs at most max_connections - 1 workers; 1 is
    refused, 0 (the default) is none."""
    from outbox import Handlers

    handlers = Handlers()
    handlers.handler("t")(lambda message, conn: None)
    databases = replace(
        Databases.of("acme=postgresql://h/acme", "globex=postgresql://h/globex"),
        quarantine="globex",
        max_connections=3,
    )
    settings = Settings(
        databases=databases, transport=settings_of("kafka", kafka_bootstrap="k:9092"), group="g"
    )
    app = App(settings, handlers)
    producers, handling = app.part("producer"), app.part("handler")
    consumer = app.consumer()
    assert isinstance(producers, Supervised) and isinstance(handling, Supervised)
    budget = app.budget()
    assert budget is not None and budget.size == 3
    assert producers.supervisor.budget is budget and handling.supervisor.budget is budget
    assert consumer.routing is not None and consumer.routing.budget is budget
    report = consumer.observability.health.report
    # /readyz's tail: the handler's workers, shared by the databases, have half of it.
    assert report is not None and report() == "connections: 0 of 3, 1 reserved for handler workers"
    relay = handling.supervisor._make(databases.fixed[0])
    assert relay.slots is not None and relay.slots.size == 1
    assert relay.footprint() == 1 and relay.concurrency() == 1  # of --concurrency 4
    alone = app._of_many().handler(databases.fixed[0])  # a relay without shared workers
    alone.budget = budget
    assert alone.footprint() == 3 and alone.concurrency() == 2
    with pytest.raises(ConfigurationError, match="at least 2"):
        replace(databases, max_connections=1)
    assert App(replace(settings, databases=replace(databases, max_connections=0))).budget() is None
