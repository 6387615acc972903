"""Prometheus metrics of the daemons (`--metrics-port`), behind a small per-batch interface.

The daemons report once per batch, never per message: counts come aggregated per topic. `Metrics`
itself records nothing (metrics off); `PrometheusMetrics` keeps the series in its own
`CollectorRegistry`, so several daemons can run in one process, and needs `prometheus-client`
(the `metrics` extra) only when it is created. A daemon serving several databases labels every
per-database series (`MetricInfo.per_database`) with `database`, the database's NAME
(`PrometheusMetrics.for_database`). Every metric name is listed in `METRICS`, which
the docs (docs/how-to/observability.md) and the Grafana dashboard are checked against.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from outbox.core.errors import ConfigurationError

Kind = Literal["producer", "consumer", "handler"]

BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HANDLER_BUCKETS = (*SECONDS_BUCKETS, 120, 300)


@dataclass(frozen=True)
class MetricInfo:
    """One exported metric: its name (as scraped, without _total/_bucket), type, labels, help."""

    name: str
    type: Literal["counter", "gauge", "histogram", "info"]
    labels: tuple[str, ...]
    help: str
    #: The daemons that export it.
    daemons: tuple[Kind, ...] = ("producer", "consumer", "handler")
    #: Whether a daemon serving several databases labels it `database` (first label).
    per_database: bool = True


#: The label of a database's NAME on the series of a daemon serving several databases.
DATABASE_LABEL = "database"


_LANE_RELAYS: tuple[Kind, ...] = ("producer", "handler")

#: Every metric a daemon can export.
METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "outbox_info",
        "info",
        ("daemon", "relay_id", "schema", "version"),
        "the daemon process: which daemon, its relay id, schema and outbox version",
        per_database=False,
    ),
    MetricInfo(
        "outbox_lanes_owned",
        "gauge",
        (),
        "lanes (of 64) this process owns right now",
        _LANE_RELAYS,
    ),
    MetricInfo(
        "outbox_connection_budget",
        "gauge",
        (),
        "the most connections the process may hold to its databases (several databases and "
        "--max-connections)",
        per_database=False,
    ),
    MetricInfo(
        "outbox_connections",
        "gauge",
        ("database",),
        "the connections of the process's budget each database holds now (several databases "
        "and --max-connections)",
        per_database=False,
    ),
    MetricInfo(
        "outbox_connections_reserved",
        "gauge",
        (),
        "the handler's shared worker sessions reserved in the budget and serving no database "
        "now (several databases and --max-connections)",
        per_database=False,
    ),
    MetricInfo(
        "outbox_connections_waiting",
        "gauge",
        (),
        "the databases (relays, the consumer's) waiting for a connection of the budget now",
        per_database=False,
    ),
    MetricInfo(
        "outbox_seconds_since_progress",
        "gauge",
        (),
        "seconds since the main loop last made progress (what /livez compares with its timeout)",
        per_database=False,
    ),
    MetricInfo(
        "outbox_queue_depth",
        "gauge",
        ("queue",),
        "rows waiting in the queue (pending or retrying, not dead, not processed), "
        "refreshed periodically",
    ),
    MetricInfo(
        "outbox_queue_oldest_age_seconds",
        "gauge",
        ("queue",),
        "age of the oldest waiting row (0 when none waits), refreshed periodically",
    ),
    MetricInfo(
        "outbox_producer_messages_relayed_total",
        "counter",
        ("topic",),
        "messages acknowledged by Kafka and deleted from producer_queue",
        ("producer",),
    ),
    MetricInfo(
        "outbox_producer_messages_failed_total",
        "counter",
        ("topic",),
        "failed deliveries (each is retried later, or the row is dead)",
        ("producer",),
    ),
    MetricInfo(
        "outbox_producer_messages_dead_total",
        "counter",
        ("topic",),
        "rows marked dead after a delivery failure no retry can fix",
        ("producer",),
    ),
    MetricInfo(
        "outbox_producer_dead_rows",
        "gauge",
        (),
        "dead rows kept in producer_dead (`outbox dead-letters list --queue producer`), refreshed "
        "periodically with the queue depth",
        ("producer",),
    ),
    MetricInfo(
        "outbox_scheduled_messages",
        "gauge",
        (),
        "messages sent with a due time still to come, waiting in producer_scheduled, refreshed "
        "periodically with the queue depth",
        ("producer",),
    ),
    MetricInfo(
        "outbox_scheduled_overdue_messages",
        "gauge",
        (),
        "scheduled messages due but not yet taken into producer_queue by a relay (none runs, or "
        "it is behind), refreshed periodically",
        ("producer",),
    ),
    MetricInfo(
        "outbox_scheduled_overdue_seconds",
        "gauge",
        (),
        "seconds the most overdue scheduled message is past its due time (0 when none is), "
        "refreshed periodically",
        ("producer",),
    ),
    MetricInfo(
        "outbox_producer_batch_size",
        "histogram",
        (),
        "rows per batch fetched from producer_queue",
        ("producer",),
    ),
    MetricInfo(
        "outbox_producer_delivery_seconds",
        "histogram",
        (),
        "per batch: seconds from the first produce to the last delivery report",
        ("producer",),
    ),
    MetricInfo(
        "outbox_consumer_messages_received_total",
        "counter",
        ("topic",),
        "Kafka records read (redeliveries included)",
        ("consumer",),
    ),
    MetricInfo(
        "outbox_consumer_messages_stored_total",
        "counter",
        ("topic",),
        "new rows stored in consumer_queue (records already stored are not counted)",
        ("consumer",),
    ),
    MetricInfo(
        "outbox_consumer_messages_quarantined_total",
        "counter",
        ("topic",),
        "records stored dead because they cannot be ordinary rows (a header name or content "
        "type PostgreSQL cannot hold, data it refused); see `outbox dead-letters`",
        ("consumer",),
    ),
    MetricInfo(
        "outbox_consumer_batch_size",
        "histogram",
        (),
        "records per batch stored in one transaction",
        ("consumer",),
    ),
    MetricInfo(
        "outbox_handler_messages_handled_total",
        "counter",
        ("topic",),
        "messages whose callback succeeded and committed",
        ("handler",),
    ),
    MetricInfo(
        "outbox_handler_messages_failed_total",
        "counter",
        ("topic",),
        "failed attempts (callback raised, lease expired, or no handler)",
        ("handler",),
    ),
    MetricInfo(
        "outbox_handler_messages_dead_total",
        "counter",
        ("topic",),
        "messages marked dead (attempts exhausted or no handler for the topic)",
        ("handler",),
    ),
    MetricInfo(
        "outbox_handler_lease_expired_total",
        "counter",
        ("topic",),
        "callbacks that overran --lease and had their transaction terminated",
        ("handler",),
    ),
    MetricInfo(
        "outbox_handler_batch_size",
        "histogram",
        (),
        "rows per round claimed from consumer_queue by the workers",
        ("handler",),
    ),
    MetricInfo(
        "outbox_handler_duration_seconds",
        "histogram",
        ("topic",),
        "seconds a successful callback took (with flushing its ORM writes)",
        ("handler",),
    ),
)


@dataclass
class HandlerTally:
    """What the Handler's workers did during one batch, per topic."""

    handled: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    dead: Counter[str] = field(default_factory=Counter)
    lease_expired: Counter[str] = field(default_factory=Counter)
    #: topic -> seconds of each successful callback.
    durations: dict[str, list[float]] = field(default_factory=dict)


