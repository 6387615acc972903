"""The shipping service's handlers: `outbox handler examples.shipping_service.handlers:handlers`.

The topic is $ORDERS_TOPIC (default "orders.created"), read when this module is imported.
"""

from __future__ import annotations

import os

from sqlalchemy.orm import Session

from examples.shipping_service.models import Shipment
from outbox import Handlers, InboxMessage

TOPIC_ENV = "ORDERS_TOPIC"
TOPIC = os.environ.get(TOPIC_ENV) or "orders.created"

#: Callbacks get a SQLAlchemy Session whose transaction also marks the message processed.
handlers = Handlers(transaction="sqlalchemy")


@handlers.handler(TOPIC, max_attempts=5)
def ship_order(message: InboxMessage, session: Session) -> None:
    """Create the order's shipment; it commits together with "message processed", or not at all.

    No commit here, and no check for an existing shipment: the handler runner commits, and the
    inbox never runs this twice for one message id.
    """
    order = message.payload
    session.add(Shipment(order_id=int(order["order_id"]), message_id=message.id))
