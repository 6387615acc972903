"""The Producer relay: `producer_queue` -> Kafka.

Contract: a row is deleted only after its delivery report succeeded, so a crash at any point
re-sends at most the batch in hand (at-least-once; the inbox removes duplicates). Each relay owns
a set of lanes through PostgreSQL session advisory locks, which die with its connection; within a
lane rows go out in id order, so several relays keep per-key order.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from tenacity import Retrying, retry_if_exception_type, wait_exponential

from outbox.core.envelope import StoredMessage
from outbox.core.errors import ConfigurationError, DatabaseUnavailable
from outbox.core.headers import from_json
from outbox.core.lanes import LANES
from outbox.core.retry import Backoff
from outbox.kafka.publisher import KafkaPublisher, check_reachable, producer_config
from outbox.ports import DeliveryFailure, Publisher
from outbox.postgres.migrate import check_schema
from outbox.postgres.queries import channel, queries, quote_ident, validate_schema

log = logging.getLogger("outbox.producer")

#: After going idle the relay polls again after these delays (seconds) before settling on the
#: poll interval; this bounds the delay of a message whose NOTIFY was skipped or lost.
IDLE_POLLS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of one Producer relay process; validated at construction."""

    database_url: str
    kafka_bootstrap: str = ""
    schema: str = "outbox"
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    batch_size: int = 1000
    poll_interval: float = 1.0
    rebalance_interval: float = 2.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.5, maximum=30.0))
    connect_timeout: float = 10.0
    relay_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        if self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.poll_interval <= 0:
            raise ConfigurationError(f"poll_interval must be > 0, got {self.poll_interval}")


def _lock_class(schema: str) -> int:
    """The advisory-lock class id of the producer lanes of one schema (a signed int4)."""
    value = zlib.crc32(f"{schema}.producer_queue".encode()) & 0x7FFFFFFF
    return value


def _stored(row: tuple[Any, ...]) -> StoredMessage:
    id_, message_id, topic, key, payload, headers, content_type, created_at, attempts = row
    return StoredMessage(
        id=id_,
        message_id=message_id,
        topic=topic,
        key=key,
        payload=payload,
        content_type=content_type,
        headers=from_json(headers),
        created_at=created_at,
        attempts=attempts,
    )