class HandlerTallyBook:
    """Thread-safe collection of a `HandlerTally` from the worker threads; `take()` per batch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tally = HandlerTally()

    def handled(self, callbacks: Iterable[tuple[str, float]]) -> None:
        """Count successful callbacks, given as (topic, seconds)."""
        with self._lock:
            for topic, seconds in callbacks:
                self._tally.handled[topic] += 1
                self._tally.durations.setdefault(topic, []).append(seconds)

    def failed(self, topic: str, *, dead: bool) -> None:
        """Count a failed attempt, and whether it left the message dead."""
        with self._lock:
            self._tally.failed[topic] += 1
            if dead:
                self._tally.dead[topic] += 1

    def lease_expired(self, topic: str) -> None:
        """Count a callback terminated past its lease."""
        with self._lock:
            self._tally.lease_expired[topic] += 1

    def take(self) -> HandlerTally:
        """What was collected since the last `take()`."""
        with self._lock:
            tally, self._tally = self._tally, HandlerTally()
        return tally


class Metrics:
    """What a daemon reports, once per batch; this base class records nothing (metrics off)."""

    #: The port metrics are served on, once `serve()` ran.
    port: int | None = None

    def producer_batch(
        self,
        size: int,
        relayed: Mapping[str, int],
        failed: Mapping[str, int],
        dead: Mapping[str, int],
        seconds: float,
    ) -> None:
        """One Producer batch: per-topic outcomes and its produce-to-last-report time."""

    def consumer_batch(
        self,
        size: int,
        received: Mapping[str, int],
        stored: Mapping[str, int],
        quarantined: Mapping[str, int],
    ) -> None:
        """One Consumer batch: records read, new rows stored and new rows quarantined, per
        topic."""

    def handler_batch(self, size: int, tally: HandlerTally) -> None:
        """One Handler batch: what its workers did."""

    def connection_budget(
        self,
        size: int,
        holders: Callable[[], Mapping[str, int]],
        reserved: Callable[[], int] = lambda: 0,
        waiting: Callable[[], int] = lambda: 0,
    ) -> None:
        """Export the process's connection budget (`size`), who holds it (`holders`: the
        connections per database), the handler workers' sessions reserved and not in use
        (`reserved`) and how many wait for one (`waiting`), read at each scrape."""

    def queue_stats(
        self,
        queue: str,
        depth: int,
        oldest_age: float,
        dead: int | None = None,
        scheduled: int | None = None,
        overdue: int | None = None,
        overdue_age: float | None = None,
    ) -> None:
        """The periodic look at a queue table: waiting rows, the oldest one's age, and (the
        producer's) dead rows, messages due later, the overdue ones and how late the most
        overdue is."""

    def serve(self, host: str, port: int) -> int:
        """Start serving /metrics; return the bound port. The base class has nothing to serve."""
        raise ConfigurationError("metrics are off")

    def close(self) -> None:
        """Stop serving."""


def _labels(info: MetricInfo, registry: Any) -> tuple[str, ...]:
    """`info`'s labels, after `database` in a registry of a daemon of several databases."""
    if info.per_database and getattr(registry, "outbox_per_database", False):
        return (DATABASE_LABEL, *info.labels)
    return info.labels


