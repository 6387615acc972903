"""The layering of the package (DESIGN.md, "the ports are the path"), checked on the source.

import-linter-style contracts, read from each module's imports (module level and inside
functions alike): core imports nothing of outbox outside core; ports only core; the transport
adapters (kafka, pglog, the in-memory one) none of the daemons, the Postgres stores or the CLI;
the daemons none of the adapters; outbox/postgres/ none of the daemons, transports or CLI; no
module outside outbox/cli/ (the top layer) imports the CLI; and no module imports itself
through others (no cycles). The daemons and their probes (outbox/observability/) hold no SQL:
no string that is a statement, no `sql[...]` lookup; their statements run in outbox/postgres/.
No module outside outbox/postgres/ and outbox/pglog/ holds a statement string: every statement
is a named one of their sql/ folders, by one loader. One module is called `operations`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "outbox"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, of outbox or not (`psycopg`, `psycopg.rows`), wherever the
    import is: module level, in a function, under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _files(*packages: str) -> list[Path]:
    files: list[Path] = []
    for package in packages:
        target = PACKAGE.joinpath(*package.split(".")[1:])
        files.extend(
            sorted(target.rglob("*.py")) if target.is_dir() else [target.with_suffix(".py")]
        )
    return files


def _violations(
    sources: list[Path],
    forbidden: tuple[str, ...],
    allowed: tuple[str, ...] = (),
) -> list[str]:
    bad = []
    for path in sources:
        for name in sorted(_imports(path)):
            if name.startswith(allowed):
                continue
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{_module(path)} imports {name}")
    return bad


def test_core_imports_nothing_of_outbox_outside_core() -> None:
    sources = _files("outbox.core")
    bad = [v for v in _violations(sources, ("outbox",)) if "imports outbox.core" not in v]
    assert bad == []


def test_ports_import_only_core() -> None:
    bad = [
        v
        for v in _violations(_files("outbox.ports"), ("outbox",))
        if "imports outbox.core" not in v
    ]
    assert bad == []


@pytest.mark.parametrize("adapter", ["outbox.kafka", "outbox.pglog", "outbox.testing.memory"])
def test_transport_adapters_know_no_daemon_store_or_cli(adapter: str) -> None:
    forbidden = (
        "outbox.daemons",
        "outbox.cli",
        "outbox.cli_arguments",
        "outbox.cli_operations",
        "outbox.postgres.outbox_store",
        "outbox.postgres.inbox_store",
        "outbox.postgres.lanes",
        "outbox.transports",
    )
    assert _violations(_files(adapter), forbidden) == []


def test_daemons_import_no_transport_adapter() -> None:
    forbidden = (
        "outbox.kafka",
        "outbox.pglog",
        "outbox.memory",
        "outbox.testing",
        "outbox.transports",
    )
    assert _violations(_files("outbox.daemons"), forbidden) == []


#: What the daemons never import: they speak to the ports (outbox/ports.py) only, so a daemon
#: loop runs over an in-memory store (tests/unit/test_relay_over_memory.py).
ADAPTERS = ("outbox.postgres", "outbox.kafka", "outbox.pglog", "psycopg", "confluent_kafka")

#: Daemon modules that still import an adapter. Each is expected to fail the check below
#: (strictly: a module freed must leave this list). Empty it, don't grow it.
KNOWN_ADAPTER_IMPORTS: set[str] = set()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            path,
            id=_module(path),
            marks=[pytest.mark.xfail(strict=True, reason="still imports an adapter")]
            if _module(path) in KNOWN_ADAPTER_IMPORTS
            else [],
        )
        for path in _files("outbox.daemons")
    ],
)
def test_the_daemons_speak_to_ports_only(path: Path) -> None:
    assert _violations([path], ADAPTERS) == []


def test_the_import_check_sees_third_party_modules(tmp_path: Path) -> None:
    source = tmp_path / "daemon.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from psycopg import Cursor\n"
        "def f():\n"
        "    import psycopg.rows\n"
        "    from outbox.postgres.lanes import Lanes\n"
    )
    found = _imports(source)
    assert {"psycopg", "psycopg.Cursor", "psycopg.rows", "outbox.postgres.lanes"} <= found
    assert [f for f in ADAPTERS if any(n == f or n.startswith(f + ".") for n in found)] == [
        "outbox.postgres",
        "psycopg",
    ]


#: The wiring that picks a transport by its name: only through outbox/transports.py.
_CHOOSERS = ("outbox.cli", "outbox.console", "outbox.runtime", "outbox.testing.draining")
#: What makes a transport's publishers, subscribers and lag readers (outbox/transports.py does).
_TRANSPORT_FACTORIES = (
    "outbox.kafka.publisher.KafkaPublisher",
    "outbox.kafka.subscriber.KafkaSubscriber",
    "outbox.kafka.lag",
    "outbox.pglog.PgLogPublisher",
    "outbox.pglog.PgLogSubscriber",
    "outbox.pglog.publisher",
    "outbox.pglog.subscriber",
)


def test_the_wiring_makes_transports_through_the_registry() -> None:
    """The CLI, the console, `outbox run` and the drain make no transport themselves: they ask
    outbox/transports.py's registry for the one named (issue 25)."""
    assert _violations(_files(*_CHOOSERS), _TRANSPORT_FACTORIES) == []


