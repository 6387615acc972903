"""The shipping service's business table, in its own database."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from sqlalchemy import DateTime, Identity, Integer, Uuid, create_engine, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox.postgres.migrate import sqlalchemy_url


class Base(DeclarativeBase):
    """Declarative base of the shipping service (its own metadata, its own database)."""


class Shipment(Base):
    """One shipment per order.

    Deliberately no unique constraint on `order_id`: the inbox alone keeps an order from
    being shipped twice, and a duplicate handling would show as a second row here.
    """

    __tablename__ = "shipments"

    id: Mapped[int] = mapped_column(Identity(), primary_key=True)
    order_id: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    #: The id of the `orders.created` message this shipment was made for.
    message_id: Mapped[UUID] = mapped_column(Uuid)


def create_schema(url: str) -> None:
    """Create the business tables (plain DDL; `outbox migrate` creates the outbox's own)."""
    engine = create_engine(sqlalchemy_url(url))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