def _counters(registry: Any, prometheus: Any, prefix: str, *names: str) -> dict[str, Any]:
    by_name = {m.name: m for m in METRICS}
    result = {}
    for name in names:
        info = by_name[f"{prefix}_{name}_total"]
        result[name] = prometheus.Counter(
            info.name.removesuffix("_total"), info.help, _labels(info, registry), registry=registry
        )
    return result


def _histogram(registry: Any, prometheus: Any, name: str, buckets: tuple[float, ...]) -> Any:
    info = next(m for m in METRICS if m.name == name)
    return prometheus.Histogram(
        name, info.help, _labels(info, registry), buckets=buckets, registry=registry
    )


def _gauge(registry: Any, prometheus: Any, name: str) -> Any:
    info = next(m for m in METRICS if m.name == name)
    return prometheus.Gauge(name, info.help, _labels(info, registry), registry=registry)


class PrometheusMetrics(Metrics):
    """Metrics in a private `CollectorRegistry`, served by prometheus-client's HTTP server."""

    def __init__(
        self,
        kind: Kind,
        info: Mapping[str, str],
        *,
        progress_age: Callable[[], float],
        lanes: Callable[[], int] | None = None,
        per_database: bool = False,
    ) -> None:
        prometheus = _import_prometheus()
        self.kind = kind
        #: The label values in front of every per-database series: (the database's NAME,) in
        #: a view of `for_database`, else none.
        self.values: tuple[str, ...] = ()
        self.registry = prometheus.CollectorRegistry(auto_describe=True)
        self.registry.outbox_per_database = per_database
        self._prometheus = prometheus
        self._server: Any = None
        self._thread: Any = None
        registry = self.registry
        prometheus.Info("outbox", METRICS[0].help, registry=registry).info(dict(info))
        _gauge(registry, prometheus, "outbox_seconds_since_progress").set_function(progress_age)
        self._lanes: Any = None
        if lanes is not None:
            self._lanes = _gauge(registry, prometheus, "outbox_lanes_owned")
            if not per_database:
                self._lanes.set_function(lanes)
        self._depth = _gauge(registry, prometheus, "outbox_queue_depth")
        self._oldest = _gauge(registry, prometheus, "outbox_queue_oldest_age_seconds")
        prefix = f"outbox_{kind}"
        self._batch = _histogram(registry, prometheus, f"{prefix}_batch_size", BATCH_BUCKETS)
        if kind == "producer":
            self._counts = _counters(
                registry, prometheus, "outbox_producer", "messages_relayed",
                "messages_failed", "messages_dead",
            )  # fmt: skip
            self._delivery = _histogram(
                registry, prometheus, "outbox_producer_delivery_seconds", SECONDS_BUCKETS
            )
            self._dead = _gauge(registry, prometheus, "outbox_producer_dead_rows")
            self._scheduled = _gauge(registry, prometheus, "outbox_scheduled_messages")
            self._overdue = _gauge(registry, prometheus, "outbox_scheduled_overdue_messages")
            self._overdue_age = _gauge(registry, prometheus, "outbox_scheduled_overdue_seconds")
        elif kind == "consumer":
            self._counts = _counters(
                registry, prometheus, "outbox_consumer", "messages_received",
                "messages_stored", "messages_quarantined",
            )  # fmt: skip
        else:
            self._counts = _counters(
                registry, prometheus, "outbox_handler", "messages_handled",
                "messages_failed", "messages_dead", "lease_expired",
            )  # fmt: skip
            self._duration = _histogram(
                registry, prometheus, "outbox_handler_duration_seconds", HANDLER_BUCKETS
            )

    def connection_budget(
        self,
        size: int,
        holders: Callable[[], Mapping[str, int]],
        reserved: Callable[[], int] = lambda: 0,
        waiting: Callable[[], int] = lambda: 0,
    ) -> None:
        from prometheus_client.core import GaugeMetricFamily

        infos = {m.name: m for m in METRICS}
        budget, held = infos["outbox_connection_budget"], infos["outbox_connections"]
        kept, queued = infos["outbox_connections_reserved"], infos["outbox_connections_waiting"]

        class _Budget:
            def collect(self) -> Iterable[Any]:
                yield GaugeMetricFamily(budget.name, budget.help, value=size)
                family = GaugeMetricFamily(held.name, held.help, labels=held.labels)
                for name, count in sorted(holders().items()):
                    family.add_metric([name], count)
                yield family
                yield GaugeMetricFamily(kept.name, kept.help, value=reserved())
                yield GaugeMetricFamily(queued.name, queued.help, value=waiting())

            def describe(self) -> Iterable[Any]:
                return []

        with suppress(ValueError):  # registered once per registry
            self.registry.register(_Budget())

    def for_database(self, name: str, lanes: Callable[[], int] | None = None) -> Metrics:
        """The metrics of database `name` of a daemon serving several: its series labelled
        `database=name`; `lanes` gives the lanes its relay owns."""
        view = copy.copy(self)
        view.values = (name,)
        if lanes is not None and self._lanes is not None:
            self._lanes.labels(name).set_function(lanes)
        return view

    def forget_database(self, name: str) -> None:
        """A database no longer served: its lanes gauge goes (its counters stay, as counters
        do)."""
        if self._lanes is not None:
            with suppress(KeyError):
                self._lanes.remove(name)

    def _child(self, metric: Any, *labels: str) -> Any:
        values = (*self.values, *labels)
        return metric.labels(*values) if values else metric

    def _add(self, name: str, per_topic: Mapping[str, int]) -> None:
        counter = self._counts[name]
        for topic, n in per_topic.items():
            if n:
                self._child(counter, topic).inc(n)

    def producer_batch(
        self,
        size: int,
        relayed: Mapping[str, int],
        failed: Mapping[str, int],
        dead: Mapping[str, int],
        seconds: float,
    ) -> None:
        self._child(self._batch).observe(size)
        self._child(self._delivery).observe(seconds)
        self._add("messages_relayed", relayed)
        self._add("messages_failed", failed)
        self._add("messages_dead", dead)

    def consumer_batch(
        self,
        size: int,
        received: Mapping[str, int],
        stored: Mapping[str, int],
        quarantined: Mapping[str, int],
    ) -> None:
        self._child(self._batch).observe(size)
        self._add("messages_received", received)
        self._add("messages_stored", stored)
        self._add("messages_quarantined", quarantined)

    def handler_batch(self, size: int, tally: HandlerTally) -> None:
        self._child(self._batch).observe(size)
        self._add("messages_handled", tally.handled)
        self._add("messages_failed", tally.failed)
        self._add("messages_dead", tally.dead)
        self._add("lease_expired", tally.lease_expired)
        for topic, durations in tally.durations.items():
            histogram = self._child(self._duration, topic)
            for seconds in durations:
                histogram.observe(seconds)

    def queue_stats(
        self,
        queue: str,
        depth: int,
        oldest_age: float,
        dead: int | None = None,
        scheduled: int | None = None,
        overdue: int | None = None,
        overdue_age: float | None = None,
    ) -> None:
        self._child(self._depth, queue).set(depth)
        self._child(self._oldest, queue).set(oldest_age)
        if dead is not None and self.kind == "producer":
            self._child(self._dead).set(dead)
        if scheduled is not None and self.kind == "producer":
            self._child(self._scheduled).set(scheduled)
            self._child(self._overdue).set(overdue or 0)
            self._child(self._overdue_age).set(overdue_age or 0.0)

    def serve(self, host: str, port: int) -> int:
        try:
            self._server, self._thread = self._prometheus.start_http_server(
                port, addr=host, registry=self.registry
            )
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self.port = int(self._server.server_address[1])
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "--metrics-port needs the prometheus-client package: "
            "pip install 'pg-kafka-outbox[metrics]'"
        ) from None
    return prometheus_client
