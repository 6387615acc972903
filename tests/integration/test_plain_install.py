"""A plain install (no `sqlalchemy` extra: no greenlet) sends with a SQLAlchemy Session.

SQLAlchemy's asyncio module needs greenlet, which only the `sqlalchemy` extra installs
(`sqlalchemy[asyncio]`). The sync send path must not import it: the test runs `broker.send` in
a subprocess where `sqlalchemy.ext.asyncio` and `greenlet` cannot be imported at all.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from outbox.postgres.migrate import sqlalchemy_url
from tests.integration.relay_helpers import count

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
