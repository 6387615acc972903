"""The relay, the consumer and the handler in one process: `outbox run`, or an application's.

`OutboxRuntime` runs a `Producer` (producer_queue to the transport), a `Consumer` (the
handlers' topics into consumer_queue) and a `HandlerRunner` (the callbacks) in threads of the
calling process. Each keeps its own database connections, threads, retries and guarantees,
exactly as when it runs as its own process; what they share is one health and one metrics port:
`/livez` fails when any component's loop is stuck, `/readyz` when any is not ready, and
`/metrics` carries each component's series with a `daemon` label.

`stop()` drains in order: the consumer first (no new intake; it stores and commits the batch in
hand), then the producer and the handler finish theirs. A component that stops with an error
retrying cannot fix stops the others; `wait()`/`stop()` raise that error.

With several databases (or a databases file) the producer and the handler run a relay per
database under a supervisor, and the consumer routes each record to its tenant's inbox, exactly
as `outbox producer`, `outbox consumer` and `outbox handler` do over those databases. The parts
are built by the composition root (`outbox.runtime.App`) from one `Settings`.

From an application (FastAPI's lifespan, a Django management command), start and stop it with
the application::

    runtime = OutboxRuntime(handlers, database_url=..., group="billing", kafka_bootstrap=...)
    async with runtime:  # or `with runtime:`, or start() ... stop()
        ...

or, with every setting `outbox run` has, `OutboxRuntime(handlers, settings=Settings(...))`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from outbox import transports
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.handlers import Handlers
from outbox.observability.health import HealthServer, HealthState, Heartbeat
from outbox.observability.runtime import ObservabilityConfig
from outbox.runtime.app import App, Part
from outbox.runtime.settings import (
    ConsumerConfig,
    Databases,
    HandlerConfig,
    ProducerConfig,
    Settings,
)

__all__ = ["OutboxRuntime"]

log = logging.getLogger("outbox.run")


def _component_observability(shared: ObservabilityConfig) -> ObservabilityConfig:
    """What each component's own `Observability` gets: its checks and metrics on, served only
    on the loopback at a free port; the process's one port is served by `OutboxRuntime`."""
    return dataclasses.replace(
        shared,
        metrics_port=None if shared.metrics_port is None else 0,
        metrics_host="127.0.0.1",
        health_port=None if shared.health_port is None else 0,
        health_host="127.0.0.1",
    )


class _AllHealthy(HealthState):
    """The process's health: every component's, each reason prefixed with the component."""

    def __init__(self, components: Mapping[str, Part]) -> None:
        super().__init__(heartbeat=Heartbeat(), liveness_timeout=1.0, check_expiry=1.0)
        self._components = components

    def _all(self, ready: bool) -> tuple[bool, str]:
        problems = []
        for name, component in self._components.items():
            state = component.observability.health
            ok, reason = state.ready() if ready else state.live()
            if not ok:
                problems.append(f"{name}: {reason}")
        return (not problems), "; ".join(problems) or "ok"

    def live(self) -> tuple[bool, str]:
        return self._all(ready=False)

    def ready(self) -> tuple[bool, str]:
        return self._all(ready=True)


class _AllMetrics:
    """A prometheus-client collector: every component's series, with a `daemon` label."""

    def __init__(self, components: Mapping[str, Part]) -> None:
        self._components = components

    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import Metric

        merged: dict[str, Any] = {}
        for name, component in self._components.items():
            registry = getattr(component.observability.metrics, "registry", None)
            if registry is None:
                continue
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for sample in family.samples:
                    labels = dict(sample.labels)
                    labels.setdefault("daemon", name)
                    into.samples.append(sample._replace(labels=labels))
        yield from merged.values()


