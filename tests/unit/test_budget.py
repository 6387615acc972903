"""The connection budget of a process serving several databases (outbox/daemons/budget.py)."""

from __future__ import annotations

import threading
import time

import pytest

from outbox.daemons import budget as budget_module
from outbox.daemons.budget import Budget


def test_never_more_than_the_budget_and_waiters_served_first_come_first_served() -> None:
    budget = Budget(3)
    holders = [budget.holding(f"t{i}", "producer") for i in range(8)]
    peak = 0
    order: list[str] = []
    lock = threading.Lock()

    def hold(index: int) -> None:
        nonlocal peak
        with budget.held(holders[index], 2 if index % 2 else 1) as taken:
            assert taken
            with lock:
                peak = max(peak, budget.used())
                order.append(holders[index].database)
            time.sleep(0.02)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(order) == sorted(h.database for h in holders)
    assert peak <= 3 and budget.peak <= 3
    assert budget.used() == 0 and budget.holders() == {}


def test_a_waiter_stops_waiting_when_its_holder_stops() -> None:
    budget = Budget(2)
    first, second = budget.holding("a", "handler"), budget.holding("b", "handler")
    assert budget.acquire(first, 2)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert not budget.acquire(second, 1, stopping=stop.is_set)
    assert budget.waiting() == 0 and budget.holders() == {"a": 2}


def test_the_holder_idle_longest_yields_then_the_busy_one_held_longest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(budget_module, "FAIR_HOLD", 0.0)
    budget = Budget(2)
    old, new, waiter = (budget.holding(n, "producer") for n in ("old", "new", "waiter"))
    assert budget.try_acquire(old) and budget.try_acquire(new)
    assert not budget.should_yield(old)  # nobody waits
    thread = threading.Thread(target=budget.acquire, args=(waiter,))
    thread.start()
    while not budget.waiting():
        time.sleep(0.01)
    old.idle_since, new.idle_since = time.monotonic() - 10, time.monotonic() - 1
    assert budget.should_yield(old) and not budget.should_yield(new)
    old.idle_since = new.idle_since = None
    old.busy = new.busy = True
    assert budget.should_yield(old) and not budget.should_yield(new)  # held longest
    budget.release(old)
    thread.join(5)
    assert budget.holders() == {"new": 1, "waiter": 1}
    assert "connections: 2 of 2 (new 1, waiter 1)" in budget.describe()


def test_a_handler_runs_fewer_workers_than_the_budget() -> None:
    assert Budget(3).fits(4) == 3 and Budget(None).fits(4) == 4


def test_as_many_idle_holders_yield_as_there_are_waiters() -> None:
    budget = Budget(3)
    holders = [budget.holding(f"h{i}", "handler") for i in range(3)]
    for age, holding in zip((30, 20, 10), holders, strict=True):
        assert budget.try_acquire(holding)
        holding.idle_since = time.monotonic() - age
    waiters = [budget.holding(f"w{i}", "handler") for i in range(2)]
    threads = [threading.Thread(target=budget.acquire, args=(w,)) for w in waiters]
    for thread in threads:
        thread.start()
    while budget.waiting() < 2:
        time.sleep(0.01)
    assert [budget.should_yield(h) for h in holders] == [True, True, False]
    budget.release(holders[0])
    budget.release(holders[1])
    for thread in threads:
        thread.join(5)
    assert budget.holders() == {"h2": 1, "w0": 1, "w1": 1}
