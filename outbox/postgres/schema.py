"""The declared schema, as SQLAlchemy tables; the migrations must produce exactly this."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from outbox.postgres.queries import validate_schema

PRODUCER_QUEUE = "producer_queue"
CONSUMER_QUEUE = "consumer_queue"
RELAY_STATE = "relay_state"
PRODUCER_DEAD = "producer_dead"
CONSUMER_PROCESSED = "consumer_processed"
HTTP_PUBLISHED = "http_published"


def _message_columns() -> list[Column[object]]:
    return [
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("message_id", Uuid, nullable=False, unique=True),
        Column("topic", Text, nullable=False),
        Column("key", LargeBinary),
        Column("payload", LargeBinary, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("content_type", Text, nullable=False),
        Column("lane", SmallInteger, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column(
            "next_attempt_at",
            DateTime(timezone=True),
            nullable=False,
            server_default=text("now()"),
        ),
        Column("last_error", Text),
        Column("dead_at", DateTime(timezone=True)),
    ]


def metadata(schema: str = "outbox") -> MetaData:
    """The tables of one outbox schema."""
    md = MetaData(schema=validate_schema(schema))
    producer = Table(PRODUCER_QUEUE, md, *_message_columns())
    Index(
        "producer_queue_retry",
        producer.c.lane,
        producer.c.key,
        postgresql_where=text("attempts > 0 AND dead_at IS NULL"),
    )
    # Rows of producer_queue that can never be delivered, moved out of the relay's way
    # (migration 0004); requeue moves them back with their id.
    Table(
        PRODUCER_DEAD,
        md,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("message_id", Uuid, nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", LargeBinary),
        Column("payload", LargeBinary, nullable=False),
        Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
        Column("content_type", Text, nullable=False),
        Column("lane", SmallInteger, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("attempts", Integer, nullable=False, server_default=text("0")),
        Column("next_attempt_at", DateTime(timezone=True), nullable=False),
        Column("last_error", Text),
        Column("dead_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    )
    consumer = Table(
        CONSUMER_QUEUE,
        md,
        *_message_columns(),
        Column("source_partition", Integer),
        Column("source_offset", BigInteger),
        Column(
            "received_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
        ),
        #: Set only by releases before migration 0007 (a handled row now leaves the table):
        #: NULL and 0 on every row since; the partial indexes still name processed_at.
        Column("processed_at", DateTime(timezone=True)),
        Column("handled_count", Integer, nullable=False, server_default=text("0")),
        #: Every header of a quarantined record, base64: [[name, value or null], ...].
        Column("raw_headers", JSONB),
    )
    # In id order, the lane a filter: the Handler's fetch reads it without a sort (0005).
    Index(
        "consumer_queue_pending",
        consumer.c.id,
        postgresql_where=text("processed_at IS NULL AND dead_at IS NULL"),
    )
    Index(
        "consumer_queue_retry",
        consumer.c.lane,
        consumer.c.key,
        postgresql_where=text("attempts > 0 AND processed_at IS NULL AND dead_at IS NULL"),
    )
    # The messages handled within the dedup window, out of consumer_queue (migration 0007):
    # the Handler deletes a handled row and records it here in the same transaction. `id`,
    # `key` and `lane` are the inbox row's (the operator tools' order per key).
    processed = Table(
        CONSUMER_PROCESSED,
        md,
        Column("message_id", Uuid, primary_key=True),
        Column("id", BigInteger, nullable=False),
        Column("topic", Text, nullable=False),
        Column("key", LargeBinary),
        Column("lane", SmallInteger, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column(
            "processed_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
        ),
        #: Committed handlings (the audit's "handled twice" is a value above 1).
        Column("handled_count", Integer, nullable=False, server_default=text("1")),
        #: Attempts of the message, the one that succeeded included.
        Column("attempts", Integer, nullable=False, server_default=text("1")),
    )
    Index("consumer_processed_at", processed.c.processed_at)
    #: The message ids `outbox serve` accepted (migration 0009): a publish retried over HTTP
    #: writes nothing twice.
    published = Table(
        HTTP_PUBLISHED,
        md,
        Column("message_id", Uuid, primary_key=True),
        Column(
            "published_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
        ),
    )
    Index("http_published_at", published.c.published_at)
    Table(
        RELAY_STATE,
        md,
        Column("relay_id", Text, primary_key=True),
        Column("queue", Text, nullable=False),
        Column("backend_pid", Integer, nullable=False),
        Column("sleeping", Boolean, nullable=False, server_default=text("false")),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
        #: With backend_pid, the relay's session exactly (a pid may be reused).
        Column("backend_start", DateTime(timezone=True)),
        #: Since when the relay is parked (idle, --idle-disconnect): listed, holding nothing.
        Column("parked_at", DateTime(timezone=True)),
    )
    return md
