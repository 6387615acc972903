"""How a service tests its own handler with the `outbox.testing` plugin: the docs' example.

Nothing here is specific to outbox's own test suite: a service's tests look like this, with
its own models and handlers in place of the example services'.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from examples.orders_service import create_schema as create_orders_schema
from examples.orders_service import place_order
from examples.shipping_service import create_schema as create_shipping_schema
from examples.shipping_service.handlers import handlers
from examples.shipping_service.models import Shipment
from outbox.postgres.migrate import sqlalchemy_url
from outbox.testing.plugin import Drain


@pytest.fixture
def session(outbox_database_url: str) -> Iterator[Session]:
    """A session on this test's database, with both services' tables."""
    create_orders_schema(outbox_database_url)
    create_shipping_schema(outbox_database_url)
    engine = create_engine(sqlalchemy_url(outbox_database_url))
    with Session(engine) as session:
        yield session
    engine.dispose()


def test_a_placed_order_is_shipped_once(session: Session, outbox_drain: Drain) -> None:
    order_id, message_id = place_order(session, "alice", Decimal("19.99"))
    session.commit()

    outbox_drain(handlers)

    shipments = session.scalars(select(Shipment)).all()
    assert [(s.order_id, s.message_id) for s in shipments] == [(order_id, message_id)]


def test_a_rolled_back_order_is_never_shipped(session: Session, outbox_drain: Drain) -> None:
    place_order(session, "bob", Decimal("5.00"))
    session.rollback()

    result = outbox_drain(handlers)

    assert session.scalars(select(Shipment)).all() == []
    assert (result.relayed, result.handled) == (0, 0)
