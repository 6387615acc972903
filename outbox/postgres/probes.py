"""The statements of the daemons' probes (outbox.observability): does PostgreSQL answer, how
deep is a queue. They run on the probe thread's own connection, on a schedule, never per
message."""

from __future__ import annotations

from outbox.postgres.connection import Connection
from outbox.postgres.queries import queries


class ProbeStatements:
    """The probes' statements for one schema."""

    def __init__(self, schema: str) -> None:
        self.sql = queries(schema)

    def ping(self, conn: Connection) -> None:
        """Raise psycopg's error unless PostgreSQL answers on `conn`."""
        conn.execute(self.sql["obs_ping"])

    def queue_stats(self, conn: Connection, queue: str) -> tuple[int, float, int | None] | None:
        """The rows of `queue` (a queue table's name) waiting, not dead and not processed, the
        age in seconds of the oldest (0 when none waits) and, for the producer's queue, the dead
        rows kept in producer_dead (None for a queue without that count)."""
        row = conn.execute(self.sql[f"obs_{queue}_stats"]).fetchone()
        if row is None:
            return None
        dead = int(row[2]) if len(row) > 2 else None
        return int(row[0]), float(row[1]), dead
