"""What a daemon does besides its work: startup line, per-batch log lines, metrics, health.

Each daemon owns one `Observability`, built from its config. `@observed` on the daemon's `run()`
serves metrics and health while it runs and logs the effective configuration (secrets masked)
at start. The daemon calls one `*_batch` method per batch; that updates the metrics and writes
the batch's INFO line with per-topic counts. A probe thread, started only when metrics or
health are on, checks PostgreSQL (and Kafka for the producer and consumer) for `/readyz` and
refreshes the queue gauges with one cheap query, never per message.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import psycopg

from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.numbers import check_fields
from outbox.core.redact import (
    redact_settings,
    redact_text,
    redact_url,
    remember_secrets,
    secrets_of_settings,
    secrets_of_url,
)
from outbox.core.text import first_line
from outbox.observability.health import HealthServer, HealthState, Heartbeat
from outbox.observability.logs import topic_summary
from outbox.observability.metrics import (
    HandlerTally,
    Kind,
    Metrics,
    PrometheusMetrics,
)
from outbox.ports import DeliveryFailure, TransportProbe
from outbox.postgres.connection import Connection, connect
from outbox.postgres.probes import ProbeStatements

#: Default bind address of the metrics and health servers: every interface, so that a
#: Prometheus server or a kubelet on another host reaches them. Use 127.0.0.1 on shared hosts.
DEFAULT_HOST = "0.0.0.0"

log = logging.getLogger("outbox.observability")

#: The queue table each daemon's gauges describe.
QUEUE_OF: dict[Kind, str] = {
    "producer": "producer_queue",
    "consumer": "consumer_queue",
    "handler": "consumer_queue",
}


@dataclass(frozen=True)
class ObservabilityConfig:
    """Metrics and health settings of one daemon; both servers are off unless given a port."""

    #: Serve Prometheus metrics on this port (0: any free port); None: no metrics.
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_HOST
    #: Serve /livez and /readyz on this port (0: any free port); None: no health server.
    health_port: int | None = None
    health_host: str = DEFAULT_HOST
    #: /livez fails when the main loop made no progress for this long (seconds). Keep it above
    #: librdkafka's message.timeout.ms (a producer batch may wait that long for its reports).
    liveness_timeout: float = 120.0
    #: Seconds between dependency checks for /readyz, and the timeout of each check.
    probe_interval: float = 5.0
    probe_timeout: float = 3.0
    #: Seconds between refreshes of the queue depth and oldest-age gauges.
    stats_interval: float = 15.0
    #: Start-up of the daemon process (kept here, beside its other process settings): how
    #: long to wait for PostgreSQL to accept connections before exiting; 0: fail at once.
    wait_for_database: float = 0.0
    #: The transport settings in force that the daemon's config does not hold (`transport`,
    #: and for the PostgreSQL log `log_url`, `log_schema`, ...), for the start-up line only.
    transport: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        check_fields(
            self,
            {
                "metrics_port": "port",
                "health_port": "port",
                "liveness_timeout": "seconds",
                "probe_interval": "seconds",
                "probe_timeout": "seconds",
                "stats_interval": "seconds",
                "wait_for_database": "seconds_or_zero",
            },
            optional=("metrics_port", "health_port"),
        )
        if self.metrics_port is not None and self.metrics_port == self.health_port != 0:
            raise ConfigurationError(
                f"metrics and health need different ports, both are {self.metrics_port}"
            )

    @property
    def probing(self) -> bool:
        """Whether anything needs the probe thread."""
        return self.metrics_port is not None or self.health_port is not None


class DaemonConfig(Protocol):
    """What `Observability` reads from a daemon's config dataclass."""

    @property
    def database_url(self) -> str: ...
    @property
    def schema(self) -> str: ...
    @property
    def observability(self) -> ObservabilityConfig: ...


class Topical(Protocol):
    """A message or row with a topic."""

    @property
    def topic(self) -> str: ...


@functools.cache
def _version() -> str:
    from outbox._version import version

    return version()


def describe(config: Any) -> dict[str, Any]:
    """A daemon config dataclass as plain, loggable values, secrets masked."""
    described: dict[str, Any] = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if item.name in ("database_url", "log_url") and isinstance(value, str):
            described[item.name] = redact_url(value)
        elif item.name == "transport" and isinstance(value, Mapping):
            described.update(describe_transport(value))
        elif isinstance(value, Mapping):
            described[item.name] = redact_settings(value)
        elif dataclasses.is_dataclass(value) and item.name == "observability":
            described.update(describe(value))
        elif value is None or isinstance(value, str | int | float | bool):
            described[item.name] = redact_text(value) if isinstance(value, str) else value
        elif isinstance(value, list | tuple):
            described[item.name] = [str(v) for v in value]
        else:
            described[item.name] = redact_text(repr(value))
    return described


