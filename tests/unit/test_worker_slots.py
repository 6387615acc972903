"""The handler's worker sessions shared by the databases of a process (handler/slots.py)."""

from __future__ import annotations

import threading
import time

import pytest

from outbox.daemons.budget import Budget
from outbox.daemons.handler.slots import RESERVE, WorkerSlots


def test_the_sessions_are_reserved_at_start_and_counted_against_the_database_they_serve() -> None:
    budget = Budget(10)
    slots = WorkerSlots(budget, 4)
    assert budget.used() == 4 and budget.reserved() == 4 and budget.holders() == {}
    assert budget.describe() == "connections: 0 of 10, 4 reserved for handler workers"
    acme = budget.holding("acme", "handler")
    assert budget.acquire(acme)  # its relay's connection
    assert slots.take(acme, 0, 3) == 3
    assert budget.holders() == {"acme": 4} and budget.reserved() == 1 and budget.used() == 5
    assert slots.take(acme, 3, 6) == 1  # no more than there are
    slots.give(acme, 4)
    budget.release(acme)
    assert budget.used() == 4 and budget.holders() == {} and slots.peak == 4
    assert RESERVE not in budget.holders()


def test_a_relay_holding_none_waits_in_turn_and_one_holding_some_takes_no_more_meanwhile() -> None:
    budget = Budget(10)
    slots = WorkerSlots(budget, 2)
    a, b, c = (budget.holding(name, "handler") for name in "abc")
    for one in (a, b, c):
        assert budget.acquire(one)
    assert slots.take(a, 0, 2) == 2
    got: list[tuple[str, int]] = []

    def wait(name: str, holding: object, wanted: int) -> None:
        got.append((name, slots.take(holding, 0, wanted)))  # type: ignore[arg-type]

    tb = threading.Thread(target=wait, args=("b", b, 2))
    tb.start()
    time.sleep(0.1)
    tc = threading.Thread(target=wait, args=("c", c, 2))
    tc.start()
    time.sleep(0.1)
    assert slots.waiting() and got == []
    assert slots.take(a, 2, 3) == 0  # it holds some, others wait: no more for it
    slots.give(a, 2)
    tb.join(2)
    tc.join(2)
    # First come first served, one each while another waits behind.
    assert got == [("b", 1), ("c", 1)]
    assert not slots.waiting() and slots.in_use() == 2


def test_a_waiting_relay_that_stops_takes_nothing() -> None:
    budget = Budget(4)
    slots = WorkerSlots(budget, 1)
    a, b = budget.holding("a", "handler"), budget.holding("b", "handler")
    assert slots.take(a, 0, 1) == 1
    started = time.monotonic()
    assert slots.take(b, 0, 1, stopping=lambda: time.monotonic() - started > 0.3) == 0
    assert not slots.waiting() and budget.holders() == {"a": 1}


def test_the_reserve_is_never_asked_to_give_its_connections_back() -> None:
    budget = Budget(3)
    slots = WorkerSlots(budget, 1)
    a, b = budget.holding("a", "handler"), budget.holding("b", "handler")
    assert budget.acquire(a, 2)
    waiter = threading.Thread(target=budget.acquire, args=(b,), daemon=True)
    waiter.start()
    time.sleep(0.05)
    # Held longest, the reserve would be asked first; it is not, the busy relay is.
    budget._holdings[0].since = 0.0
    a.since = time.monotonic() - 10
    assert not budget.should_yield(slots.reserve) and budget.should_yield(a)
    budget.release(a)
    waiter.join(2)
    with pytest.raises(ValueError, match="at least 1"):
        WorkerSlots(budget, 0)
