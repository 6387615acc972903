"""`place_order`: insert an order and send `orders.created` in one transaction."""

from __future__ import annotations

import os
from decimal import Decimal
from uuid import UUID

from sqlalchemy.orm import Session

from examples.orders_service.models import Order
from outbox import Broker

#: The topic can be renamed through this environment variable (the tests use their own).
TOPIC_ENV = "ORDERS_TOPIC"
DEFAULT_TOPIC = "orders.created"

broker = Broker()


def orders_topic() -> str:
    """The topic new orders are announced on: $ORDERS_TOPIC, default "orders.created"."""
    return os.environ.get(TOPIC_ENV) or DEFAULT_TOPIC


def place_order(session: Session, customer: str, total: Decimal) -> tuple[int, UUID]:
    """Insert an order and its `orders.created` message; return (order id, message id).

    Both are written in the session's transaction: the caller commits (both exist) or rolls
    back (neither ever existed). Nothing is sent to Kafka here; `outbox producer` relays the
    message after the commit.
    """
    order = Order(customer=customer, total=total)
    session.add(order)
    session.flush()  # assigns order.id
    message_id = broker.send(
        session,
        orders_topic(),
        {"order_id": order.id, "customer": customer, "total": str(total)},
        key=f"order-{order.id}",  # all messages of one order keep their order on Kafka
    )
    return order.id, message_id