class Producer:
    """Relays committed rows of `producer_queue` to Kafka until asked to stop."""

    def __init__(
        self,
        config: ProducerConfig,
        publisher_factory: Callable[[], Publisher] | None = None,
    ) -> None:
        self.config = config
        self._sql = queries(config.schema)
        self._channel = channel(config.schema, "producer_queue")
        self._lock_class = _lock_class(config.schema)
        self._stop = threading.Event()
        self._publisher_factory = publisher_factory or self._kafka_publisher
        self._publisher: Publisher | None = None
        self._lanes: set[int] = set()
        self._next_rebalance = 0.0
        #: Counters for tests and status: rows relayed, failed deliveries, rows marked dead.
        self.relayed = 0
        self.failed = 0
        self.dead = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def _kafka_publisher(self) -> Publisher:
        config = producer_config(self.config.kafka_bootstrap, self.config.kafka_config)
        return KafkaPublisher(config)

    def stop(self) -> None:
        """Ask the relay to finish the batch in hand and return from `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(
            self.config.database_url,
            autocommit=True,
            row_factory=tuple_row,
            connect_timeout=max(1, int(self.config.connect_timeout)),
            application_name="outbox-producer",
        )

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or broker or old schema."""
        try:
            conn = self._connect()
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL: {str(exc).strip().splitlines()[0]}"
            ) from None
        with conn:
            check_schema(conn, self.config.schema)
        if self._publisher_factory == self._kafka_publisher:
            check_reachable(
                producer_config(self.config.kafka_bootstrap, self.config.kafka_config),
                timeout=self.config.connect_timeout,
            )

    def run(self) -> None:
        """Relay until `stop()`; reconnect to PostgreSQL with backoff whenever it drops."""
        self.check()
        self._publisher = self._publisher_factory()
        try:
            while not self.stopping:
                try:
                    conn = self._connect_retrying()
                except psycopg.OperationalError:
                    break  # only raised once stopping
                try:
                    with conn:
                        self._serve(conn)
                except psycopg.OperationalError as exc:
                    log.warning("lost the database connection (%s); reconnecting", exc)
                    self._lanes.clear()
        finally:
            self._publisher.close()
            log.info(
                "producer stopped: relayed=%d failed=%d dead=%d",
                self.relayed,
                self.failed,
                self.dead,
            )

    def _connect_retrying(self) -> psycopg.Connection[tuple[Any, ...]]:
        """Connect, retrying with capped exponential backoff until connected or stopped."""
        for attempt in Retrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            wait=wait_exponential(multiplier=0.1, max=5),
            stop=lambda _state: self.stopping,
            reraise=True,
            before_sleep=lambda state: log.warning(
                "cannot reach PostgreSQL (attempt %d): %s",
                state.attempt_number,
                state.outcome.exception() if state.outcome else "",
            ),
        ):
            with attempt:
                return self._connect()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the loop ------------------------------------------------------------------------------

    def _serve(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        sql = self._sql
        relay = {"relay_id": self.config.relay_id, "queue": "producer"}
        conn.execute(sql["relay_forget_dead"])
        conn.execute(sql["relay_register"], relay)
        conn.execute(f"LISTEN {quote_ident(self._channel)}")
        self._lanes.clear()
        self._next_rebalance = 0.0
        sleeping = False
        idle_step = 0
        try:
            while not self.stopping:
                self._rebalance(conn)
                rows = self._fetch(conn)
                if rows:
                    if sleeping:
                        conn.execute(sql["relay_set_sleeping"], {**relay, "sleeping": False})
                        sleeping = False
                    idle_step = 0
                    self._relay(conn, rows)
                    continue
                if not sleeping:
                    # Announce the nap, then look once more: a row committed before the flag
                    # was visible to its writer would otherwise wait for the next poll.
                    conn.execute(sql["relay_set_sleeping"], {**relay, "sleeping": True})
                    sleeping = True
                    continue
                self._wait(conn, self._idle_timeout(conn, idle_step))
                idle_step += 1
        finally:
            if not conn.closed:
                conn.execute(sql["relay_unregister"], relay)

    def _idle_timeout(self, conn: psycopg.Connection[tuple[Any, ...]], step: int) -> float:
        timeout = IDLE_POLLS[step] if step < len(IDLE_POLLS) else self.config.poll_interval
        timeout = min(timeout, self.config.poll_interval)
        if self._lanes:
            row = conn.execute(
                self._sql["producer_next_retry"], {"lanes": sorted(self._lanes)}
            ).fetchone()
            if row and row[0] is not None:
                timeout = max(0.0, min(timeout, float(row[0])))
        return timeout

    def _wait(self, conn: psycopg.Connection[tuple[Any, ...]], timeout: float) -> None:
        """Sleep until a NOTIFY, `timeout` or stop, whichever comes first."""
        deadline = time.monotonic() + timeout
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # Short slices keep SIGTERM prompt; a notification ends the wait at once. (Do not
            # nest notifies() calls: the generator holds the connection lock while suspended.)
            for _ in conn.notifies(timeout=min(remaining, 0.2), stop_after=1):
                return

    def _rebalance(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Hold a fair share of the lanes: ceil(LANES / live relays)."""
        now = time.monotonic()
        if now < self._next_rebalance:
            return
        self._next_rebalance = now + self.config.rebalance_interval
        conn.execute(self._sql["relay_forget_dead"])
        row = conn.execute(self._sql["relay_count"], {"queue": "producer"}).fetchone()
        relays = max(1, int(row[0]) if row else 1)
        target = math.ceil(LANES / relays)
        if len(self._lanes) > target:
            for lane in sorted(self._lanes)[target:]:
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", (self._lock_class, lane))
                self._lanes.discard(lane)
        elif len(self._lanes) < target:
            held = {
                r[0]
                for r in conn.execute(
                    "SELECT objid::int FROM pg_locks WHERE locktype = 'advisory' "
                    "AND classid::int = %s AND objsubid = 2 AND granted",
                    (self._lock_class,),
                )
            }
            free = [lane for lane in range(LANES) if lane not in held]
            random.shuffle(free)
            for lane in free:
                if len(self._lanes) >= target:
                    break
                got = conn.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", (self._lock_class, lane)
                ).fetchone()
                if got and got[0]:
                    self._lanes.add(lane)

    def _fetch(self, conn: psycopg.Connection[tuple[Any, ...]]) -> list[StoredMessage]:
        if not self._lanes:
            return []
        rows = conn.execute(
            self._sql["producer_fetch"],
            {"lanes": sorted(self._lanes), "limit": self.config.batch_size},
        ).fetchall()
        return [_stored(r) for r in rows]

    def _relay(self, conn: psycopg.Connection[tuple[Any, ...]], rows: list[StoredMessage]) -> None:
        assert self._publisher is not None
        results = self._publisher.publish(rows)
        delivered = [m.id for m, r in zip(rows, results, strict=True) if r is None]
        failed = [(m, r) for m, r in zip(rows, results, strict=True) if r is not None]
        with conn.transaction():
            if delivered:
                conn.execute(self._sql["producer_delete"], {"ids": delivered})
            if failed:
                conn.execute(self._sql["producer_fail"], self._failure_params(failed))
        self.relayed += len(delivered)
        self.failed += len(failed)
        if failed:
            first = failed[0]
            log.warning(
                "%d of %d deliveries failed; first: message %s topic %s: %s",
                len(failed),
                len(rows),
                first[0].message_id,
                first[0].topic,
                first[1].error,
            )
        log.debug("relayed %d messages", len(delivered))

    def _failure_params(
        self, failed: list[tuple[StoredMessage, DeliveryFailure]]
    ) -> dict[str, Any]:
        delays: list[float | None] = []
        for message, failure in failed:
            if failure.permanent:
                delays.append(None)
                self.dead += 1
            else:
                delays.append(self.config.backoff.delay(message.attempts + 1))
        return {
            "ids": [m.id for m, _ in failed],
            "errors": [f.error for _, f in failed],
            "delays": delays,
        }
