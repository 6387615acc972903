"""Test support: throwaway PostgreSQL/Kafka servers (`servers`) and a pytest plugin (`plugin`).

The pytest plugin loads automatically through the `pytest11` entry point once the package is
installed; this module re-exports the pytest-free API: the servers, and `drain` (imported on
first use, so that loading the plugin does not import the daemons).
"""

from typing import TYPE_CHECKING, Any

from outbox.testing.servers import (
    PostgresServer,
    ServerError,
    Servers,
    TansuBroker,
    create_database,
    create_topic,
    docker_available,
    drop_database,
    start_servers,
)

__all__ = [
    "DeadLetter",
    "DrainResult",
    "DrainTimeout",
    "PostgresLog",
    "PostgresServer",
    "ServerError",
    "Servers",
    "TansuBroker",
    "create_database",
    "create_topic",
    "docker_available",
    "drain",
    "drop_database",
    "start_servers",
]

if TYPE_CHECKING:
    from outbox.testing.draining import DeadLetter, DrainResult, DrainTimeout, PostgresLog, drain

_DRAINING = ("DeadLetter", "DrainResult", "DrainTimeout", "PostgresLog", "drain")


def __getattr__(name: str) -> Any:
    """`drain` and its types, from `outbox.testing.draining`, imported on first use."""
    if name in _DRAINING:
        from outbox.testing import draining

        return getattr(draining, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
