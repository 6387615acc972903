"""A Kafka-like log kept in PostgreSQL: the second transport, for teams without Kafka.

`PgLogPublisher` and `PgLogSubscriber` implement the `Publisher` and `Subscriber` ports over a
log database migrated by `outbox migrate --log-url URL` (schema `outbox_log` by default) and
pass the same contract suite as Kafka (tests/transport/). Records carry outbox's wire headers,
so the inbox rows are those Kafka would give. docs/decisions/0009-postgres-log.md says why it
is built the way it is.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.pglog.log import (
        DEFAULT_PARTITIONS,
        DEFAULT_SCHEMA,
        GroupInUse,
        PartitionsCannotShrink,
        PgLog,
        TopicExists,
        TopicInfo,
        UnknownTopic,
        check_log,
    )
    from outbox.pglog.publisher import LogAppendRefused, PgLogPublisher
    from outbox.pglog.subscriber import PgLogSubscriber

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_SCHEMA",
    "GroupInUse",
    "LogAppendRefused",
    "PartitionsCannotShrink",
    "PgLog",
    "PgLogPublisher",
    "PgLogSubscriber",
    "TopicExists",
    "TopicInfo",
    "UnknownTopic",
    "check_log",
]

#: Where each name is: the package loads psycopg only when one is used (its registry entry,
#: outbox/pglog/transport.py, is imported to add the log's flags to every command).
_HOMES = {
    "LogAppendRefused": "outbox.pglog.publisher",
    "PgLogPublisher": "outbox.pglog.publisher",
    "PgLogSubscriber": "outbox.pglog.subscriber",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOMES.get(name, "outbox.pglog.log")), name)
