"""The pytest plugin registers every marker it documents (`--strict-markers` accepts them), and
docs/testing.md says truly which server each of its fixtures starts."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from outbox.testing import plugin

ROOT = Path(__file__).resolve().parents[2]


def _documented_markers() -> set[str]:
    """Markers named in the plugin's docstring and in docs/testing.md (`marked `name``)."""
    text = (plugin.__doc__ or "") + (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    return set(re.findall(r"marked `(\w+)`", text))


def test_every_documented_marker_is_registered() -> None:
    documented = _documented_markers()
    assert documented, "the docs name the plugin's markers as `marked `name``"
    assert documented <= set(plugin.MARKERS)


def test_a_project_with_strict_markers_can_use_them(tmp_path: Path) -> None:
    # A project of its own: no pyproject.toml of this repository declares the markers.
    body = "".join(
        f"@pytest.mark.{name}\ndef test_{name}():\n    pass\n\n\n" for name in plugin.MARKERS
    )
    (tmp_path / "test_marked.py").write_text(f"import pytest\n\n\n{body}", encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # Load the plugin by name only (as the entry point would), and no other.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    args = [sys.executable, "-m", "pytest", "-p", "outbox.testing.plugin", "-q"]
    collected = subprocess.run(
        [*args, "--collect-only"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert f"{len(plugin.MARKERS)} test" in collected.stdout
    listed = subprocess.run(
        [*args, "--markers"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    for name in plugin.MARKERS:
        assert f"@pytest.mark.{name}:" in listed.stdout

    unknown = tmp_path / "test_unknown.py"
    unknown.write_text("import pytest\n\n\n@pytest.mark.not_a_marker\ndef test_x():\n    pass\n")
    refused = subprocess.run(
        [*args, "--collect-only", str(unknown)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0, "--strict-markers is in force in the subprocess"


#: The "needs" column of docs/testing.md's fixture table, as the servers a fixture starts.
NEEDS = {
    "nothing": set(),
    "PostgreSQL": {"outbox_postgres"},
    "broker": {"outbox_kafka"},
    "both": {"outbox_postgres", "outbox_kafka"},
}
SERVERS = {"outbox_postgres", "outbox_kafka"}


def _servers_needed(fixture: str) -> set[str]:
    """The server fixtures `fixture` depends on through its arguments (itself included)."""
    if fixture in SERVERS:
        return {fixture}
    needed: set[str] = set()
    for argument in inspect.signature(getattr(plugin, fixture)).parameters:
        if hasattr(plugin, argument):  # another fixture of the plugin
            needed |= _servers_needed(argument)
    return needed


def test_the_docs_say_which_server_each_fixture_starts() -> None:
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    documented: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`outbox_"):
            for name in re.findall(r"`(outbox_\w+)`", cells[0]):
                documented[name] = NEEDS[cells[2]]
    fixtures = {name for name in vars(plugin) if name.startswith("outbox_")}
    assert set(documented) == fixtures, "docs/testing.md's table lists every fixture"
    for name, needs in documented.items():
        assert _servers_needed(name) == needs, name
