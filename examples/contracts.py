"""What the orders service sends and the shipping service reads, declared once.

Both services import this module: the orders service sends `OrderCreated` on `orders_created()`,
the shipping service registers its handler for the same Topic and gets an `OrderCreated` back,
validated. A dataclass, so the example needs no extra (a pydantic model works the same way:
docs/how-to/typed-messages.md).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from decimal import Decimal

from outbox import Topic

#: The topic can be renamed through this environment variable (the tests use their own).
TOPIC_ENV = "ORDERS_TOPIC"
DEFAULT_TOPIC = "orders.created"


@dataclass(frozen=True)
class OrderCreated:
    """A new order was placed (its transaction committed)."""

    order_id: int
    customer: str
    total: Decimal  # sent as a string: "12.99", no digit lost


def orders_created() -> Topic[OrderCreated]:
    """The topic new orders are announced on: $ORDERS_TOPIC, default "orders.created"."""
    return _topic(os.environ.get(TOPIC_ENV) or DEFAULT_TOPIC)


@functools.cache
def _topic(name: str) -> Topic[OrderCreated]:
    return Topic(
        name,
        OrderCreated,
        # All messages of one order keep their order on Kafka.
        key=lambda order: f"order-{order.order_id}",
        description="An order was placed.",
    )