class OutboxRuntime:
    """The producer relay, the consumer and the handler runner of one service, in threads.

    `handlers` is the service's `Handlers` registry (or its "module:attribute"); the consumer
    reads the topics it handles (or `topics`). Give `settings` (`outbox.runtime.Settings`:
    what `outbox run` takes, several databases included), or the keywords of one database:
    `transport` is "kafka" (`kafka_bootstrap`, `kafka_config`) or "postgres" (the log at
    `log_url`), or a registered transport's name with its flag values by destination in
    `transport_options` (outbox.transports.settings_of); `producer`, `consumer` and `handler`
    give further fields of `ProducerConfig`,
    `ConsumerConfig` and `HandlerConfig` (batch sizes, concurrency, lease...). `observability`
    is the process's one metrics and health port.
    """

    def __init__(
        self,
        handlers: Handlers | str,
        *,
        settings: Settings | None = None,
        database_url: str | Sequence[str] | None = None,
        group: str = "",
        transport: str = "kafka",
        kafka_bootstrap: str = "",
        kafka_config: Mapping[str, str] | None = None,
        log_url: str | None = None,
        log_schema: str | None = None,
        log_partitions: int = 8,
        log_retention: float | None = 7 * 24 * 3600.0,
        log_session_timeout: float = 10.0,
        transport_options: Mapping[str, Any] | None = None,
        schema: str = "outbox",
        topics: Sequence[str] | None = None,
        observability: ObservabilityConfig | None = None,
        producer: Mapping[str, Any] | None = None,
        consumer: Mapping[str, Any] | None = None,
        handler: Mapping[str, Any] | None = None,
    ) -> None:
        if settings is None:
            if not database_url:
                raise ConfigurationError(
                    "OutboxRuntime needs database_url= (or settings=Settings(databases=...))"
                )
            urls = [database_url] if isinstance(database_url, str) else list(database_url)
            settings = Settings(
                databases=Databases.of(*urls, schema=schema),
                transport=transports.settings_of(
                    transport,
                    {
                        "kafka_bootstrap": kafka_bootstrap,
                        "kafka_config": dict(kafka_config or {}),
                        "log_url": log_url or "",
                        "log_schema": log_schema,
                        "log_partitions": log_partitions,
                        "log_retention": log_retention or None,
                        "log_session_timeout": log_session_timeout,
                        **dict(transport_options or {}),
                    },
                ),
                group=group,
                topics=tuple(topics or ()),
                producer=ProducerConfig(**dict(producer or {})),
                consumer=ConsumerConfig(**dict(consumer or {})),
                handler=HandlerConfig(**dict(handler or {})),
                observability=observability or ObservabilityConfig(),
            )
        elif any(
            given is not None
            for given in (
                database_url,
                kafka_config,
                log_url,
                topics,
                observability,
                transport_options,
            )
        ) or any((group, kafka_bootstrap, producer, consumer, handler)):
            raise ConfigurationError(
                "give OutboxRuntime settings= or the keywords of one database, not both"
            )
        self.settings = settings
        #: Each part's own observability: its checks and metrics on, on the loopback only; the
        #: process's one port is served here.
        own = _component_observability(settings.observability)
        self.app = App(dataclasses.replace(settings, observability=own), handlers)
        # The consumer first: it names what is missing (the group, the topics) before anything
        # connects; then the stop order: intake first.
        parts: dict[str, Part] = {"consumer": self.app.part("consumer")}
        parts["producer"] = self.app.part("producer")
        parts["handler"] = self.app.part("handler")
        self._init(parts, settings.observability)

    @classmethod
    def of(cls, app: App) -> OutboxRuntime:
        """The three parts of an `App` already built (`App.in_memory(handlers)` in a test),
        run as `OutboxRuntime` runs its own: `with OutboxRuntime.of(app): ...`."""
        runtime = cls.__new__(cls)
        runtime.settings = app.settings
        runtime.app = app
        parts: dict[str, Part] = {"consumer": app.part("consumer")}
        parts["producer"] = app.part("producer")
        parts["handler"] = app.part("handler")
        runtime._init(parts, app.settings.observability)
        return runtime

    def _init(self, parts: Mapping[str, Part], observability: ObservabilityConfig) -> None:
        self.producer = parts["producer"]
        self.consumer = parts["consumer"]
        self.handler = parts["handler"]
        self.config = observability
        #: Stop order: intake first.
        self._components: dict[str, Part] = dict(parts)
        self._threads: dict[str, threading.Thread] = {}
        self._errors: list[tuple[str, BaseException]] = []
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._health_server: HealthServer | None = None
        self._metrics_server: Any = None
        self.health_port: int | None = None
        self.metrics_port: int | None = None
        self._started = self._stopped = self._running = False
        #: Log, at ERROR, the first component that stops with an error (`outbox run` does not:
        #: it prints that error as its one last line).
        self.log_failures = True

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Start the three components and the process's health and metrics servers; return
        once each passed its start-up checks and runs (or raise why one could not start,
        after stopping the others)."""
        if self._started:
            raise RuntimeError("an OutboxRuntime starts once")
        self._started = True
        self._preflight()
        self._serve()
        for name, component in self._components.items():
            thread = threading.Thread(
                target=self._main, args=(name, component), name=f"outbox-run-{name}", daemon=True
            )
            self._threads[name] = thread
            thread.start()
        deadline = time.monotonic() + timeout + self.config.wait_for_database
        while not self._ended.is_set():
            if all(c.observability.health.running for c in self._components.values()):
                self._running = True
                log.info("outbox: producer, consumer and handler running")
                return
            if time.monotonic() > deadline:
                self.stop()
                raise OutboxError(f"the components did not start within {timeout:g}s")
            self._ended.wait(0.05)
        self.stop()  # raises the error that ended a component

    def _preflight(self) -> None:
        """The components' start-up checks, in the caller's thread: an unreachable or
        unmigrated database, an unreachable transport, a registry that cannot run, each raise
        here, before any thread starts. (Each component checks again as it starts.) With
        several databases, a database that fails is that database's problem, as in the
        daemons: logged and retried."""
        self.app.check_transport(consumer=True)
        for name in ("producer", "consumer", "handler"):
            self._components[name].check()

    def interrupt(self) -> None:
        """Asked to stop from another thread (a signal handler): while `start()` is still
        checking or waiting for the database, end that now (start returns, nothing runs);
        once started, do nothing, and let the caller's `stop()` drain in order."""
        if not self._running:
            for component in self._components.values():
                component.stop()

    def live(self) -> tuple[bool, str]:
        """(alive, reason) as the process's `/livez`: every component's loop made progress."""
        return _AllHealthy(self._components).live()

    def ready(self) -> tuple[bool, str]:
        """(ready, reason) as the process's `/readyz`: every component runs and its PostgreSQL
        and transport checks pass. The checks run only with a health port (0: any free one);
        without, this says "dependencies not checked yet"."""
        return _AllHealthy(self._components).ready()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a component ends (an error, or `stop()`); True when one did."""
        return self._ended.wait(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """Drain and stop: the consumer first, then the producer and the handler finish the
        batch in hand. Raises the error a component stopped with, if any."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._drain(timeout)
        if self._errors:
            # As the component raised it: `outbox run` words it as that daemon's process would.
            raise self._errors[0][1]

    def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        consumer = self._threads.get("consumer")
        self.consumer.stop()
        if consumer is not None:
            consumer.join(max(0.0, deadline - time.monotonic()))
        self.producer.stop()
        self.handler.stop()
        for name, thread in self._threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("the %s did not stop within %gs", name, timeout)
        if self._health_server is not None:
            self._health_server.stop()
        log.info("outbox: producer, consumer and handler stopped")
        if self._metrics_server is not None:
            server, thread = self._metrics_server
            server.shutdown()
            server.server_close()
            thread.join(5)

    def _main(self, name: str, component: Part) -> None:
        try:
            component.run()
        except BaseException as exc:
            self._errors.append((name, exc))
            if self.log_failures and len(self._errors) == 1:
                log.error("the %s stopped: %s; stopping the others", name, exc)
            for other in self._components.values():
                other.stop()
        finally:
            self._ended.set()

    def _serve(self) -> None:
        config = self.config
        if config.health_port is not None:
            self._health_server = HealthServer(
                _AllHealthy(self._components), config.health_host, config.health_port
            )
            self._health_server.start()
            self.health_port = self._health_server.port
        if config.metrics_port is not None:
            from outbox.observability.metrics import _import_prometheus

            prometheus = _import_prometheus()
            registry = prometheus.CollectorRegistry(auto_describe=False)
            registry.register(_AllMetrics(self._components))
            try:
                self._metrics_server = prometheus.start_http_server(
                    config.metrics_port, addr=config.metrics_host, registry=registry
                )
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot serve metrics on {config.metrics_host}:{config.metrics_port}: "
                    f"{exc.strerror or exc}"
                ) from None
            self.metrics_port = int(self._metrics_server[0].server_address[1])

    # -- with / async with ----------------------------------------------------------------------

    def __enter__(self) -> OutboxRuntime:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> OutboxRuntime:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
