"""outbox's version: the installed distribution's, else the one in a source checkout's
pyproject.toml."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "pg-kafka-outbox"


def version() -> str:
    """The version of the installed `pg-kafka-outbox`, else pyproject.toml's, else 0+unknown."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _pyproject_version() or "0+unknown"


def _pyproject_version() -> str | None:
    path = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    found = project.get("version") if isinstance(project, dict) else None
    return found if isinstance(found, str) else None
