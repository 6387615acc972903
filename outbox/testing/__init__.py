"""Test support: throwaway PostgreSQL/Kafka servers (`servers`) and a pytest plugin (`plugin`).

The pytest plugin loads automatically through the `pytest11` entry point once the package is
installed; this module re-exports the pytest-free API: the servers, `drain` (imported on
first use, so that loading the plugin does not import the daemons), `sent` (what a block of
code sent) and `topic_renamed` (a `Topic` under a per-test name), imported on first use too.
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
    from outbox.testing.topics import per_test_name, topic_renamed

_DRAINING = ("DeadLetter", "DrainResult", "DrainTimeout", "PostgresLog", "drain")
_SENDING = ("PayloadUndecodable", "Sent", "SentMessage", "sent")
_TOPICS = ("per_test_name", "topic_renamed")


def __getattr__(name: str) -> Any:
    """`drain`, `sent`, `topic_renamed` and their types, from `outbox.testing.draining`,
    `.sending` and `.topics`, imported on first use."""
    if name in _DRAINING:
        from outbox.testing import draining

        return getattr(draining, name)
    if name in _SENDING:
        from outbox.testing import sending

        return getattr(sending, name)
    if name in _TOPICS:
        from outbox.testing import topics

        return getattr(topics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
