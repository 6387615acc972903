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
    InvalidDueTime,
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
    "InvalidDueTime",
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
