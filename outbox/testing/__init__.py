"""Test support: throwaway PostgreSQL/Kafka servers (`servers`) and a pytest plugin (`plugin`).

The pytest plugin loads automatically through the `pytest11` entry point once the package is
installed; this module only re-exports the pytest-free server API.
"""

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
    "PostgresServer",
    "ServerError",
    "Servers",
    "TansuBroker",
    "create_database",
    "create_topic",
    "docker_available",
    "drop_database",
    "start_servers",
]
