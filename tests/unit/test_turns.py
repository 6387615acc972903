"""Fair turns between databases (outbox/daemons/turns.py) and the supervisor's handling of its
databases (outbox/daemons/supervisor.py), with in-memory relays."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError
from outbox.daemons.outages import Outage
from outbox.daemons.supervisor import Supervisor
from outbox.daemons.turns import Turns
from outbox.observability.health import Heartbeat
from outbox.observability.runtime import Observability, Observer


def _wait(predicate: object, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_turns_are_given_first_come_first_served() -> None:
    turns = Turns(1)
    turns.acquire()
    order: list[str] = []
    threads: list[threading.Thread] = []
    for name in ("busy", "quiet", "third"):

        def take(name: str = name) -> None:
            turns.acquire()
            order.append(name)

        thread = threading.Thread(target=take)
        thread.start()
        queued = len(threads) + 1
        _wait(lambda q=queued: turns.queued() == q, "the waiter to queue")
        threads.append(thread)
    for _ in threads:
        turns.release()
        given = len(order) + 1
        _wait(lambda g=given: len(order) >= g, "the next turn")
    assert order == ["busy", "quiet", "third"]
    assert turns.waited == 3


def test_a_busy_database_goes_behind_a_quiet_one_after_each_batch() -> None:
    """A relay asks for a turn per batch: a quiet relay that asked while a busy one held the
    only turn gets the next one, before the busy relay's next batch."""
    turns = Turns(1)
    log: list[str] = []
    busy_batches = threading.Semaphore(0)

    def busy() -> None:
        for _ in range(5):
            with turns.turn():
                log.append("busy")
                busy_batches.release()
                time.sleep(0.02)

    thread = threading.Thread(target=busy)
    thread.start()
    busy_batches.acquire()  # the busy relay holds the turn now
    with turns.turn():
        log.append("quiet")
    thread.join()
    assert log.index("quiet") <= 2, log  # after at most the batch in hand (and one race)


def test_turns_let_several_in_at_once() -> None:
    turns = Turns(2)
    turns.acquire()
    turns.acquire()
    assert turns.waited == 0
    got = threading.Event()

    def take() -> None:
        turns.acquire()
        got.set()

    thread = threading.Thread(target=take)
    thread.start()
    _wait(lambda: turns.queued() == 1, "the third to wait")
    assert not got.is_set()
    turns.release()
    assert got.wait(5)
    thread.join()
    with pytest.raises(ValueError):
        Turns(0)


class _Relay:
    """An in-memory relay: serves until stopped, or fails at check as told."""

    def __init__(self, database: Database, broken: set[str]) -> None:
        self.database = database
        self.broken = broken
        self.heartbeat = Heartbeat()
        self.outage = Outage("relay", logging.getLogger("test"))
        self.observability = Observability(
            "producer", Observer(), heartbeat=self.heartbeat, relay_id="r", database=database
        )
        self.turns: Turns | None = None
        self.idle_disconnect: float | None = None
        self.parked = False
        self.checks = 0
        self.served = threading.Event()
        self._stop = threading.Event()

    def check_database(self, wait: float = 0.0) -> None:
        self.checks += 1
        if self.database.name in self.broken:
            raise ConfigurationError(f"schema of {self.database.name} is not migrated")

    def serve(self) -> None:
        self.served.set()
        self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


def _supervisor(
    databases: list[Database], broken: set[str], file: Path | None = None
) -> Supervisor[_Relay]:
    supervisor = Supervisor(
        "producer",
        databases,
        lambda database: _Relay(database, broken),
        lambda relay: relay.serve(),
        turns=Turns(1),
        file=file,
    )
    supervisor.observe(
        Observability(
            "producer",
            Observer(),
            heartbeat=supervisor.heartbeat,
            relay_id="r",
            databases=supervisor.databases,
        )
    )
    return supervisor


def _db(name: str) -> Database:
    return Database(name, f"postgresql://u:secret@h/{name}", "outbox")


def test_a_failing_database_is_retried_and_holds_the_others_in_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    broken = {"bad"}
    supervisor = _supervisor([_db("bad"), _db("good")], broken)
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        _wait(lambda: len(supervisor.relays()) == 2, "both relays")
        relays = {relay.database.name: relay for relay in supervisor.relays()}
        assert relays["good"].served.wait(5)
        assert supervisor.trouble() is None  # one database served: ready
        assert "bad failing (ConfigurationError" in supervisor.report()
        broken.clear()  # migrated meanwhile: served after its backoff
        assert relays["bad"].served.wait(10)
    finally:
        supervisor.stop()
        thread.join(10)
    assert not thread.is_alive()
    lines = [r for r in caplog.records if "cannot serve database bad (retrying" in r.getMessage()]
    assert len(lines) == 1
    assert "recovered" in caplog.text


def test_nothing_served_is_not_ready() -> None:
    supervisor = _supervisor([_db("bad")], {"bad"})
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        _wait(lambda: supervisor.relays() and supervisor.relays()[0].checks, "a check")
        assert supervisor.trouble() == "no database is being served"
    finally:
        supervisor.stop()
        thread.join(10)


def test_the_databases_file_is_re_read_and_a_bad_one_keeps_the_last_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("outbox.daemons.supervisor.FILE_INTERVAL", 0.05)
    file = tmp_path / "databases.txt"
    file.write_text(f"a={_db('a').url}\n")
    supervisor = _supervisor([_db("a")], set(), file)
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        # The list is the file's at once; its relay starts in the supervisor's thread.
        _wait(lambda: len(supervisor.relays()) == 1, "a served")
        assert [d.name for d in supervisor.databases()] == ["a"]
        first = supervisor.relays()[0]
        file.write_text(f"b={_db('b').url}\n# a removed\n")
        _wait(lambda: [r.database.name for r in supervisor.relays()] == ["b"], "a removed, b added")
        assert first.stopping
        file.write_text("b=postgresql://h/b\nnot an entry\n")
        _wait(lambda: "databases file not applied" in caplog.text, "the bad file logged")
        assert [d.name for d in supervisor.databases()] == ["b"]
        assert "secret" not in caplog.text
    finally:
        supervisor.stop()
        thread.join(10)


def test_a_relay_stops_growing_its_batches_while_others_wait_for_turns() -> None:
    """Busy relays double their batches (up to 8 times --batch-size); beside a database that
    waited for a turn they keep to --batch-size, so a quiet one waits one such batch at most."""
    from outbox.daemons.producer import Producer, ProducerConfig
    from outbox.memory import InMemoryTransport
    from outbox.runtime import postgres_stores

    transport = InMemoryTransport()
    config = ProducerConfig(batch_size=10)
    relay = Producer(
        config,
        transport.publisher,
        stores=postgres_stores().relays,  # never connects here
        database=Database("db", "postgresql://h/db", "outbox"),
    )
    relay._resize(10, 10)
    assert relay._limit == 20  # alone (no turns): grows as it always did
    relay.turns = Turns(1)
    relay._resize(20, 20)
    assert relay._limit == 40  # nobody waited
    relay.turns.acquire()
    waiter = threading.Thread(target=relay.turns.acquire)
    waiter.start()
    _wait(lambda: relay.turns is not None and relay.turns.queued() == 1, "a waiter")
    relay.turns.release()
    waiter.join(5)
    relay._resize(40, 40)
    assert relay._limit == 10  # another database waited: back to --batch-size
    relay._resize(10, 10)
    assert relay._limit == 20  # no wait since
