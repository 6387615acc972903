"""The quickstart's Python blocks are whole files a newcomer copies: every name one uses is
defined, imported or a builtin in that block (its steps 4 and 6 once used `Order` and
`Shipment`, never shown nor imported)."""

from __future__ import annotations

import ast
import builtins
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
PYTHON_BLOCK = re.compile(r"^( *)```python\n(.*?)^ *```", re.M | re.S)


def undefined_names(source: str) -> set[str]:
    """The names `source` reads that it never binds (assignment, import, def, class, for,
    with, except, comprehension, parameter) and that are not builtins."""
    tree = ast.parse(source)
    bound: set[str] = set(dir(builtins))
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store | ast.Del) else read).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound


def test_every_python_block_of_the_quickstart_defines_what_it_uses() -> None:
    blocks = [textwrap.dedent(body) for _, body in PYTHON_BLOCK.findall(QUICKSTART.read_text())]
    assert len(blocks) >= 4
    missing = {block.splitlines()[0]: undefined_names(block) for block in blocks}
    assert {first: names for first, names in missing.items() if names} == {}


def test_the_check_itself() -> None:
    assert undefined_names("import os\nfrom a import b as c\nx = c(os.sep)\n") == set()
    assert undefined_names("def f(m, s):\n    s.add(Order(id=m))\n") == {"Order"}
    assert undefined_names("with open('f') as h:\n    print([n for n in h])\n") == set()
