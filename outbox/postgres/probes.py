"""The daemons' readiness probe of a PostgreSQL database (`outbox.ports.DatabaseProbe`): does it
answer, how deep is a queue. Its statements run on the probe thread's own connection, on a
schedule, never per message; the composition root hands it to outbox.observability."""

from __future__ import annotations

import psycopg

from outbox.core.databases import Database
from outbox.core.errors import DatabaseUnavailable
from outbox.core.redact import redact_text
from outbox.core.text import first_line
from outbox.ports import QueueStats
from outbox.postgres.connection import Connection, connect
from outbox.postgres.queries import queries


class PostgresProbe:
    """The probe of one database and schema: one connection, kept between calls and dropped
    after a failure."""

    name = "postgres"
    label = "PostgreSQL"

    def __init__(self, database: Database, *, application_name: str = "outbox-probe") -> None:
        self.database = database
        self._sql = queries(database.schema)
        self._application_name = application_name
        self._conn: Connection | None = None

    def _connection(self, timeout: float) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect(
                self.database.url, timeout=timeout, application_name=self._application_name
            )
        return self._conn

    def check(self, timeout: float) -> None:
        """Raise `DatabaseUnavailable` unless PostgreSQL answers."""
        try:
            self._connection(timeout).execute(self._sql["obs_ping"])
        except psycopg.Error as exc:
            self.close()
            raise DatabaseUnavailable(redact_text(first_line(exc))) from None

    def queue_stats(self, queue: str, timeout: float) -> QueueStats | None:
        """The rows of `queue` waiting, the age in seconds of the oldest (0 when none waits)
        and, for the producer's queue, the dead rows kept in producer_dead (None for a queue
        without that count), then the messages due later (producer_scheduled), the overdue
        ones and how late the most overdue is."""
        try:
            row = self._connection(timeout).execute(self._sql[f"obs_{queue}_stats"]).fetchone()
        except psycopg.Error as exc:
            self.close()
            raise DatabaseUnavailable(redact_text(first_line(exc))) from None
        if row is None:
            return None
        dead = int(row[2]) if len(row) > 2 else None
        if len(row) > 5:
            return int(row[0]), float(row[1]), dead, int(row[3]), int(row[4]), float(row[5])
        return int(row[0]), float(row[1]), dead

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