def describe_transport(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`ObservabilityConfig.transport` as loggable values: the log database's URL redacted."""
    return {
        key: redact_url(value)
        if key == "log_url" and isinstance(value, str)
        else (redact_text(value) if isinstance(value, str) else value)
        for key, value in settings.items()
    }


def kafka_in_force(kind: str, config: Any) -> dict[str, Any] | None:
    """The librdkafka settings the Kafka client of a producer or consumer daemon is made with:
    outbox's defaults, the user's, and the ones outbox forces; None for a daemon without one.
    Not masked (see `redact_settings`)."""
    bootstrap = getattr(config, "kafka_bootstrap", "")
    if kind not in ("producer", "consumer") or not bootstrap:
        return None
    from outbox.kafka.publisher import producer_config
    from outbox.kafka.start import split_start
    from outbox.kafka.subscriber import consumer_config

    user, _ = split_start(config.kafka_config)
    try:
        settings = (
            producer_config(bootstrap, user)
            if kind == "producer"
            else consumer_config(bootstrap, config.group, user)
        )
    except ConfigurationError:
        return None  # the client refuses them with this error when it is made
    settings.pop("logger", None)
    return settings


def _as_text(described: Mapping[str, Any]) -> str:
    parts = []
    for key, value in described.items():
        if isinstance(value, str) and value and " " not in value:
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={json.dumps(value, separators=(',', ':'), default=str)}")
    return " ".join(parts)


class Observability:
    """Startup line, batch lines, metrics and health of one daemon."""

    def __init__(
        self,
        kind: Kind,
        config: DaemonConfig,
        *,
        heartbeat: Heartbeat,
        relay_id: str,
        transport: TransportProbe | None = None,
        lanes: Callable[[], int] | None = None,
        databases: Callable[[], Sequence[Database]] | None = None,
    ) -> None:
        self.kind = kind
        #: A daemon serving several databases: the databases it serves now. Its metrics label
        #: each database's series (`for_database`), its start-up line lists them, and its
        #: probes check the transport only (each database's state is watched, see `health`).
        self.databases = databases
        #: The NAME of the database of one relay among several: its batch lines say it.
        self.database: str | None = None
        self.daemon_config = config
        self.config = config.observability
        self.heartbeat = heartbeat
        self.relay_id = relay_id
        self.metrics_lanes = lanes
        self._transport = transport
        self._log = logging.getLogger(f"outbox.{kind}")
        remember_secrets(secrets_of_url(config.database_url))
        remember_secrets(secrets_of_settings(getattr(config, "kafka_config", {}) or {}))
        self.metrics: Metrics = Metrics()
        if self.config.metrics_port is not None:
            info = {
                "daemon": kind,
                "relay_id": relay_id,
                "schema": config.schema,
                "version": _version(),
            }
            if databases is not None and lanes is None and kind != "consumer":
                lanes = _no_lanes
            self.metrics = PrometheusMetrics(
                kind,
                info,
                progress_age=heartbeat.age,
                lanes=lanes,
                per_database=databases is not None,
            )
        self.health = HealthState(
            heartbeat=heartbeat,
            liveness_timeout=self.config.liveness_timeout,
            check_expiry=3 * self.config.probe_interval + 2 * self.config.probe_timeout,
        )
        self.health_server: HealthServer | None = None
        self._probes: _Probes | None = None

    def for_database(self, observability: Observability, name: str) -> None:
        """Make `observability` (of one relay among several) report into this one's metrics
        as database `name`, and name it in its batch lines."""
        observability.database = name
        if isinstance(self.metrics, PrometheusMetrics):
            lanes = observability.metrics_lanes
            observability.metrics = self.metrics.for_database(name, lanes)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def metrics_port(self) -> int | None:
        """The port metrics are served on while running (None when off)."""
        return self.metrics.port

    @property
    def health_port(self) -> int | None:
        """The port health is served on while running (None when off)."""
        return self.health_server.port if self.health_server is not None else None

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Serve metrics and health and run the probe thread; log the startup line first."""
        config = self.config
        try:
            if config.metrics_port is not None:
                self.metrics.serve(config.metrics_host, config.metrics_port)
            if config.health_port is not None:
                self.health_server = HealthServer(
                    self.health, config.health_host, config.health_port
                )
                self.health_server.start()
            self._log_startup()
            if config.probing:
                self._probes = _Probes(self)
                self._probes.start()
            self.health.running = True
            yield
        finally:
            self.health.stopping = True
            if self._probes is not None:
                self._probes.stop()
            if self.health_server is not None:
                self.health_server.stop()
            self.metrics.close()

    def _log_startup(self) -> None:
        """The effective configuration: every setting in force, secrets masked; for Kafka every
        librdkafka setting of the client (`kafka_config`), outbox's forced ones included."""
        described = {
            "relay_id": self.relay_id,
            **describe_transport(self.config.transport),  # first in the line
            **describe(self.daemon_config),
        }
        if self.databases is not None:
            described.pop("database_url", None)
            described.pop("schema", None)
            described["databases"] = [database.describe() for database in self.databases()]
        kafka = kafka_in_force(self.kind, self.daemon_config)
        if kafka is not None:
            from outbox.kafka.start import START_KEY

            start = self.daemon_config.kafka_config.get(START_KEY)  # type: ignore[attr-defined]
            described["kafka_config"] = redact_settings(kafka)
            if start is not None:
                described["start"] = start
        elif not described.get("kafka_bootstrap"):
            # Not on Kafka (the log transport leaves the daemon's Kafka fields empty).
            described.pop("kafka_bootstrap", None)
            described.pop("kafka_config", None)
        if self.metrics_port is not None:
            described["metrics"] = f"http://{self.config.metrics_host}:{self.metrics_port}/metrics"
        if self.health_port is not None:
            described["health"] = f"http://{self.config.health_host}:{self.health_port}/livez"
        self._log.info(
            "%s starting: %s",
            self.kind,
            _as_text(described),
            extra={"event": f"{self.kind}.start", "config": described},
        )

    # -- once per batch ------------------------------------------------------------------------

    def producer_batch(
        self,
        rows: Sequence[Topical],
        results: Sequence[DeliveryFailure | None],
        seconds: float,
    ) -> None:
        """Report one Producer batch: metrics, and its INFO line."""
        failed: Counter[str] = Counter()
        dead: Counter[str] = Counter()
        if not any(results):  # the usual case: counted in C
            relayed = Counter(row.topic for row in rows)
        else:
            relayed = Counter()
            for row, result in zip(rows, results, strict=True):
                if result is None:
                    relayed[row.topic] += 1
                else:
                    failed[row.topic] += 1
                    if result.permanent:
                        dead[row.topic] += 1
        self.metrics.producer_batch(len(rows), relayed, failed, dead, seconds)
        self._log.info(
            "%srelayed %d of %d messages in %.3fs (%s)%s",
            self.where(),
            relayed.total(),
            len(rows),
            seconds,
            topic_summary(relayed) or "none",
            _failures(failed, dead),
            extra={
                "event": "producer.batch",
                **self._database(),
                "batch_size": len(rows),
                "relayed": dict(relayed),
                "failed": dict(failed),
                "dead": dict(dead),
                "seconds": round(seconds, 6),
            },
        )

    def consumer_batch(
        self,
        rows: Sequence[Topical],
        stored: Mapping[str, int],
        quarantined: Mapping[str, int] | None = None,
        *,
        database: str = "",
        routing: bool = False,
    ) -> None:
        """Report one Consumer batch of `database` (stored: new rows per topic; quarantined:
        new rows stored dead per topic): metrics, and its INFO line (naming the database when
        `routing` over several)."""
        received = Counter(row.topic for row in rows)
        quarantined = quarantined or {}
        metrics = self.metrics
        if routing and database and isinstance(metrics, PrometheusMetrics):
            metrics = metrics.for_database(database)
        metrics.consumer_batch(len(rows), received, stored, quarantined)
        total = sum(stored.values())
        dead = sum(quarantined.values())
        self._log.info(
            "stored %d of %d records%s (%s)%s%s",
            total,
            len(rows),
            f" in database {database!r}" if routing else "",
            topic_summary(dict(stored)) or "none",
            f"; {dead} quarantined" if dead else "",
            f"; {len(rows) - total - dead} already stored" if total + dead < len(rows) else "",
            extra={
                "event": "consumer.batch",
                "database": database,
                "batch_size": len(rows),
                "received": dict(received),
                "stored": dict(stored),
                "quarantined": dict(quarantined),
            },
        )

    def handler_batch(self, size: int, tally: HandlerTally) -> None:
        """Report one Handler batch: metrics, and its INFO line."""
        self.metrics.handler_batch(size, tally)
        expired = tally.lease_expired.total()
        self._log.info(
            "%shandled %d of %d messages (%s)%s%s",
            self.where(),
            tally.handled.total(),
            size,
            topic_summary(tally.handled) or "none",
            _failures(tally.failed, tally.dead),
            f"; {expired} past their lease" if expired else "",
            extra={
                "event": "handler.batch",
                **self._database(),
                "batch_size": size,
                "handled": dict(tally.handled),
                "failed": dict(tally.failed),
                "dead": dict(tally.dead),
                "lease_expired": dict(tally.lease_expired),
            },
        )

    def where(self) -> str:
        """`database NAME: ` for a relay among several (its log lines start with it), else ``."""
        return "" if self.database is None else f"database {self.database}: "

    def _database(self) -> dict[str, str]:
        return {} if self.database is None else {"database": self.database}


def _no_lanes() -> int:
    return 0


def _failures(failed: Counter[str], dead: Counter[str]) -> str:
    if not failed and not dead:
        return ""
    return f"; failed {topic_summary(failed)}" + (f"; dead {topic_summary(dead)}" if dead else "")


class _Probes:
    """A daemon thread: dependency checks for /readyz and the queue gauges, on a schedule."""

    def __init__(self, owner: Observability) -> None:
        self.owner = owner
        self.config = owner.config
        self._stop = threading.Event()
        self._conn: Connection | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"outbox-{owner.kind}-probes", daemon=True
        )
        self._statements = ProbeStatements(owner.daemon_config.schema)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop; a check in flight (at most probe_timeout) finishes in the background."""
        self._stop.set()
        self._thread.join(1.0)

    def _main(self) -> None:
        health = self.config.health_port is not None
        metrics = self.config.metrics_port is not None
        next_check = next_stats = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if health and now >= next_check:
                    next_check = now + self.config.probe_interval
                    self.owner.health.record(self.check())
                if metrics and now >= next_stats:
                    next_stats = now + self.config.stats_interval
                    self.refresh_stats()
                wake = min(next_check if health else math.inf, next_stats if metrics else math.inf)
                self._stop.wait(max(0.05, wake - time.monotonic()))
        finally:
            if self._conn is not None:
                self._conn.close()

    def check(self) -> dict[str, str | None]:
        """One round of dependency checks: name -> None, or why it failed."""
        failures: dict[str, str | None] = {}
        if self.owner.databases is None:  # else each database's relay reports (supervisor)
            failures["postgres"] = self._check_postgres()
        transport = self.owner._transport
        if transport is not None:
            failures[transport.name] = self._check_transport(transport)
        return failures

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = connect(
                self.owner.daemon_config.database_url,
                timeout=self.config.probe_timeout,
                application_name=f"outbox-{self.owner.kind}-probe",
            )
        return self._conn

    def _check_postgres(self) -> str | None:
        try:
            self._statements.ping(self._connection())
        except psycopg.Error as exc:
            self._drop_connection()
            return f"PostgreSQL unreachable: {redact_text(first_line(exc))}"
        return None

    def _check_transport(self, transport: TransportProbe) -> str | None:
        try:
            transport.check(self.config.probe_timeout)
        except OutboxError as exc:
            return f"{transport.label} unreachable: {redact_text(str(exc))}"
        return None

    def refresh_stats(self) -> None:
        """Set the queue depth, oldest-age (and the producer's dead-rows) gauges from one
        query (per database, each on a short-lived connection, for several)."""
        if self.owner.databases is not None:
            for database in self.owner.databases():
                self._refresh_database(database)
            return
        try:
            queue = QUEUE_OF[self.owner.kind]
            stats = self._statements.queue_stats(self._connection(), queue)
        except psycopg.Error as exc:
            self._drop_connection()
            log.debug("queue statistics not refreshed: %s", redact_text(first_line(exc)))
            return
        if stats is not None:
            self.owner.metrics.queue_stats(queue, *stats)

    def _refresh_database(self, database: Database) -> None:
        queue = QUEUE_OF[self.owner.kind]
        metrics = self.owner.metrics
        if not isinstance(metrics, PrometheusMetrics):
            return
        try:
            with connect(
                database.url,
                timeout=self.config.probe_timeout,
                application_name=f"outbox-{self.owner.kind}-probe",
            ) as conn:
                stats = ProbeStatements(database.schema).queue_stats(conn, queue)
        except psycopg.Error as exc:
            log.debug(
                "queue statistics of database %s not refreshed: %s",
                database.name,
                redact_text(first_line(exc)),
            )
            return
        if stats is not None:
            metrics.for_database(database.name).queue_stats(queue, *stats)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class Observed(Protocol):
    """A daemon with an `Observability`."""

    @property
    def observability(self) -> Observability: ...


D = TypeVar("D", bound=Observed)


def observed(run: Callable[[D], None]) -> Callable[[D], None]:
    """Decorate a daemon's `run()`: serve metrics and health, and log the startup line, while
    it runs."""

    @functools.wraps(run)
    def serving_run(self: D) -> None:
        with self.observability.serving():
            run(self)

    return serving_run
