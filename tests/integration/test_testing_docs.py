"""docs/testing.md's examples of `sent` and of a per-test topic run as a service's own tests.

Every python block of the page parses; the blocks of the two sections that hold test functions
are written, as they are, to test files of a project of its own (with the `session` fixture the
page says the user writes) and run by pytest in a subprocess, the plugin loaded through its
entry point. The subprocess shares this session's PostgreSQL and starts its own Tansu broker
for the test on the real broker, as a user's session would.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from outbox.testing.servers import (
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_NO_DOCKER,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
SECTIONS = ("## What your code sent: `sent`", "## A fixed-name `Topic` under a per-test name")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)

#: The fixture docs/testing.md says a service writes itself: a session on the test's database,
#: here with the example services' tables.
CONFTEST = """
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from examples.orders_service import create_schema as create_orders_schema
from examples.shipping_service import create_schema as create_shipping_schema
from outbox.postgres.migrate import sqlalchemy_url


@pytest.fixture
def session(outbox_database_url):
    create_orders_schema(outbox_database_url)
    create_shipping_schema(outbox_database_url)
    engine = create_engine(sqlalchemy_url(outbox_database_url))
    with Session(engine) as session:
        yield session
    engine.dispose()
"""


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _examples() -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    return [
        block
        for heading in SECTIONS
        for block in PYTHON_BLOCK.findall(_section(text, heading))
        if re.search(r"^(async )?def test_", block, re.M)
    ]


def test_every_python_block_of_the_page_parses() -> None:
    blocks = PYTHON_BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 6
    for block in blocks:
        ast.parse(block)


def test_the_examples_of_sent_and_of_a_per_test_topic_pass(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, outbox_admin_url: str
) -> None:
    examples = _examples()
    assert len(examples) == 3, "the sections' test examples"
    monkeypatch.setenv(ENV_DATABASE_URL, outbox_admin_url)
    monkeypatch.delenv(ENV_KAFKA_BOOTSTRAP, raising=False)  # its own Tansu, as a user's has
    monkeypatch.setenv(ENV_NO_DOCKER, "1")
    monkeypatch.delenv("ORDERS_TOPIC", raising=False)
    pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(pythonpath))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**{f"test_docs_{n}": block for n, block in enumerate(examples)})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3)
