"""The orders service: an `orders` table and `place_order`, which announces each new order.

`place_order` inserts the order and writes the `orders.created` message in the same
transaction, with the caller's SQLAlchemy Session: the message exists if and only if the
order commits. The `outbox producer` daemon, run against this service's database, relays it
to Kafka.
"""

from examples.orders_service.models import Base, Order, create_schema
from examples.orders_service.service import (
    DEFAULT_TOPIC,
    TOPIC_ENV,
    broker,
    orders_topic,
    place_order,
)

__all__ = [
    "DEFAULT_TOPIC",
    "TOPIC_ENV",
    "Base",
    "Order",
    "broker",
    "create_schema",
    "orders_topic",
    "place_order",
]
