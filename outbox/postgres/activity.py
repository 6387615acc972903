"""Which of many databases saw writes, from their servers' statistics (`ports.ActivityWatch`).

A process serving many databases parks the relays of the quiet ones: they hold no connection.
Looking into each parked database for rows costs a connection per database per look, which
for hundreds of databases is a connection storm that slows every connect of the server. This
watch asks each server once per look instead: `pg_stat_database` counts, per database, the rows
inserted (`tup_inserted`), and a `send` (or the consumer's insert into its inbox) is an insert
there. A database whose count moved gets its relay woken to look; the others stay parked.

- One connection per server (the settings of the databases' URLs but the database name), kept
  between looks and dropped after a failure. It connects to the server's `postgres` database,
  so that it never holds a tenant's database (which `DROP DATABASE` would refuse while it is
  connected), and to the first database of the server listed when `postgres` refuses it.
- A backend reports its counts when its transaction ends, at most once a second (PostgreSQL
  15), and the first transaction after a quiet second at once: the watch sees a write to a quiet
  database within about a look's interval. A write to another table of the database moves the
  count too: its relay looks and finds nothing, as its own schedule would have.
- With `track_counts` off the counts never move: the server's databases are reported as not
  watched, and their relays keep looking on their own schedule.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from outbox.core.databases import Database
from outbox.core.redact import redact_text
from outbox.core.text import first_line
from outbox.postgres.connection import Connection, connect

log = logging.getLogger("outbox.supervisor")

#: The server's maintenance database, the watch's first choice of a database to connect to.
MAINTENANCE_DATABASE = "postgres"

ServerKey = tuple[tuple[str, str], ...]


def _server(url: str) -> tuple[ServerKey, str] | None:
    """The key of a URL's server (its settings but the database name) and the name of its
    database as libpq would choose it; None when libpq cannot parse it."""
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except psycopg.Error:
        return None
    name = params.pop("dbname", "")
    if not name:  # libpq's default: PGDATABASE, else the user (PGUSER, else the login)
        defaults = {o.keyword.decode(): o.val.decode() for o in pq.Conninfo.get_defaults() if o.val}
        name = defaults.get("dbname") or params.get("user") or defaults.get("user", "")
    params.pop("application_name", None)
    return tuple(sorted(params.items())), name


def _names(names: list[str], limit: int = 5) -> str:
    """`a, b, c` for a log line, at most `limit` named."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class _Server:
    """One server's connection and the counts of its databases at the last look."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.conn: Connection | None = None
        self.counts: dict[str, int] = {}
        self.tracking = True

    def connection(self, timeout: float) -> Connection:
        if self.conn is not None and not self.conn.closed and not self.conn.broken:
            return self.conn
        self.close()
        try:  # the maintenance database, then the first listed when that one is refused
            conn = connect(
                self.urls[0],
                timeout=timeout,
                application_name="outbox-activity",
                dbname=MAINTENANCE_DATABASE,
            )
        except psycopg.OperationalError:
            conn = connect(self.urls[0], timeout=timeout, application_name="outbox-activity")
        setting = conn.execute("SELECT current_setting('track_counts')").fetchone()
        self.tracking = setting is not None and setting[0] == "on"
        self.conn = conn
        return conn

    def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            with contextlib.suppress(psycopg.Error):
                conn.close()


class PostgresActivity:
    """The watch over the servers of the databases it is asked about (see the module)."""

    def __init__(self, connect_timeout: float) -> None:
        self.connect_timeout = connect_timeout
        self._servers: dict[ServerKey, _Server] = {}
        self._failing: set[ServerKey] = set()

    def changed(self, databases: Sequence[Database]) -> dict[str, bool]:
        by_server: dict[ServerKey, list[tuple[Database, str]]] = {}
        for database in databases:
            found = _server(database.url)
            if found is not None:
                by_server.setdefault(found[0], []).append((database, found[1]))
        answer: dict[str, bool] = {}
        for key, listed in by_server.items():
            server = self._servers.get(key)
            if server is None:
                server = self._servers[key] = _Server([d.url for d, _ in listed])
            try:
                counts = self._counts(server, sorted({name for _, name in listed}))
            except psycopg.Error as exc:
                server.close()
                if key not in self._failing:
                    self._failing.add(key)
                    log.info(
                        "cannot watch the activity of databases %s (their parked relays look "
                        "on their own schedule): %s",
                        _names([d.name for d, _ in listed]),
                        redact_text(first_line(exc)),
                    )
                continue
            self._failing.discard(key)
            if not server.tracking:
                continue
            for database, name in listed:
                now = counts.get(name)
                if now is None:
                    continue
                before = server.counts.get(name)
                answer[database.name] = before is not None and now != before
            server.counts.update(counts)
        return answer

    def _counts(self, server: _Server, names: list[str]) -> dict[str, int]:
        conn = server.connection(self.connect_timeout)
        if not server.tracking:
            return {}
        rows = conn.execute(
            "SELECT datname, tup_inserted FROM pg_stat_database WHERE datname = ANY(%s)",
            (names,),
        ).fetchall()
        return {str(name): int(count) for name, count in rows}

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
