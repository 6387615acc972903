"""Lane ownership in PostgreSQL: the relays' registry and the advisory locks of the lanes.

A relay owns a lane by holding the session advisory lock (lock class of its queue table, lane),
which dies with its connection. `daemons/relay.py` keeps the loop and the policy (how many lanes
to hold, when to sleep); this module runs the statements.
"""

from __future__ import annotations

import zlib
from typing import Any

from psycopg import sql as psql

from outbox.core.errors import ConfigurationError
from outbox.postgres.connection import Connection
from outbox.postgres.queries import channel, queries


def lock_class(schema: str, table: str) -> int:
    """The first key of the advisory locks of a queue table's lanes (the lane is the second)."""
    return zlib.crc32(f"{schema}.{table}".encode()) & 0x7FFFFFFF


class Lanes:
    """The statements of one relay on one queue table (`table`, relays of kind `kind`)."""

    def __init__(self, schema: str, table: str, kind: str, relay_id: str) -> None:
        self.schema = schema
        self.table = table
        self.sql = queries(schema)
        self.channel = channel(schema, table)
        self.lock_class = lock_class(schema, table)
        self._relay: dict[str, Any] = {"relay_id": relay_id, "queue": kind}
        self._lock = {"lock_class": self.lock_class}

    def check_lock_class(self, conn: Connection) -> None:
        """Raise ConfigurationError if another queue table of this database has this relay's
        lock class: their relays would take each other's lanes for their own."""
        for schema, table in conn.execute(self.sql["relay_queue_tables"]):
            if (schema, table) != (self.schema, self.table) and (
                lock_class(schema, table) == self.lock_class
            ):
                raise ConfigurationError(
                    f"the lanes of {self.schema}.{self.table} and {schema}.{table} would share "
                    f"the advisory lock class {self.lock_class} (a crc32 collision): rename "
                    "one of the schemas"
                )

    def join(self, conn: Connection, planner_settings: tuple[str, ...] = ()) -> None:
        """Register the relay, listen for its queue's wake-ups, and set the session's planner
        settings (`name = value`, from the store of the queue)."""
        self.check_lock_class(conn)
        conn.execute(self.sql["relay_forget_dead"])
        conn.execute(self.sql["relay_register"], self._relay)
        conn.execute(psql.SQL("LISTEN {}").format(psql.Identifier(self.channel)))
        for setting in planner_settings:
            name, value = (part.strip() for part in setting.split("=", 1))
            conn.execute(psql.SQL("SET {} = {}").format(psql.Identifier(name), psql.SQL(value)))

    def leave(self, conn: Connection, parked: bool = False) -> None:
        """Unregister the relay; a parked one stays listed as parked (`relay_park`)."""
        conn.execute(self.sql["relay_park" if parked else "relay_unregister"], self._relay)

    def parked_seen(self, conn: Connection) -> None:
        """A parked relay's look: its parked row is kept (or listed again)."""
        conn.execute(self.sql["relay_parked_seen"], self._relay)

    def set_sleeping(self, conn: Connection, sleeping: bool) -> None:
        """Announce (or end) the relay's nap: writers NOTIFY only while some relay sleeps."""
        conn.execute(self.sql["relay_set_sleeping"], {**self._relay, "sleeping": sleeping})

    def live_relays(self, conn: Connection) -> int:
        """The live relays of this kind (the dead ones forgotten first), at least 1."""
        conn.execute(self.sql["relay_forget_dead"])
        row = conn.execute(self.sql["relay_count"], {"queue": self._relay["queue"]}).fetchone()
        return max(1, int(row[0]) if row else 1)

    def held(self, conn: Connection) -> set[int]:
        """The lanes some relay holds now."""
        return {int(r[0]) for r in conn.execute(self.sql["relay_lanes_held"], self._lock)}

    def lock(self, conn: Connection, lane: int) -> bool:
        """Try to take `lane`; True if this session holds it now."""
        got = conn.execute(self.sql["relay_lane_lock"], {**self._lock, "lane": lane}).fetchone()
        return bool(got and got[0])

    def lock_each(self, conn: Connection, lanes: list[int]) -> list[int]:
        """Try to take each of `lanes` in one statement; those this session holds now, in
        the order given. Every lane given is tried (no LIMIT beside a locking function: what
        it locks is what it returns)."""
        if not lanes:
            return []
        rows = conn.execute(self.sql["relay_lanes_lock"], {**self._lock, "lanes": lanes})
        return [int(row[0]) for row in rows]

    def unlock(self, conn: Connection, lane: int) -> None:
        conn.execute(self.sql["relay_lane_unlock"], {**self._lock, "lane": lane})
