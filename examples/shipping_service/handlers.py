"""The shipping service's handlers: `outbox handler examples.shipping_service.handlers:handlers`.

The topic is $ORDERS_TOPIC (default "orders.created"), read when this module is imported.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from examples.contracts import TOPIC_ENV, OrderCreated, orders_created
from examples.shipping_service.models import Shipment
from outbox import Handlers, InboxMessage

__all__ = ["TOPIC", "TOPIC_ENV", "handlers", "ship_order"]

TOPIC = orders_created().name

#: Callbacks get a SQLAlchemy Session whose transaction also marks the message processed.
handlers = Handlers(transaction="sqlalchemy")


@handlers.handler(orders_created(), max_attempts=5)
def ship_order(message: InboxMessage[OrderCreated], session: Session) -> None:
    """Create the order's shipment; it commits together with "message processed", or not at all.

    No commit here, and no check for an existing shipment: the handler runner commits, and the
    inbox never runs this twice for one message id.
    """
    order = message.payload  # an OrderCreated, validated before this runs
    session.add(Shipment(order_id=order.order_id, message_id=message.id))
