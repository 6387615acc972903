"""The shipping service: ships each order announced on `orders.created`, exactly once.

`outbox consumer` stores the topic's messages in this service's inbox (`consumer_queue`,
in its own database); `outbox handler examples.shipping_service.handlers:handlers` runs
`ship_order` for each, in the transaction that marks the message processed.
"""

from examples.shipping_service.models import Base, Shipment, create_schema

__all__ = ["Base", "Shipment", "create_schema"]
