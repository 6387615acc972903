"""`python -m examples.shipping_service`: the shipping service as a process, for docker-compose.yml.

Creates the `shipments` table (if missing), touches `--ready-file` (the compose healthcheck the
handler waits for), then prints how many shipments exist every `--every` seconds until SIGTERM.
The shipments themselves are made by `outbox handler examples.shipping_service.handlers:handlers`.

The database is `--database-url`, default $SHIPPING_DB (a libpq URL; the service's own setting,
not outbox's).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from sqlalchemy import create_engine, func, select

from examples.shipping_service.models import Shipment, create_schema
from outbox.postgres.migrate import sqlalchemy_url

DATABASE_ENV = "SHIPPING_DB"


def main(argv: Sequence[str] | None = None) -> int:
    """Create the schema, then report the shipments until stopped; 0 after SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m examples.shipping_service")
    parser.add_argument("--database-url", default=os.environ.get(DATABASE_ENV))
    parser.add_argument("--every", type=float, default=5.0, help="seconds between reports")
    parser.add_argument("--ready-file", type=Path, help="touched once the schema exists")
    parser.add_argument("--once", action="store_true", help="report once and exit")
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error(f"--database-url is required (or set {DATABASE_ENV})")

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # As PID 1 in a container, a signal without a handler would be ignored.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    create_schema(args.database_url)
    if args.ready_file is not None:
        args.ready_file.touch()
    engine = create_engine(sqlalchemy_url(args.database_url))
    try:
        while True:
            with engine.connect() as conn:
                count, last = conn.execute(select(func.count(), func.max(Shipment.order_id))).one()
            print(f"shipments: {count}, latest for order {last}", flush=True)
            if args.once or stop.wait(args.every):
                return 0
    finally:
        engine.dispose()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
