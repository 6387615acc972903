"""The rules about the source that are not imports (the imports' rules are import-linter
contracts: [tool.importlinter] in pyproject.toml, run by `./run test`).

No module that wires transports compares a transport with its name: it asks the registry. The
daemons and their probes (outbox/observability/) hold no SQL: no string that is a statement, no
`sql[...]` lookup; their statements run in outbox/postgres/. No module outside outbox/postgres/
and outbox/pglog/ holds a statement string: every statement is a named one of their sql/
folders, by one loader. One module is called `operations`. The entry point only runs the command.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "outbox"


def _files(*packages: str) -> list[Path]:
    files: list[Path] = []
    for package in packages:
        target = PACKAGE.joinpath(*package.split(".")[1:])
        files.extend(
            sorted(target.rglob("*.py")) if target.is_dir() else [target.with_suffix(".py")]
        )
    return files


#: The wiring that picks a transport by its name: only through outbox/transports.py.
_CHOOSERS = ("outbox.cli", "outbox.console", "outbox.runtime", "outbox.testing.draining")


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
    # outbox/cli/operator.py.
    found = sorted(str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("operations.py"))
    assert found == ["outbox/postgres/operations.py"]


def test_the_entry_point_only_runs_the_command() -> None:
    # outbox/__main__.py (`python -m outbox`) is the command's second entry point, as
    # outbox/cli/__main__.py is.
    assert (PACKAGE / "__main__.py").read_text().count("import") == 2
