"""The wheel built from this checkout, installed into a clean virtual environment.

`built_wheel()` builds it as the README says (`pip wheel --no-deps -w DIR CHECKOUT`) and
downloads the wheels of its dependencies and the README's extras beside it: once per content
of the checkout (a hash of what goes into the wheel), kept in `.cache/wheel/HASH/` (an older
one is removed), since a build and a download take tens of seconds. `installed_venv()` makes a
new virtual environment outside the checkout and installs the wheel with those extras from
there, without an index: once per test process, for the tests that run what a newcomer runs
(tests/integration/test_plain_install.py, test_readme_service.py).

The environment is made without pip (`python -m venv --without-pip`, seconds faster than
ensurepip) and filled by the pip running the tests (`pip --python VENV/bin/python`).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "wheel"
README = ROOT / "README.md"
#: What goes into the wheel (pyproject.toml's hatch settings), besides README.md and LICENSE.
SOURCES = ("outbox", "migrations")
#: The README's install lines: the build of the wheel, and its install with extras.
BUILD_LINE = re.compile(r"^pip wheel --no-deps -w dist (\S+)\s", re.M)
INSTALL_LINE = re.compile(r"^pip install 'dist/(pg_kafka_outbox-[^']+\.whl)\[([a-z,]+)\]'", re.M)


def version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return str(project["version"])


def readme_install() -> tuple[str, list[str]]:
    """The wheel file the README installs and its extras."""
    match = INSTALL_LINE.search(README.read_text(encoding="utf-8"))
    assert match, "README.md: no `pip install 'dist/pg_kafka_outbox-...whl[EXTRAS]'` line"
    return match.group(1), match.group(2).split(",")


def source_hash() -> str:
    """A hash of every file that goes into the wheel (caches and bytecode left out)."""
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "LICENSE"]
    for top in SOURCES:
        files.extend(
            path
            for path in (ROOT / top).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        )
    for path in sorted(files):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _pip(*args: str, timeout: float = 300) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}\n{result.stderr}"


@functools.cache
def built_wheel() -> tuple[Path, Path]:
    """(the wheel, the directory of it and its dependencies' wheels), built or cached."""
    name, extras = readme_install()
    wanted = CACHE / source_hash()
    wheel = wanted / name
    if not wheel.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix="building-", dir=CACHE))
        try:
            _pip("wheel", "--no-deps", "-w", str(building), str(ROOT))
            built = [p.name for p in building.glob("*.whl")]
            assert built == [name], f"the build made {built}, the README installs {name}"
            spec = f"{building / name}[{','.join(extras)}]"
            _pip("download", "-q", "-d", str(building), spec)
            for old in CACHE.iterdir():
                if old != building:
                    shutil.rmtree(old, ignore_errors=True)
            building.rename(wanted)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return wheel, wanted


@functools.cache
def installed_venv() -> Path:
    """A new virtual environment (outside the checkout, removed at exit) holding the wheel
    with the README's extras and nothing else."""
    wheel, wheelhouse = built_wheel()
    _, extras = readme_install()
    directory = Path(tempfile.mkdtemp(prefix="outbox-wheel-venv-"))
    directory.chmod(0o755)  # under root, `outbox dev` runs PostgreSQL as another user
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    venv = directory / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    spec = f"{wheel}[{','.join(extras)}]"
    _pip(
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "-q",
        "--no-index",
        "--find-links",
        str(wheelhouse),
        spec,
    )
    return venv


def venv_environment(venv: Path, **more: str) -> dict[str, str]:
    """The environment of a shell with `venv` activated: its bin first on PATH, no
    PYTHONPATH (which would import the checkout's package) and no OUTBOX_* variable."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"} and not key.startswith("OUTBOX_")
    }
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env.update(more)
    return env
