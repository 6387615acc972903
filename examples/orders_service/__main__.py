"""`python -m examples.orders_service`: the orders service as a process, for docker-compose.yml.

Creates the `orders` table (if missing), then places an order every `--every` seconds until
SIGTERM (or `--count` orders). Every 4th payment is "declined": that transaction rolls back, so
neither the order nor its `orders.created` message ever existed. The outbox tables come from
`outbox migrate`; `outbox producer` relays the messages.

The database is `--database-url`, default $ORDERS_DB (a libpq URL; the service's own setting,
not outbox's).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from decimal import Decimal
from types import FrameType

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from examples.orders_service.models import create_schema
from examples.orders_service.service import place_order
from outbox.postgres.migrate import sqlalchemy_url

DATABASE_ENV = "ORDERS_DB"
CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")


def main(argv: Sequence[str] | None = None) -> int:
    """Place orders until stopped; 0 after SIGTERM or `--count` orders."""
    parser = argparse.ArgumentParser(prog="python -m examples.orders_service")
    parser.add_argument("--database-url", default=os.environ.get(DATABASE_ENV))
    parser.add_argument("--every", type=float, default=1.0, help="seconds between orders")
    parser.add_argument("--count", type=int, default=0, help="stop after N orders (0: never)")
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error(f"--database-url is required (or set {DATABASE_ENV})")

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # As PID 1 in a container, a signal without a handler would be ignored.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    create_schema(args.database_url)
    engine = create_engine(sqlalchemy_url(args.database_url))
    placed = 0
    try:
        while not stop.is_set() and (args.count == 0 or placed < args.count):
            placed += 1
            customer = CUSTOMERS[placed % len(CUSTOMERS)]
            total = Decimal(10 + placed % 90) + Decimal("0.99")
            with Session(engine) as session:
                order_id, message_id = place_order(session, customer, total)
                if placed % 4 == 0:
                    session.rollback()
                    print(f"order {order_id} for {customer}: payment declined, rolled back")
                else:
                    session.commit()
                    print(f"order {order_id} for {customer}: committed, message {message_id}")
            sys.stdout.flush()
            stop.wait(args.every)
    finally:
        engine.dispose()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
