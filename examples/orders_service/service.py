"""`place_order`: insert an order and send `orders.created` in one transaction."""

from __future__ import annotations

from decimal import Decimal
from uuid import UUID

from sqlalchemy.orm import Session

from examples.contracts import DEFAULT_TOPIC, TOPIC_ENV, OrderCreated, orders_created
from examples.orders_service.models import Order
from outbox import Broker

__all__ = ["DEFAULT_TOPIC", "TOPIC_ENV", "broker", "orders_topic", "place_order"]

broker = Broker()


def orders_topic() -> str:
    """The topic new orders are announced on: $ORDERS_TOPIC, default "orders.created"."""
    return orders_created().name


def place_order(session: Session, customer: str, total: Decimal) -> tuple[int, UUID]:
    """Insert an order and its `orders.created` message; return (order id, message id).

    Both are written in the session's transaction: the caller commits (both exist) or rolls
    back (neither ever existed). Nothing is sent to Kafka here; `outbox producer` relays the
    message after the commit.
    """
    order = Order(customer=customer, total=total)
    session.add(order)
    session.flush()  # assigns order.id
    # The key, f"order-{order.id}", comes from the Topic's declaration (examples/contracts.py).
    message_id = broker.send(
        session, orders_created(), OrderCreated(order_id=order.id, customer=customer, total=total)
    )
    return order.id, message_id
