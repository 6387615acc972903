"""The typed topics `outbox serve --registry tests.integration.serve_contracts` validates."""

from __future__ import annotations

from dataclasses import dataclass

from outbox import Topic


@dataclass(frozen=True)
class Order:
    order_id: str
    quantity: int


orders = Topic("typed.orders", Order, key="order_id")
