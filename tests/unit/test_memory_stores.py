"""The in-memory stores shipped for users (`outbox.testing.stores`): what they import, their
public face, and the three daemons running over them in one process, as a user's unit test
would run them. Their behaviour is the store contract suite's (tests/stores/)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from outbox import Handlers, InboxMessage
from outbox.runtime import App, OutboxRuntime, Settings
from outbox.testing import stores
from outbox.testing.stores import (
    MemoryInbox,
    MemoryOutbox,
    MemoryTransaction,
    consumer_queue,
    producer_queue,
    relays,
    values,
)

ROOT = Path(__file__).resolve().parents[2]

#: What the in-memory stores may not import: drivers, PostgreSQL's adapters, the daemons.
HEAVY = ("psycopg", "confluent_kafka", "sqlalchemy", "outbox.postgres", "outbox.daemons")

LOADED = textwrap.dedent(
    """
    import sys
    {prelude}
    import outbox.testing
    import outbox.testing.stores
    from outbox.testing import MemoryInbox, MemoryOutbox
    heavy = {heavy!r}
    print(sorted({{m.split(".")[0] if not m.startswith("outbox.") else ".".join(m.split(".")[:2])
                  for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy)}}))
    """
)

#: Imports the `outbox` package without running outbox/__init__.py (which imports `Broker`, and
#: with it psycopg, and registers PostgreSQL's stores): what the stores themselves pull in.
BYPASS_PACKAGE_INIT = textwrap.dedent(
    """
    import types
    package = types.ModuleType("outbox")
    package.__path__ = [{path!r}]
    sys.modules["outbox"] = package
    """
)


def _loaded(prelude: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", LOADED.format(prelude=prelude, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_in_memory_stores_import_no_driver_adapter_or_daemon() -> None:
    prelude = BYPASS_PACKAGE_INIT.format(path=str(ROOT / "outbox"))
    assert _loaded(prelude) == "[]"


def test_importing_the_in_memory_stores_imports_no_driver() -> None:
    assert _loaded("") == "[]"


def test_the_public_names_are_few_documented_and_there() -> None:
    assert stores.__all__ == sorted(stores.__all__) and len(stores.__all__) <= 8
    for name in stores.__all__:
        assert getattr(stores, name).__module__.startswith(stores.__name__), name
    modules = [consumer_queue, producer_queue, relays, values]
    public = [
        value
        for module in modules
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and not name.startswith("_")
        and value.__module__ == module.__name__
    ]
    assert {cls.__name__ for cls in public} >= {"MemoryOutboxSession", "MemoryHandlerWork"}
    for cls in public:
        doc = inspect.getdoc(cls)
        assert doc and doc.splitlines()[0].endswith("."), f"{cls}: a one-line summary first"
    from outbox import testing

    assert testing.MemoryOutbox is MemoryOutbox and testing.MemoryInbox is MemoryInbox


def _until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextmanager
def _running(*daemons: Any) -> Iterator[None]:
    threads = [threading.Thread(target=d.run, daemon=True) for d in daemons]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for daemon in daemons:
            daemon.stop()
        for thread in threads:
            thread.join(10)
            assert not thread.is_alive()


def test_a_message_goes_from_the_outbox_to_a_handler_with_no_server() -> None:
    """The user's story: the Producer, the Consumer and the HandlerRunner of an
    `App.in_memory()` over in-memory stores and transport; the callback's writes commit with
    its row, once, in order per key."""
    handlers = Handlers()

    @handlers.handler("orders")
    def on_order(message: InboxMessage[Any], tx: MemoryTransaction) -> None:
        tx.write((message.key, message.payload["n"]))

    app = App.in_memory(handlers, group="billing")
    assert app.memory is not None
    outbox, inbox = app.memory.outbox, app.memory.inbox
    app.memory.transport.create_topic("orders", partitions=3)
    for n in range(30):
        outbox.send("orders", {"n": n}, key=f"order-{n % 4}")
    with OutboxRuntime.of(app):
        _until(lambda: len(inbox.effects) == 30, "every message handled")
    assert outbox.rows == {} and inbox.rows == {} and len(inbox.processed) == 30
    by_key: dict[bytes | None, list[int]] = {}
    for key, n in inbox.effects:  # type: ignore[misc]
        by_key.setdefault(key, []).append(n)
    assert by_key == {f"order-{k}".encode(): list(range(k, 30, 4)) for k in range(4)}


def test_the_daemons_of_an_in_memory_app_run_one_by_one() -> None:
    """Each part on its own, as a test that drives them itself does."""
    handlers = Handlers()

    @handlers.handler("orders")
    def on_order(message: InboxMessage[Any], tx: MemoryTransaction) -> None:
        tx.write(message.payload["n"])

    app = App.in_memory(handlers, group="billing", settings=Settings())
    memory = app.memory
    assert memory is not None
    for n in range(5):
        memory.outbox.send("orders", {"n": n}, key="k")
    with _running(app.producer(), app.consumer(), app.handler()):
        _until(lambda: len(memory.inbox.effects) == 5, "every message handled")
    assert memory.inbox.effects == [0, 1, 2, 3, 4]
