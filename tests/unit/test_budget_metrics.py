"""The connection budget in the metrics: who holds it, the handler workers' reserve not in use
and the databases waiting, as /readyz says them (docs/how-to/observability.md)."""

from __future__ import annotations

import threading
import time

from outbox.daemons.budget import Budget
from outbox.observability.metrics import PrometheusMetrics


def test_the_reserve_and_the_waiting_databases_are_gauges_beside_the_holders() -> None:
    budget = Budget(6)
    reserve = budget.holding("(handler workers)", "handler")
    reserve.permanent = True
    assert budget.try_acquire(reserve, 3)
    acme = budget.holding("acme", "handler")
    assert budget.try_acquire(acme, 2)
    budget.transfer(reserve, acme, 1)  # a worker's session serving acme now
    metrics = PrometheusMetrics("handler", {"daemon": "handler"}, progress_age=lambda: 0.0)
    metrics.connection_budget(budget.size or 0, budget.holders, budget.reserved, budget.waiting)
    value = metrics.registry.get_sample_value
    assert value("outbox_connection_budget") == 6
    assert value("outbox_connections", {"database": "acme"}) == 3
    assert value("outbox_connections_reserved") == 2
    assert value("outbox_connections_waiting") == 0
    assert "connections: 3 of 6 (acme 3), 2 reserved for handler workers" in budget.describe()

    globex = budget.holding("globex", "handler")
    stop = threading.Event()
    waiter = threading.Thread(
        target=budget.acquire, args=(globex, 2), kwargs={"stopping": stop.is_set}
    )
    waiter.start()
    try:
        deadline = time.monotonic() + 5
        while value("outbox_connections_waiting") != 1:  # read at each scrape
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert budget.describe().endswith(", 1 waiting")
        budget.release(acme, 2)  # the waiter takes them
        waiter.join(5)
        assert value("outbox_connections_waiting") == 0
        assert value("outbox_connections", {"database": "globex"}) == 2
    finally:
        stop.set()
        waiter.join(5)
