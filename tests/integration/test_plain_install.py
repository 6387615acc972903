"""A plain install (no `sqlalchemy` extra: no greenlet) sends with a SQLAlchemy Session, and
the wheel built from the checkout installs as the README says and sends.

SQLAlchemy's asyncio module needs greenlet, which only the `sqlalchemy` extra installs
(`sqlalchemy[asyncio]`). The sync send path must not import it: the test runs `broker.send` in
a subprocess where `sqlalchemy.ext.asyncio` and `greenlet` cannot be imported at all.

The wheel (tests/integration/wheel_support.py) is built with the README's command, installed
with the README's extras into a new virtual environment outside the checkout, and runs
`outbox --version` and the same send from there.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from outbox.postgres.migrate import sqlalchemy_url
from tests.integration.relay_helpers import count
from tests.integration.wheel_support import (
    BUILD_LINE,
    README,
    installed_venv,
    venv_environment,
    version,
)

SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = ("greenlet", "sqlalchemy.ext.asyncio")


    class Blocker:
        '''Makes the modules of the asyncio extra unimportable, as on a plain install.'''

        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None


    sys.meta_path.insert(0, Blocker())
    for name in list(sys.modules):
        assert not any(name == b or name.startswith(b + ".") for b in BLOCKED), name

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from outbox import Broker

    engine = create_engine(sys.argv[1])
    broker = Broker()
    with Session(engine) as session, session.begin():
        broker.send(session, "orders.created", {"n": 1}, key="k-1")
    with engine.begin() as conn:
        broker.send(conn, "orders.created", {"n": 2}, key="k-2")
    loaded = [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)]
    assert not loaded, loaded
    print("sent 2")
    """
)


def test_send_with_a_session_imports_nothing_async(outbox_database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, sqlalchemy_url(outbox_database_url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "sent 2"
    assert count(outbox_database_url) == 2


def test_the_readme_builds_the_wheel_as_the_test_does() -> None:
    # `pip wheel --no-deps -w dist CHECKOUT`: what wheel_support.built_wheel runs.
    match = BUILD_LINE.search(README.read_text(encoding="utf-8"))
    assert match, "README.md: no `pip wheel --no-deps -w dist CHECKOUT` line"
    assert match.group(1) == "../pg-kafka-outbox"


def test_the_wheel_installs_into_a_clean_venv_and_sends(
    outbox_database_url: str, tmp_path: Path
) -> None:
    venv = installed_venv()
    env = venv_environment(venv)
    shown = subprocess.run(
        ["outbox", "--version"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"outbox {version()}"
    where = subprocess.run(
        ["python", "-c", "import outbox; print(outbox.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.startswith(str(venv)), where  # the wheel's, not the checkout's
    result = subprocess.run(
        ["python", "-c", SCRIPT, sqlalchemy_url(outbox_database_url)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "sent 2"
    assert count(outbox_database_url) == 2
    # `outbox serve` without its extra: one line naming it, before anything else.
    served = subprocess.run(
        ["outbox", "serve", "--database-url", outbox_database_url],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 1
    assert served.stderr.startswith(
        "outbox: error: outbox serve needs the serve extra: pip install 'pg-kafka-outbox[serve]'"
    )
    assert len(served.stderr.strip().splitlines()) == 1
