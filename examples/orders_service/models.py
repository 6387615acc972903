"""The orders service's business table, in its own database."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import DateTime, Identity, Numeric, String, create_engine, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox.postgres.migrate import sqlalchemy_url


class Base(DeclarativeBase):
    """Declarative base of the orders service (its own metadata, its own database)."""


class Order(Base):
    """One customer order."""

    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(Identity(), primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    total: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


def create_schema(url: str) -> None:
    """Create the business tables (plain DDL; `outbox migrate` creates the outbox's own)."""
    engine = create_engine(sqlalchemy_url(url))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
