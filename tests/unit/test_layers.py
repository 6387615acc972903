"""The layering of the package (DESIGN.md, "the ports are the path"), checked on the source.

import-linter-style contracts, read from each module's imports (module level and inside
functions alike): core imports nothing of outbox outside core; ports only core; the transport
adapters (kafka, pglog, the in-memory one) none of the daemons, the Postgres stores or the CLI;
the daemons none of the adapters. And the daemons hold no SQL: no string that is a statement,
no `sql[...]` lookup; their statements run in outbox/postgres/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "outbox"

#: Daemon modules whose SQL has not moved to outbox/postgres/ yet (issue 13, part 2: the
#: Handler's statements go to the inbox store with the handler split). Empty it, don't grow it.
SQL_NOT_MOVED_YET = {"runner.py"}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "outbox" or name.startswith("outbox.")}


def _files(*packages: str) -> list[Path]:
    files: list[Path] = []
    for package in packages:
        target = PACKAGE.joinpath(*package.split(".")[1:])
        files.extend(
            sorted(target.rglob("*.py")) if target.is_dir() else [target.with_suffix(".py")]
        )
    return files


def _violations(
    sources: list[Path], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()
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


def test_the_daemons_hold_no_sql() -> None:
    daemons = [p for p in _files("outbox.daemons") if p.name not in SQL_NOT_MOVED_YET]
    assert [hit for path in daemons for hit in _sql_in(path)] == []


def test_the_sql_guard_sees_what_is_left() -> None:
    # The guard works: the modules not moved yet do hold statements (remove them from
    # SQL_NOT_MOVED_YET once they don't).
    for name in SQL_NOT_MOVED_YET:
        assert _sql_in(PACKAGE / "daemons" / "handler" / name), name
