"""`outbox status` over many databases: each read on its own, at most so many at a time, one
that hangs or fails shown with its reason without holding the others back."""

from __future__ import annotations

import threading

from outbox.cli.status import read_each
from outbox.core.databases import Database
from outbox.core.errors import DatabaseUnavailable


def test_fifty_databases_with_one_hanging_and_one_failing_are_all_answered() -> None:
    databases = [Database(f"t{n}", f"postgresql://h/t{n}", "outbox") for n in range(50)]
    never = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()

    def read(database: Database) -> str:
        nonlocal running, most
        if database.name == "t7":
            never.wait()  # a database that accepts and never answers: its slot is freed
            return "late"
        with lock:
            running += 1
            most = max(most, running)
        try:
            if database.name == "t9":
                raise DatabaseUnavailable("cannot connect to PostgreSQL: password=*** refused")
            return database.name.upper()
        finally:
            with lock:
                running -= 1

    try:
        outcomes = read_each(databases, read, timeout=0.5, concurrency=4)
    finally:
        never.set()
    assert [o.database.name for o in outcomes] == [d.name for d in databases]
    assert outcomes[7].value is None and outcomes[7].error == "no answer within 0.5 s"
    assert outcomes[9].value is None
    assert outcomes[9].error == "cannot connect to PostgreSQL: password=*** refused"
    rest = [o for n, o in enumerate(outcomes) if n not in (7, 9)]
    assert all(o.value == o.database.name.upper() and o.error is None for o in rest)
    assert most <= 4  # of the reads that have not timed out
