"""Example services built on outbox; `./run demo` (`python -m examples.demo`) runs them end to end.

- `examples.orders_service`: places orders and sends `orders.created` through its outbox.
- `examples.shipping_service`: receives `orders.created` in its inbox and creates shipments.

Each has its own database; they share nothing but the Kafka topic. See examples/README.md.
"""
