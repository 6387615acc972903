"""The Handler's settings, and the registry of callbacks it runs."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Self

from outbox.core.errors import ConfigurationError
from outbox.core.handlers import Handlers
from outbox.core.numbers import check_fields
from outbox.core.text import first_line
from outbox.daemons.compat import refuse_moved
from outbox.daemons.relay import new_relay_id


@dataclass(frozen=True)
class HandlerConfig:
    """The tuning of one Handler; validated at construction. The database it handles is the
    composition root's (`outbox.runtime.Settings`)."""

    concurrency: int = 4
    batch_size: int = 200
    poll_interval: float = 1.0
    rebalance_interval: float = 2.0
    #: Processed rows are kept this long (seconds) to recognise a redelivered message.
    dedup_window: float = 24 * 3600.0
    retention_interval: float = 5.0
    retention_batch: int = 5000
    #: Messages handled in one database transaction (a failure rolls it back and splits it).
    transaction_size: int = 500
    #: Longest a callback may run (seconds). Past it the callback's transaction is terminated
    #: (so nothing it wrote can commit), the attempt counts as failed, and the row is retried.
    lease: float = 300.0
    connect_timeout: float = 10.0
    relay_id: str = field(default_factory=new_relay_id)

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        refuse_moved(cls, args, kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_fields(
            self,
            {
                "concurrency": "threads",
                "batch_size": "count",
                "poll_interval": "seconds",
                "rebalance_interval": "seconds",
                "dedup_window": "seconds_or_zero",
                "retention_interval": "seconds_or_zero",
                "retention_batch": "count",
                "transaction_size": "count",
                "lease": "seconds",
                "connect_timeout": "seconds",
            },
        )


def check_async_support(handlers: Handlers) -> None:
    """ConfigurationError if the registry has async callbacks that receive a SQLAlchemy
    `AsyncSession` and SQLAlchemy's asyncio support cannot be imported (greenlet is missing on
    a plain install): every such message would fail the same way, which is the Handler's own
    failure, not an attempt of the message's (decision 15)."""
    if handlers.transaction != "sqlalchemy":
        return
    topics = [spec.topic for spec in handlers if spec.is_async]
    if not topics:
        return
    try:
        importlib.import_module("greenlet")
        importlib.import_module("sqlalchemy.ext.asyncio")
    except ImportError as exc:
        raise ConfigurationError(
            f"the async handlers of {', '.join(topics[:3])}"
            f"{' and more' if len(topics) > 3 else ''} receive a SQLAlchemy AsyncSession, which "
            f"needs SQLAlchemy's asyncio extra ({first_line(exc)}): "
            "pip install 'pg-kafka-outbox[sqlalchemy]'"
        ) from None
