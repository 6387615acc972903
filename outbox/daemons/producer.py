"""The Producer relay: `producer_queue` -> Kafka.

Contract: a row is deleted only after its delivery report succeeded, so a crash at any point
re-sends at most the batch in hand (at-least-once; the inbox removes duplicates). Lanes, wake-ups
and reconnects are those of `LaneRelay`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.core.envelope import StoredMessage
from outbox.core.errors import ConfigurationError
from outbox.core.headers import from_json
from outbox.core.retry import Backoff
from outbox.daemons.failpoints import failpoint
from outbox.daemons.lanes import Connection, LaneRelay, new_relay_id
from outbox.kafka.publisher import KafkaPublisher, check_reachable, producer_config
from outbox.ports import DeliveryFailure, Publisher
from outbox.postgres.queries import validate_schema

log = logging.getLogger("outbox.producer")


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
    relay_id: str = field(default_factory=new_relay_id)

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ConfigurationError("database URL is not set (--database-url)")
        validate_schema(self.schema)
        if self.batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.poll_interval <= 0:
            raise ConfigurationError(f"poll_interval must be > 0, got {self.poll_interval}")


def _stored(row: tuple[Any, ...]) -> StoredMessage:
    id_, message_id, topic, key, payload, headers, content_type, created_at, attempts = row
    return StoredMessage(
        id=id_,
        message_id=message_id,
        topic=topic,
        key=key,
        payload=payload,
        content_type=content_type,
        headers=from_json(json.loads(headers)) if headers != "{}" else {},
        created_at=created_at,
        attempts=attempts,
    )


class Producer(LaneRelay[StoredMessage]):
    """Relays committed rows of `producer_queue` to Kafka until asked to stop."""

    table = "producer_queue"
    kind = "producer"

    def __init__(
        self,
        config: ProducerConfig,
        publisher_factory: Callable[[], Publisher] | None = None,
    ) -> None:
        super().__init__(
            database_url=config.database_url,
            schema=config.schema,
            poll_interval=config.poll_interval,
            rebalance_interval=config.rebalance_interval,
            connect_timeout=config.connect_timeout,
            relay_id=config.relay_id,
        )
        self.config = config
        self._publisher_factory = publisher_factory
        self._publisher: Publisher | None = None
        #: Counters for tests and logs: rows relayed, failed deliveries, rows marked dead.
        self.relayed = 0
        self.failed = 0
        self.dead = 0

    def check(self) -> None:
        """Fail fast, with one clear error, on an unreachable database or broker or old schema."""
        self.check_database()
        if self._publisher_factory is None:
            check_reachable(
                producer_config(self.config.kafka_bootstrap, self.config.kafka_config),
                timeout=self.config.connect_timeout,
            )

    def run(self) -> None:
        """Check, then relay until `stop()`."""
        self.check()
        if self._publisher_factory is None:
            config = producer_config(self.config.kafka_bootstrap, self.config.kafka_config)
            self._publisher = KafkaPublisher(config)
        else:
            self._publisher = self._publisher_factory()
        try:
            self.serve_forever()
        finally:
            self._publisher.close()
            log.info(
                "producer stopped: relayed=%d failed=%d dead=%d",
                self.relayed,
                self.failed,
                self.dead,
            )

    def fetch(self, conn: Connection, lanes: list[int]) -> list[StoredMessage]:
        rows = conn.execute(
            self.sql["producer_fetch"], {"lanes": lanes, "limit": self.config.batch_size}
        ).fetchall()
        return [_stored(r) for r in rows]

    def next_due(self, conn: Connection, lanes: list[int]) -> float | None:
        row = conn.execute(self.sql["producer_next_retry"], {"lanes": lanes}).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def process(self, conn: Connection, rows: Sequence[StoredMessage]) -> None:
        assert self._publisher is not None
        failpoint("producer.before_produce")
        results = self._publisher.publish(rows)
        failpoint("producer.after_produce")
        delivered = [m.id for m, r in zip(rows, results, strict=True) if r is None]
        failed = [(m, r) for m, r in zip(rows, results, strict=True) if r is not None]
        with conn.transaction():
            if delivered:
                conn.execute(self.sql["producer_delete"], {"ids": delivered})
            if failed:
                conn.execute(self.sql["producer_fail"], self._failure_params(failed))
        self.relayed += len(delivered)
        self.failed += len(failed)
        if failed:
            message, failure = failed[0]
            log.warning(
                "%d of %d deliveries failed; first: message %s topic %s: %s",
                len(failed),
                len(rows),
                message.message_id,
                message.topic,
                failure.error,
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
