"""Test support: throwaway PostgreSQL/Kafka servers (`servers`), a pytest plugin (`plugin`), the
in-memory stores (`stores`) and transport (`memory`), `drain`, `sent` (what a block of code
sent) and `topic_renamed` (a `Topic` under a per-test name).

The pytest plugin loads automatically through the `pytest11` entry point once the package is
installed; this module re-exports the pytest-free API, each name imported on first use from
its module, so that this module and `outbox.testing.stores` import neither psycopg nor
confluent-kafka nor the daemons themselves (tests/unit/test_memory_stores.py).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = [
    "DeadLetter",
    "DrainResult",
    "DrainTimeout",
    "MemoryInbox",
    "MemoryOutbox",
    "PayloadUndecodable",
    "PostgresLog",
    "PostgresServer",
    "Sent",
    "SentMessage",
    "ServerError",
    "Servers",
    "TansuBroker",
    "create_database",
    "create_topic",
    "docker_available",
    "drain",
    "drop_database",
    "per_test_name",
    "sent",
    "start_servers",
    "topic_renamed",
]

if TYPE_CHECKING:
    from outbox.testing.draining import DeadLetter, DrainResult, DrainTimeout, PostgresLog, drain
    from outbox.testing.sending import PayloadUndecodable, Sent, SentMessage, sent
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
    from outbox.testing.stores import MemoryInbox, MemoryOutbox
    from outbox.testing.topics import per_test_name, topic_renamed

#: Where each name lives.
_HOMES = {
    **dict.fromkeys(
        ("DeadLetter", "DrainResult", "DrainTimeout", "PostgresLog", "drain"), "draining"
    ),
    **dict.fromkeys(
        (
            "PostgresServer",
            "ServerError",
            "Servers",
            "TansuBroker",
            "create_database",
            "create_topic",
            "docker_available",
            "drop_database",
            "start_servers",
        ),
        "servers",
    ),
    **dict.fromkeys(("MemoryInbox", "MemoryOutbox"), "stores"),
    **dict.fromkeys(("PayloadUndecodable", "Sent", "SentMessage", "sent"), "sending"),
    **dict.fromkeys(("per_test_name", "topic_renamed"), "topics"),
}


def __getattr__(name: str) -> Any:
    """A name of `__all__`, from its module, imported on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"outbox.testing.{home}"), name)