def _transport_switches(path: Path, names: frozenset[str]) -> list[str]:
    """Comparisons of something called `transport` with a transport's name (`transport ==
    "postgres"`, `transport in ("kafka", "postgres")`), and tuples of the names."""

    def named(node: ast.expr) -> bool:
        if isinstance(node, ast.Call):  # mapping.get("transport"), getattr(args, "transport")
            return any(isinstance(a, ast.Constant) and a.value == "transport" for a in node.args)
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        return "transport" in name.lower()

    def constants(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(constants(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) and any(constants(s) for s in sides):
                found.append(f"{path.name}:{node.lineno}: compares a transport with its name")
        elif (
            isinstance(node, ast.Tuple)
            and len(node.elts) > 1
            and all(isinstance(e, ast.Constant) and e.value in names for e in node.elts)
        ):
            found.append(f"{path.name}:{node.lineno}: lists the transports' names")
    return found


def test_no_module_outside_the_registry_switches_on_transport_names() -> None:
    from outbox import transports

    names = frozenset(transports.names())
    bad = [
        switch
        for path in _files(*_CHOOSERS, "outbox.daemons", "outbox.observability")
        for switch in _transport_switches(path, names)
    ]
    assert bad == []


def test_spark_reuses_stores_not_daemon_loops() -> None:
    """The whiteboard's "never Spark -> Daemons": the Spark jobs connect and check the schema
    through postgres/, as the daemons do, instead of importing the relay loop's module."""
    assert _violations(_files("outbox.spark"), ("outbox.daemons",)) == []


_STATEMENT = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LISTEN|NOTIFY|SET|CREATE|DROP|ALTER|LOCK)\b", re.I
)


def _sql_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _STATEMENT.match(node.value) and not node.value.strip().endswith((".", ":")):
                found.append(f"{path.name}:{node.lineno}: {node.value.strip()[:40]!r}")
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            if _STATEMENT.match(text):
                found.append(f"{path.name}:{node.lineno}: f{text.strip()[:40]!r}")
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in ("sql", "_sql")
        ):
            found.append(f"{path.name}:{node.lineno}: a statement looked up by name")
    return found


@pytest.mark.parametrize("package", ["outbox.daemons", "outbox.observability"])
def test_the_daemons_and_their_probes_hold_no_sql(package: str) -> None:
    assert [hit for path in _files(package) for hit in _sql_in(path)] == []


def test_the_sql_guard_sees_statements(tmp_path: Path) -> None:
    # The guard works: a statement as a string, an f-string or a lookup by name is seen.
    source = tmp_path / "daemon.py"
    source.write_text(
        "def f(conn, store, table):\n"
        "    conn.execute('SELECT pg_terminate_backend(%s)', (1,))\n"
        "    conn.execute(f'DELETE FROM {table} WHERE id = 1')\n"
        "    conn.execute(store.sql['handler_fail'])\n"
    )
    hits = _sql_in(source)
    assert {hit.split(":")[1] for hit in hits} == {"2", "3", "4"}, hits


