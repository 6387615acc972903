"""The queue gauges of a process serving many databases skip the parked ones: refreshing
them cost a connection per database per refresh, for databases with nothing waiting."""

from __future__ import annotations

from outbox.core.databases import Database
from outbox.observability.health import Heartbeat
from outbox.observability.runtime import Observability, ObservabilityConfig, Observer, _Probes


class _Probe:
    name = "postgres"
    label = "PostgreSQL"

    def __init__(self, database: Database, asked: list[str]) -> None:
        self.database = database
        self.asked = asked

    def check(self, timeout: float) -> None:
        return None

    def queue_stats(self, queue: str, timeout: float) -> tuple[int, float, int | None] | None:
        self.asked.append(self.database.name)
        return (3, 1.5, 0)

    def close(self) -> None:
        return None


def test_parked_databases_queue_gauges_are_not_refreshed() -> None:
    databases = [Database(name, f"postgresql://h/{name}", "outbox") for name in "abc"]
    asked: list[str] = []
    parked = {"b"}
    owner = Observability(
        "producer",
        Observer(
            ObservabilityConfig(metrics_port=0), probes=lambda database: _Probe(database, asked)
        ),
        heartbeat=Heartbeat(),
        relay_id="r",
        databases=lambda: databases,
        parked=lambda: parked,
    )
    _Probes(owner).refresh_stats()
    assert asked == ["a", "c"]
    parked.clear()  # b woke up: refreshed again
    _Probes(owner).refresh_stats()
    assert asked == ["a", "c", "a", "b", "c"]
