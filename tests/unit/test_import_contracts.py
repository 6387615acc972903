"""The layering's import-linter contracts ([tool.importlinter] in pyproject.toml) hold, and each
kind breaks when a module imports what it must not: run on a copy of the package with one import
added (in a function, where Python would not load it at import time, or through a chain)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (pip install -e '.[dev]')"
)


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """lint-imports over `root`'s pyproject.toml and package, its `contracts` only if named."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *(f"--contract={c}" for c in contracts)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )


def test_the_contracts_hold() -> None:
    linted = _lint(ROOT)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 broken" in linted.stdout


@pytest.mark.parametrize(
    ("module", "added", "contract"),  # contract: its id in pyproject.toml
    [
        (  # the CLI builds a daemon itself instead of asking the root
            "outbox/cli/dev.py",
            "def _f():\n    from outbox.daemons.producer import Producer\n",
            "composition-root",
        ),
        (  # through a chain: the console reaches a daemon through formatting.py
            "outbox/formatting.py",
            "def _f():\n    import outbox.daemons.relay\n",
            "composition-root",
        ),
        (  # a probe reaches PostgreSQL without a port
            "outbox/observability/health.py",
            "def _f():\n    import outbox.postgres.probes\n",
            "probes-through-ports",
        ),
        (  # a daemon reaches a driver through the log's package
            "outbox/daemons/relay.py",
            "def _f():\n    from outbox.pglog import log\n",
            "daemons-see-ports",
        ),
        (
            "outbox/core/text.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import outbox.ports\n",
            "core-is-pure",
        ),
        (  # the console reaches the sending face
            "outbox/console/render.py",
            "def _f():\n    from outbox.broker import Broker\n",
            "console-knows-no-face",
        ),
        (  # a lower layer reaches up
            "outbox/ports.py",
            "def _f():\n    import outbox.runtime\n",
            "layers",
        ),
        (
            "outbox/kafka/start.py",
            "def _f():\n    import outbox.postgres.connection\n",
            "adapters-apart",
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, added: str, contract: str
) -> None:
    shutil.copytree(ROOT / "outbox", tmp_path / "outbox", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _lint(tmp_path, contract).returncode == 0  # a lint that always fails proves nothing
    with (tmp_path / module).open("a") as source:
        source.write("\n\n" + added)
    linted = _lint(tmp_path, contract)
    assert linted.returncode == 1, linted.stdout + linted.stderr
    assert "1 broken" in linted.stdout, linted.stdout
