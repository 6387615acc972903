"""Example services built on outbox; `./run demo` (`python -m examples.demo`) runs them end to end.

- `examples.orders_service`: places orders and sends `orders.created` through its outbox.
- `examples.shipping_service`: receives `orders.created` in its inbox and creates shipments.

- `examples.contracts`: `OrderCreated` and the `Topic` carrying it, imported by both.

Each has its own database; they share nothing but the Kafka topic and its declaration. See
examples/README.md.
"""
