"""Transactional outbox and inbox for microservices over PostgreSQL and Kafka.

from outbox import Broker
broker = Broker()
with conn.transaction():
    ...business writes...
    broker.send(conn, "orders.created", {"id": 42}, key="order-42")
"""

from outbox._version import version as _read_version
from outbox.broker import Broker, Message
from outbox.core.envelope import InboxMessage
from outbox.core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DuplicateMessageId,
    InvalidHeaders,
    InvalidKey,
    InvalidTopic,
    KafkaUnavailable,
    NotInTransaction,
    OutboxError,
    PayloadTooLarge,
    SchemaNotMigrated,
    SchemaTooNew,
    SerializationError,
    UnsupportedTransaction,
)
from outbox.core.handlers import HandlerConflict, Handlers
from outbox.core.retry import Backoff
from outbox.core.serializers import JsonSerializer, Serializer
from outbox.core.topics import Topic
from outbox.ports import RelayStores as _RelayStores
from outbox.ports import use_inbox_writers as _use_inbox_writers
from outbox.ports import use_relay_stores as _use_relay_stores
from outbox.postgres.inbox_writer import PostgresInbox as _PostgresInboxWriters
from outbox.postgres.relay_stores import PostgresInbox as _PostgresInbox
from outbox.postgres.relay_stores import PostgresOutbox as _PostgresOutbox

# The relays' queues and the Consumer's inboxes are PostgreSQL's unless the wiring passes a
# daemon other stores: the daemons know only the ports (outbox/ports.py), never outbox/postgres/.
_use_relay_stores(_RelayStores(outbox=_PostgresOutbox, inbox=_PostgresInbox))
_use_inbox_writers(_PostgresInboxWriters)

#: The version of the installed distribution (pg-kafka-outbox), else of pyproject.toml.
__version__ = _read_version()

__all__ = [
    "Backoff",
    "Broker",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DuplicateMessageId",
    "HandlerConflict",
    "Handlers",
    "InboxMessage",
    "InvalidHeaders",
    "InvalidKey",
    "InvalidTopic",
    "JsonSerializer",
    "KafkaUnavailable",
    "Message",
    "NotInTransaction",
    "OutboxError",
    "PayloadTooLarge",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "SerializationError",
    "Serializer",
    "Topic",
    "UnsupportedTransaction",
]
