"""A small pool of PostgreSQL connections for the server's worker threads."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from outbox.core.errors import OutboxError
from outbox.postgres.connection import Connection, connect


class Busy(OutboxError):
    """Every connection of a pool stayed in use for the whole wait: the server is overloaded."""


class Pool:
    """At most `size` autocommit connections to `url`, made when first needed. A connection
    that fails is closed rather than given back, so a restarted database costs one failed
    request per connection, not a stuck pool."""

    def __init__(self, url: str, size: int, application_name: str) -> None:
        self.url = url
        self.size = size
        self.application_name = application_name
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)

    @contextmanager
    def connection(self, wait: float = 10.0) -> Iterator[Connection]:
        """A connection for the block; `Busy` if none frees up within `wait` seconds."""
        if not self._slots.acquire(timeout=wait):
            raise Busy(f"all {self.size} database connections stayed busy for {wait:g} s")
        conn: Connection | None = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = connect(self.url, timeout=10, application_name=self.application_name)
            yield conn
        except BaseException:
            if conn is not None and (conn.closed or _broken(conn)):
                conn.close()
                conn = None
            raise
        finally:
            if conn is not None and not conn.closed:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()

    def close(self) -> None:
        """Close the idle connections."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def _broken(conn: Connection) -> bool:
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.UNKNOWN
