"""What a daemon does besides its work: startup line, per-batch log lines, metrics, health.

Each daemon owns one `Observability`, built from the `Observer` its wiring (the composition root,
outbox/runtime/) gives it. `@observed` on the daemon's `run()` serves metrics and health while
it runs and logs the effective configuration (secrets masked) at start. The daemon calls one
`*_batch` method per batch; that updates the metrics and writes the batch's INFO line with
per-topic counts. A probe thread, started only when metrics or health are on, checks the
daemon's database (and its transport, for the producer and consumer) for `/readyz` and refreshes
the queue gauges with one cheap query, never per message. The database and the transport are
reached only through the probes of outbox.ports (`DatabaseProbe`, `TransportProbe`).
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
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.numbers import check_fields
from outbox.core.redact import (
    redact_settings,
    redact_text,
    redact_url,
    remember_secrets,
    secrets_of_url,
)
from outbox.core.text import first_line
from outbox.observability.health import HealthServer, HealthState, Heartbeat
from outbox.observability.logs import BatchSummary, topic_summary
from outbox.observability.metrics import (
    HandlerTally,
    Kind,
    Metrics,
    PrometheusMetrics,
)
from outbox.ports import DatabaseProbe, DatabaseProbes, DeliveryFailure, TransportProbe

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
    #: Seconds summed into one INFO line of the daemon's batches (each batch's line is then
    #: DEBUG); 0: an INFO line per batch.
    log_interval: float = 10.0

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
                "log_interval": "seconds_or_zero",
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


@dataclass(frozen=True)
class Observer:
    """How a daemon is observed, as its wiring gives it: the metrics and health settings, how
    to probe a database (None: its readiness and queue gauges are not checked), and the
    settings in force outside the daemon's own config (its transport, group and topics), which
    its start-up line shows first (secrets masked there)."""

    config: ObservabilityConfig = dataclasses.field(default_factory=ObservabilityConfig)
    probes: DatabaseProbes | None = None
    shown: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)


class Topical(Protocol):
    """A message or row with a topic."""

    @property
    def topic(self) -> str: ...


@functools.cache
def _version() -> str:
    from outbox._version import version

    return version()


def _loggable(name: str, value: Any) -> Any:
    """One setting as a plain, loggable value, secrets masked: a URL's password, a mapping's
    secret settings, any remembered secret in a text."""
    if isinstance(value, str):
        return redact_url(value) if name.endswith("url") else redact_text(value)
    if isinstance(value, Mapping):
        return redact_settings(value)
    if value is None or isinstance(value, int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return redact_text(repr(value))


def describe(config: Any) -> dict[str, Any]:
    """A daemon config dataclass as plain, loggable values, secrets masked (its
    `observability`, when it has one, flattened in)."""
    described: dict[str, Any] = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if dataclasses.is_dataclass(value) and item.name == "observability":
            described.update(describe(value))
        else:
            described[item.name] = _loggable(item.name, value)
    return described


def describe_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings in force (`Observer.shown`) as loggable values, secrets masked."""
    return {key: _loggable(key, value) for key, value in settings.items()}


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
        observer: Observer,
        *,
        tuning: Any = None,
        heartbeat: Heartbeat,
        relay_id: str,
        database: Database | None = None,
        transport: TransportProbe | None = None,
        lanes: Callable[[], int] | None = None,
        databases: Callable[[], Sequence[Database]] | None = None,
        parked: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.kind = kind
        #: The database the daemon serves (its probe's), or None.
        self.served = database
        #: A daemon serving several databases: the databases it serves now. Its metrics label
        #: each database's series (`for_database`), its start-up line lists them, and its
        #: probes check the transport only (each database's state is watched, see `health`).
        self.databases = databases
        #: Of those, the NAMEs of the databases whose relays are parked: their queue gauges are
        #: not refreshed (a connection each per refresh, for databases with nothing waiting).
        self.parked = parked
        #: The NAME of the database of one relay among several: its batch lines say it.
        self.database: str | None = None
        #: The daemon's own config (a dataclass of its tuning), for the start-up line.
        self.tuning = tuning
        self.observer = observer
        self.config = observer.config
        self.heartbeat = heartbeat
        self.relay_id = relay_id
        self.metrics_lanes = lanes
        self._transport = transport
        self._log = logging.getLogger(f"outbox.{kind}")
        #: The batches' summary line (None: an INFO line per batch); a relay among several
        #: shares its process's (`for_database`).
        self.summary: BatchSummary | None = (
            BatchSummary(self._log, kind, self.config.log_interval)
            if self.config.log_interval > 0
            else None
        )
        if database is not None:
            remember_secrets(secrets_of_url(database.url))
        self.metrics: Metrics = Metrics()
        if self.config.metrics_port is not None:
            listed = databases() if databases is not None else []
            schema = database.schema if database is not None else ""
            info = {
                "daemon": kind,
                "relay_id": relay_id,
                "schema": schema or (listed[0].schema if listed else ""),
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
        observability.summary = self.summary
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
            if self.summary is not None:
                self.summary.flush()
            if self._probes is not None:
                self._probes.stop()
            if self.health_server is not None:
                self.health_server.stop()
            self.metrics.close()

    def _log_startup(self) -> None:
        """The effective configuration: every setting in force, secrets masked: the wiring's
        (the transport, for Kafka every librdkafka setting of the client, outbox's forced ones
        included), the database's, then the daemon's own."""
        described = {"relay_id": self.relay_id, **describe_settings(self.observer.shown)}
        if self.databases is not None:
            described["databases"] = [database.describe() for database in self.databases()]
        elif self.served is not None:
            described["database_url"] = redact_url(self.served.url)
            described["schema"] = self.served.schema
        if self.tuning is not None:
            described.update(describe(self.tuning))
        described.update(describe(self.config))
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
        if self.summary is not None:
            self.summary.add(
                len(rows), relayed, {"failed": failed, "dead": dead}, database=self.database
            )
        level = logging.INFO if self.summary is None else logging.DEBUG
        if not self._log.isEnabledFor(level):
            return
        self._log.log(
            level,
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
        if self.summary is not None:
            again = len(rows) - total - dead
            self.summary.add(
                len(rows),
                dict(stored),
                {
                    "quarantined": dict(quarantined),
                    "already_stored": {"": again} if again > 0 else {},
                },
                database=database if routing else None,
            )
        level = logging.INFO if self.summary is None else logging.DEBUG
        if not self._log.isEnabledFor(level):
            return
        self._log.log(
            level,
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
        if self.summary is not None:
            self.summary.add(
                size,
                tally.handled,
                {"failed": tally.failed, "dead": tally.dead, "past_lease": tally.lease_expired},
                database=self.database,
            )
        level = logging.INFO if self.summary is None else logging.DEBUG
        if not self._log.isEnabledFor(level):
            return
        self._log.log(
            level,
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
        self._thread = threading.Thread(
            target=self._main, name=f"outbox-{owner.kind}-probes", daemon=True
        )
        make = owner.observer.probes
        served = owner.served
        #: The probe of the daemon's database (kept: one connection), when it has one.
        self._database: DatabaseProbe | None = (
            make(served) if make is not None and served is not None else None
        )

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
            if self._database is not None:
                self._database.close()

    def check(self) -> dict[str, str | None]:
        """One round of dependency checks: name -> None, or why it failed."""
        failures: dict[str, str | None] = {}
        probe = self._database  # with several databases, each database's relay reports
        if probe is not None and self.owner.databases is None:
            try:
                probe.check(self.config.probe_timeout)
            except OutboxError as exc:
                failures[probe.name] = f"{probe.label} unreachable: {redact_text(str(exc))}"
            else:
                failures[probe.name] = None
        transport = self.owner._transport
        if transport is not None:
            failures[transport.name] = self._check_transport(transport)
        return failures

    def _check_transport(self, transport: TransportProbe) -> str | None:
        try:
            transport.check(self.config.probe_timeout)
        except OutboxError as exc:
            return f"{transport.label} unreachable: {redact_text(str(exc))}"
        return None

    def refresh_stats(self) -> None:
        """Set the queue depth, oldest-age (and the producer's dead-rows) gauges from one
        query (per database, each on a short-lived connection, for several)."""
        queue = QUEUE_OF[self.owner.kind]
        if self.owner.databases is not None:
            parked = self.owner.parked() if self.owner.parked is not None else ()
            for database in self.owner.databases():
                if database.name not in parked:
                    self._refresh_database(database, queue)
            return
        probe = self._database
        if probe is None:
            return
        try:
            stats = probe.queue_stats(queue, self.config.probe_timeout)
        except OutboxError as exc:
            log.debug("queue statistics not refreshed: %s", redact_text(first_line(exc)))
            return
        if stats is not None:
            self.owner.metrics.queue_stats(queue, *stats)

    def _refresh_database(self, database: Database, queue: str) -> None:
        metrics = self.owner.metrics
        make = self.owner.observer.probes
        if not isinstance(metrics, PrometheusMetrics) or make is None:
            return
        probe = make(database)
        try:
            stats = probe.queue_stats(queue, self.config.probe_timeout)
        except OutboxError as exc:
            log.debug(
                "queue statistics of database %s not refreshed: %s",
                database.name,
                redact_text(first_line(exc)),
            )
            return
        finally:
            probe.close()
        if stats is not None:
            metrics.for_database(database.name).queue_stats(queue, *stats)


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