#: A statement as the .sql files write them: an upper-case keyword and more (prose that starts
#: with "Set" or "create" is not one; a lower-case statement would slip through, which is why the
#: daemons keep the stricter `_sql_in` above).
_STATEMENT_TEXT = re.compile(
    r"^\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH|LISTEN|NOTIFY|SET|CREATE|DROP|ALTER"
    r"|LOCK|TRUNCATE|COPY)\s+\S"
)
#: Where statements live: outbox/postgres/ (outbox/postgres/sql/*.sql) and the log's package
#: (outbox/pglog/sql/*.sql, and its migrations' DDL).
_SQL_HOMES = ("postgres", "pglog")


def _statements_in(path: Path) -> list[str]:
    """The string constants (f-strings' literal parts too) of `path` that are SQL statements;
    a docstring (a string standing alone) may name one."""
    tree = ast.parse(path.read_text(), str(path))
    alone = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if id(node) in alone:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
        else:
            continue
        if _STATEMENT_TEXT.match(text):
            found.append(f"{path.name}:{node.lineno}: {text.strip()[:40]!r}")
    return found


def test_every_sql_statement_lives_in_postgres_or_pglog() -> None:
    # DESIGN.md: every statement in .sql files with names, loaded by outbox/postgres/queries.py;
    # the rest of the package runs them by name (`queries(schema)[...]`, `compose(...)`).
    sources = [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in _SQL_HOMES
    ]
    assert [hit for path in sources for hit in _statements_in(path)] == []


def test_the_statement_guard_sees_statements_and_not_prose(tmp_path: Path) -> None:
    source = tmp_path / "tool.py"
    source.write_text(
        "HELP = 'create a topic with a number of partitions'\n"
        "def g():\n"
        "    'SELECT: a docstring may name a statement'\n"
        "COOKIE = 'Set-Cookie'\n"
        "def f(conn, name):\n"
        "    conn.execute(f\"SET lock_timeout = '{name}s'\")\n"
        "    conn.execute('SELECT count(*) FROM t')\n"
        "    conn.execute(sql.SQL('CREATE DATABASE {}').format(name))\n"
    )
    hits = _statements_in(source)
    assert {int(hit.split(":")[1]) for hit in hits} == {6, 7, 8}, hits


def test_one_module_is_called_operations() -> None:
    # outbox/postgres/operations.py (the operator operations over SQL); the CLI's commands are
    # outbox/cli/operator.py and its command groups (status.py, dead_letters.py, log_admin.py).
    found = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("operations.py"))
    assert found == ["outbox/postgres/operations.py"]


def test_postgres_knows_no_daemon_transport_or_cli() -> None:
    forbidden = ("outbox.daemons", "outbox.kafka", "outbox.pglog", "outbox.cli", "outbox.testing")
    assert _violations(_files("outbox.postgres"), forbidden) == []


def test_the_console_imports_nothing_of_the_cli() -> None:
    # `outbox console` (in outbox/cli/) runs the console; the console's pages and server share
    # the status and dead-letter formatting with the CLI through outbox/formatting.py.
    assert _violations(_files("outbox.console"), ("outbox.cli",)) == []


def test_only_the_cli_imports_the_cli() -> None:
    # The CLI is the top layer: it imports the library, never the other way round.
    # outbox/__main__.py (`python -m outbox`) is the command's second entry point, as
    # outbox/cli/__main__.py is: it belongs to the top layer.
    cli, entry = PACKAGE / "cli", PACKAGE / "__main__.py"
    sources = [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.is_relative_to(cli) and path != entry
    ]
    assert _violations(sources, ("outbox.cli",)) == []
    assert entry.read_text().count("import") == 2, "the entry point only runs the command"


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of outbox it imports. `from package import module` imports that
    module (not the package's __init__, already loaded); a name imported from a module
    counts as that module."""
    modules = {_module(path): path for path in sorted(PACKAGE.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    imported.add(submodule if submodule in modules else resolve(node.module))
        graph[name] = {
            target
            for target in imported
            if target is not None and target != name and target.startswith("outbox")
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


#: Import cycles that are known and not broken yet. Empty it, don't grow it.
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_cycles() -> None:
    # Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import
    # hides a cycle from Python, not from a reader.
    assert _cycles(_graph()) == KNOWN_CYCLES


def test_the_cycle_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
