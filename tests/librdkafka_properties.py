"""librdkafka's configuration properties, read from the library confluent-kafka has loaded.

`rd_kafka_conf_properties_show()` prints the library's own table of properties (the one its
CONFIGURATION.md is made from): name, scope, range, default, importance and a description that
ends in `*Type: ...*`. Reading it from the loaded library, never from a copy, means a property a
newer librdkafka adds is seen by the tests that walk this list the day it is installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Property:
    """One row of librdkafka's table."""

    name: str
    scope: str  # "*" both, "P" producer, "C" consumer
    description: str
    type: str  # "string", "integer", "boolean", "enum value", "CSV flags", "see dedicated API"


def _loaded_library() -> Path:
    """The librdkafka shared object the running process has loaded (confluent-kafka's)."""
    import confluent_kafka

    confluent_kafka.libversion()  # the extension, and with it librdkafka, is loaded
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "librdkafka" in Path(path).name:
            return Path(path)
    found = ctypes.util.find_library("rdkafka")
    if found is None:
        raise RuntimeError("librdkafka is not loaded and not found")
    return Path(found)


@cache
def properties() -> tuple[Property, ...]:
    """Every configuration property (global and topic) of the loaded librdkafka."""
    library = ctypes.CDLL(str(_loaded_library()))
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    library.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".md") as table:
        stream = libc.fopen(table.name.encode(), b"w")
        if not stream:
            raise OSError(f"cannot open {table.name}")
        try:
            library.rd_kafka_conf_properties_show(stream)
        finally:
            libc.fclose(stream)
        text = Path(table.name).read_text()
    found: dict[str, Property] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) < 6 or not re.fullmatch(r"[a-z][\w.]*", cells[0]):
            continue
        description = cells[-1]
        kind = re.search(r"\*Type: ([^*]+)\*", description)
        found.setdefault(
            cells[0],
            Property(
                name=cells[0],
                scope=cells[1],
                description=description,
                type=kind.group(1).strip() if kind else "",
            ),
        )
    if len(found) < 100:  # the table's shape changed: fail loudly rather than check nothing
        raise RuntimeError(f"read only {len(found)} properties from librdkafka's table")
    return tuple(found.values())
