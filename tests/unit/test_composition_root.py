"""The composition root (outbox/runtime/, decision 20): one settings object in, running parts out.

Only the root imports both a daemon and an adapter, also indirectly (every import counted, in a
function or under TYPE_CHECKING too); importing a daemon loads no driver; the daemons' configs
hold tuning only, and a config or a daemon built the old way says where its settings went;
`outbox run` takes every flag of the three daemons (bar the short list it renames); the flags
reach the root through one function.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from outbox.cli import build_parser
from outbox.cli.command import RUN_RENAMED, main
from outbox.cli.reference import walk
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
from tests.unit.test_layers import _graph

ROOT = Path(__file__).resolve().parents[2]

#: The adapters: the transports' and the stores' packages, and their drivers.
ADAPTERS = ("outbox.postgres", "outbox.kafka", "outbox.pglog")
DRIVERS = ("psycopg", "confluent_kafka", "sqlalchemy")
COMPOSITION_ROOT = "outbox.runtime"


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _reach(graph: dict[str, set[str]], start: str, avoid: str = COMPOSITION_ROOT) -> set[str]:
    """The modules `start` imports, directly or through others, not through `avoid`."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen and not _within(target, (avoid,)):
                seen.add(target)
                todo.append(target)
    return seen


def test_only_the_composition_root_imports_both_a_daemon_and_an_adapter() -> None:
    graph = _graph()
    both = []
    for module in sorted(graph):
        if _within(module, (COMPOSITION_ROOT, "outbox.daemons")):
            continue
        reached = _reach(graph, module)
        daemons = sorted(m for m in reached if _within(m, ("outbox.daemons",)))
        adapters = sorted(m for m in reached if _within(m, ADAPTERS))
        if daemons and adapters:
            both.append(f"{module} reaches {daemons[0]} and {adapters[0]}")
    assert both == []
    # The root does, which is the point: it is the one place that wires them.
    root = _reach(graph, "outbox.runtime.app", avoid="outbox.nothing")
    assert any(_within(m, ("outbox.daemons",)) for m in root)
    assert any(_within(m, ADAPTERS) for m in root)


@pytest.mark.parametrize(
    ("sources", "targets", "why"),
    [
        (("outbox.cli", "outbox.broker"), ("outbox.daemons",), "the CLI asks the App"),
        (("outbox.testing",), ("outbox.daemons",), "drain() and fixtures ask the App"),
        (("outbox.transports",), ("outbox.daemons",), "only the App builds daemons"),
        (("outbox.observability",), ADAPTERS, "probes come in through a port"),
        (("outbox.daemons",), ADAPTERS, "daemons see ports"),
    ],
)
def test_the_whiteboards_nevers_hold_through_indirect_imports(
    sources: tuple[str, ...], targets: tuple[str, ...], why: str
) -> None:
    graph = _graph()
    bad = [
        f"{module} reaches {target} ({why})"
        for module in sorted(graph)
        if _within(module, sources)
        for target in sorted(_reach(graph, module))
        if _within(target, targets)
    ]
    assert bad == []


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
        databases=Databases.of("acme=postgresql://h/acme", "globex=postgresql://h/globex"),
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
    assert consumer.database.name == "acme"  # the quarantine database by default
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
            databases=Databases.of("a=postgresql://h/a", "b=postgresql://h/b"),
            transport=where,
            group="g",
        ),
    )
    assert asked == ["kafka"]
