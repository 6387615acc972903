"""The composition root: the one place that turns `Settings` into running parts.

`App(settings, handlers)` builds a producer, a consumer, a handler (or, through
`outbox.runtime.OutboxRuntime`, all three), over one database or many, on any transport of the
registry (outbox/transports.py). It is the only module that imports both a daemon and an
adapter: it gives the daemons their stores (PostgreSQL's unless told otherwise), the
publisher or subscriber factory of the transport, its probe, and an `Observer` whose database
probe is PostgreSQL's. The `outbox` command, `OutboxRuntime`, `outbox.testing.drain` and the
benchmarks ask it; none of them builds a daemon.

Building checks what can be checked without I/O (a required setting missing, settings that
cannot go together), each a `ConfigurationError` of one line. What needs a server (a database
reachable and migrated, the transport reachable) is each part's `check()`, and
`check_transport()` for a transport kept in a database (the PostgreSQL log).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from outbox import settings as env
from outbox import transports
from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError
from outbox.core.handlers import Handlers, load_handlers
from outbox.core.headers import TENANT_HEADER
from outbox.core.redact import remember_secrets, secrets_of_url
from outbox.daemons.budget import Budget
from outbox.daemons.consumer import Consumer, Subscription
from outbox.daemons.handler.config import check_async_support
from outbox.daemons.handler.runner import HandlerRunner
from outbox.daemons.handler.slots import WorkerSlots
from outbox.daemons.producer import Producer, SharedPublisher
from outbox.daemons.routing import Routing
from outbox.daemons.supervisor import DatabaseRelay, Supervisor
from outbox.daemons.turns import Turns
from outbox.observability.runtime import Observability, ObservabilityConfig, Observer
from outbox.ports import (
    ActivityWatches,
    DatabaseProbes,
    InboxWriters,
    PublisherFactory,
    RelayStores,
    SubscriberFactory,
    TransportProbe,
)
from outbox.runtime.settings import Settings

__all__ = ["App", "InMemory", "Kind", "Part", "Stores", "Supervised", "postgres_stores"]

log = logging.getLogger("outbox")

Kind = Literal["producer", "consumer", "handler"]
R = TypeVar("R", bound=DatabaseRelay)


@dataclass(frozen=True)
class Stores:
    """What the daemons store through and how their probes see a database (the ports of
    outbox.ports): the relays' queues, the consumer's inboxes, the databases' probe (None:
    readiness and queue gauges not checked)."""

    relays: RelayStores
    inboxes: InboxWriters
    probes: DatabaseProbes | None = None
    #: What wakes the parked relays of many databases (None: they look on their own schedule).
    activity: ActivityWatches | None = None


def postgres_stores() -> Stores:
    """PostgreSQL's stores and probe (outbox/postgres/): what the daemons use unless told."""
    from outbox.postgres.activity import PostgresActivity
    from outbox.postgres.inbox import PostgresInbox, PostgresInboxWriter
    from outbox.postgres.probes import PostgresProbe
    from outbox.postgres.relay_stores import PostgresOutbox

    return Stores(
        relays=RelayStores(outbox=PostgresOutbox, inbox=PostgresInbox),
        inboxes=PostgresInboxWriter,
        probes=PostgresProbe,
        activity=PostgresActivity,
    )


class Part(Protocol):
    """What `outbox producer`, `consumer` or `handler` runs (`outbox run` runs three): one
    daemon, or a relay per database under a supervisor."""

    @property
    def observability(self) -> Observability: ...

    def check(self) -> None:
        """Fail fast with one clear error on what no retry can fix (see each daemon)."""
        ...

    def run(self) -> None:
        """Check, then work until `stop()`; raise what stopped it otherwise."""
        ...

    def stop(self) -> None:
        """Finish the batch in hand, then return from `run`."""
        ...


class Supervised(Generic[R]):
    """A relay per database under a `Supervisor` (outbox/daemons/supervisor.py), as one part:
    the process-wide checks (`checks`), and for the producer the one transport publisher its
    relays share, made when it runs and closed when it stops."""

    def __init__(
        self,
        supervisor: Supervisor[R],
        observability: Observability,
        checks: Sequence[Callable[[], None]] = (),
        publishers: PublisherFactory | None = None,
    ) -> None:
        self.supervisor = supervisor
        self._observability = observability
        self._checks = list(checks)
        self._publishers = publishers
        #: The publisher the producers share while running.
        self.publisher: SharedPublisher | None = None
        supervisor.observe(observability)

    @property
    def observability(self) -> Observability:
        return self._observability

    def check(self) -> None:
        """The process's checks (the transport, the registry); a database that fails is that
        database's problem, logged and retried (see the supervisor)."""
        for check in self._checks:
            check()

    def run(self) -> None:
        self.check()
        if self._publishers is not None:
            # A publisher failure that retrying cannot fix is the process's: the supervisor stops.
            self.publisher = SharedPublisher(self._publishers(), self.supervisor.fail)
        try:
            self.supervisor.run()
        finally:
            if self.publisher is not None:
                self.publisher.close()

    def stop(self) -> None:
        self.supervisor.stop()

    def relays(self) -> list[R]:
        """The relays running now (for tests and benchmarks)."""
        return self.supervisor.relays()


@dataclass(frozen=True)
class InMemory:
    """The in-memory stores and transport of an `App.in_memory()`: what a test sends into
    (`outbox.send(...)`), reads back (`inbox.effects`, `inbox.processed`) and inspects."""

    outbox: Any  # outbox.testing.stores.MemoryOutbox
    inbox: Any  # outbox.testing.stores.MemoryInbox
    transport: Any  # outbox.testing.memory.InMemoryTransport


class App:
    """Turns one `Settings` into running parts (see the module).

    `handlers` is the Handlers registry (or its "module:attribute") of the handler and of the
    consumer that feeds it. `stores` overrides PostgreSQL's stores (an in-memory store in a
    test); `publishers` and `subscribers` (with their transport's `probe`) override the
    registered transport's (`outbox.testing.drain` counts what passes through them).
    """

    def __init__(
        self,
        settings: Settings,
        handlers: Handlers | str | None = None,
        *,
        stores: Stores | None = None,
        publishers: PublisherFactory | None = None,
        subscribers: SubscriberFactory | None = None,
        probe: TransportProbe | None = None,
    ) -> None:
        self.settings = settings
        self._handlers = handlers
        self._stores = stores
        self._publishers = publishers
        self._subscribers = subscribers
        self._probe = probe
        self._transport: transports.Transport[Any] | None = None
        #: The in-memory stores and transport of `App.in_memory()` (None otherwise).
        self.memory: InMemory | None = None
        self._budget: Budget | None = None
        for database in settings.databases.fixed:
            remember_secrets(secrets_of_url(database.url))
        self._entry: transports.Transport[Any] | None = None

    @classmethod
    def in_memory(
        cls,
        handlers: Handlers | str | None = None,
        *,
        group: str = "memory",
        topics: Sequence[str] = (),
        settings: Settings | None = None,
    ) -> App:
        """The same parts over in-memory stores and transport (outbox.testing), for a user's
        unit tests: no server, one process. Send into `app.memory.outbox`, build the parts
        with `producer()`, `consumer()` and `handler()` as usual, and read what the callbacks
        wrote in `app.memory.inbox`. `settings` gives the daemons' tuning (its databases and
        transport are replaced)."""
        from outbox.runtime.settings import Databases
        from outbox.testing.memory import InMemoryTransport
        from outbox.testing.stores import MemoryInbox, MemoryOutbox

        memory = InMemory(MemoryOutbox(), MemoryInbox(), InMemoryTransport())
        base = settings or Settings()
        chosen = dataclasses.replace(
            base,
            databases=Databases.of("memory=postgresql://memory/memory", schema="outbox"),
            group=group,
            topics=tuple(topics) or base.topics,
        )
        stores = Stores(
            relays=RelayStores(
                outbox=memory.outbox.stores().outbox, inbox=memory.inbox.stores().inbox
            ),
            inboxes=memory.inbox.writers(),
        )
        app: App

        def subscriber() -> Any:
            subscription = app.subscription()
            return memory.transport.subscriber(subscription.topics, subscription.group)

        app = cls(
            chosen,
            handlers,
            stores=stores,
            publishers=memory.transport.publisher,
            subscribers=subscriber,
        )
        app.memory = memory
        return app

    # -- what the parts share --------------------------------------------------------------

    @property
    def stores(self) -> Stores:
        """The stores the daemons use (PostgreSQL's unless given)."""
        if self._stores is None:
            self._stores = postgres_stores()
        return self._stores

    @property
    def handlers(self) -> Handlers:
        """The Handlers registry (imported once, when given as "module:attribute")."""
        if self._handlers is None:
            raise ConfigurationError("the handler needs a Handlers registry (MODULE:ATTRIBUTE)")
        if isinstance(self._handlers, str):
            self._handlers = load_handlers(self._handlers)
        return self._handlers

    def databases(self) -> list[Database]:
        """The databases to serve now (the file's read), each one's secrets remembered."""
        listed = self.settings.databases.listed()
        for database in listed:
            remember_secrets(secrets_of_url(database.url))
        return listed

    def transport(self, *, consumer: bool = False) -> transports.Transport[Any]:
        """The registered transport of the settings (asked of the registry once), its
        endpoint given and, for a `consumer`, settings it can honour; one
        `ConfigurationError` otherwise."""
        found = self.settings.transport
        transport = self._transport or self._registered()
        if consumer:
            if found.start not in (None, "earliest") and "start" not in transport.features:
                able = " and ".join(t.label for t in transports.entries("start")) or "no transport"
                raise ConfigurationError(
                    f"--start applies to {able} only (not to --transport {transport.name})"
                )
            transport.check_consumer(self.transport_options)
        if self._transport is None:
            for flag in found.unused:
                log.warning(
                    "%s is set but the transport is %s: it is not used (--transport, or %s, "
                    "chooses the transport)",
                    flag,
                    transport.name,
                    env.TRANSPORT,
                )
            if not transport.endpoint(self.transport_options):
                raise ConfigurationError(
                    f"{transport.endpoint_flag} is required (or set {transport.endpoint_env})"
                )
            self._transport = transport
        return transport

    def _registered(self) -> transports.Transport[Any]:
        """The registry's entry of the settings' transport, asked for once; the secrets it
        declares of its options are remembered then (masked in every line printed after)."""
        if self._entry is None:
            self._entry = transports.get(
                self.settings.transport.name, what="--transport", hint=f" (from {env.TRANSPORT}?)"
            )
            found = self.settings.transport
            options = found.options if found.options is not None else self._entry.options_of({})
            remember_secrets(self._entry.secrets(options))
        return self._entry

    @property
    def transport_options(self) -> Any:
        """The options of the settings' transport (its defaults when none are given), which
        only its registry entry reads."""
        found = self.settings.transport
        return found.options if found.options is not None else self._registered().options_of({})

    def check_transport(self, *, consumer: bool = False) -> None:
        """The start-up check of the transport (the PostgreSQL log: reachable and migrated,
        waited for up to `--wait-for-database`); nothing for a transport given as factories."""
        if self._publishers is None and self._subscribers is None:
            self.transport(consumer=consumer).check(
                self.transport_options, self.settings.observability.wait_for_database
            )

    def observer(self, kind: Kind, **shown: Any) -> Observer:
        """How a daemon of `kind` is observed: the settings' metrics and health, PostgreSQL's
        probe of its database, and the transport's settings in force for its start-up line."""
        found = self.settings.transport
        described: dict[str, Any] = {}
        if kind != "handler" and self._publishers is None and self._subscribers is None:
            described["transport"] = found.name
            described.update(
                self.transport().in_force(self.transport_options, kind, self.settings.group)
            )
            if kind == "consumer" and found.start is not None:
                described["start"] = found.start
        described.update(shown)
        return Observer(
            config=self.settings.observability, probes=self.stores.probes, shown=described
        )

    # -- one daemon ------------------------------------------------------------------------

    def _one(self, database: Database | None) -> Database:
        if database is not None:
            return database
        listed = self.databases()
        if len(listed) > 1 or self.settings.databases.file:
            raise ConfigurationError(
                "these settings name several databases: run a relay per database with "
                "App.part(...), or give the database"
            )
        return listed[0]

    def _publishing(self) -> tuple[PublisherFactory, TransportProbe | None]:
        if self._publishers is not None:
            return self._publishers, self._probe
        return self.transport().make_publishers(self.transport_options)

    def producer(self, database: Database | None = None) -> Producer:
        """The Producer relay of `database` (default: the one database of the settings)."""
        database = self._one(database)
        publishers, probe = self._publishing()
        return Producer(
            self.settings.producer,
            publishers,
            probe,
            stores=self.stores.relays,
            database=database,
            observer=self.observer("producer"),
        )

    def subscription(self) -> Subscription:
        """What the consumer reads: the settings' topics, else the registry's; as `group`."""
        group = self.settings.group
        if not group:
            raise ConfigurationError(f"--group is required (or set {env.GROUP})")
        handled = list(self.handlers.topics) if self._handlers is not None else None
        topics = list(self.settings.topics) or list(handled or [])
        if not topics:
            raise ConfigurationError(
                "the handlers read no topic and no topics were given (a service that only "
                "sends runs `outbox producer`)"
            )
        return Subscription(group=group, topics=topics, handled=handled)

    def budget(self) -> Budget | None:
        """The process's connection budget, shared by every part this app makes (None: no
        `max_connections`, or one database alone)."""
        databases = self.settings.databases
        if self._budget is None and databases.max_connections and databases.routed:
            self._budget = Budget(databases.max_connections)
        return self._budget

    def routing(self) -> Routing | None:
        """The consumer's routing over the databases (None: one database, no routing)."""
        databases = self.settings.databases
        if not databases.routed:
            return None
        dedicated = databases.quarantine_database()
        if dedicated is not None:
            remember_secrets(secrets_of_url(dedicated.url))
        return Routing(
            databases=tuple(self.databases()),
            header=databases.route_header or TENANT_HEADER,
            quarantine=None if dedicated is not None else databases.quarantine,
            dedicated=dedicated,
            fixed=databases.fixed,
            databases_file=databases.file,
            schema=databases.schema,
            budget=self.budget(),
        )

    def consumer(self) -> Consumer:
        """The Consumer: of the one database, or routing over several (`Databases.routed`)."""
        subscription = self.subscription()
        routing = self.routing()
        database = None if routing is not None else self._one(None)
        if self._subscribers is not None:
            subscribers, probe = self._subscribers, self._probe
        else:
            subscribers, probe = self.transport(consumer=True).make_subscribers(
                self.transport_options,
                subscription.group,
                subscription.topics,
                self.settings.transport.start,
            )
        shown: dict[str, Any] = {"group": subscription.group, "topics": subscription.topics}
        if routing is not None:
            shown["routing"] = repr(routing)
        consumer = Consumer(
            self.settings.consumer,
            subscribers,
            probe,
            subscription=subscription,
            inbox=self.stores.inboxes,
            database=database,
            routing=routing,
            observer=self.observer("consumer", **shown),
        )
        self._export_budget(consumer.observability)
        return consumer

    def handler(self, database: Database | None = None) -> HandlerRunner:
        """The Handler of `database` (default: the one database of the settings)."""
        return HandlerRunner(
            self.settings.handler,
            self.handlers,
            stores=self.stores.relays,
            database=self._one(database),
            observer=self.observer("handler"),
        )

    # -- what a process runs ---------------------------------------------------------------

    def part(self, kind: Kind) -> Part:
        """What `outbox KIND` runs: the daemon of the one database, or with several databases
        (or a databases file) a relay per database under a supervisor (the consumer routes)."""
        if kind == "consumer":
            return self.consumer()
        if not self.settings.databases.several:
            return self.producer() if kind == "producer" else self.handler()
        if kind == "producer":
            return self._producers()
        return self._handlers_part()

    def _supervisor(
        self, kind: Kind, make: Callable[[Database], R], serve: Callable[[R], None]
    ) -> Supervisor[R]:
        databases = self.settings.databases
        tuning = self.settings.producer if kind == "producer" else self.settings.handler
        activity = self.stores.activity
        return Supervisor(
            kind,
            self.databases(),
            make,
            serve,
            turns=Turns(databases.turns),
            idle_disconnect=databases.idle_disconnect or None,
            file=databases.file,
            fixed=databases.fixed,
            default_schema=databases.schema,
            activity=None if activity is None else activity(tuning.connect_timeout),
            watch_interval=tuning.poll_interval,
            budget=self.budget(),
        )

    def _of_many(self) -> App:
        """This app for the relay of one database among several: no observability of its own
        (the process's serves them all; waiting for a database is the supervisor's); its
        registry, stores and transport shared."""
        quiet = App(
            dataclasses.replace(self.settings, observability=ObservabilityConfig()),
            self._handlers,
            stores=self.stores,
            publishers=self._publishers,
            subscribers=self._subscribers,
            probe=self._probe,
        )
        quiet._transport = self._transport
        quiet._entry = self._entry
        quiet._budget = self.budget()
        return quiet

    def _producers(self) -> Supervised[Producer]:
        """One Producer relay per database, one transport publisher for all."""
        publishers, probe = self._publishing()
        quiet = self._of_many()
        holder: list[Supervised[Producer]] = []

        def make(database: Database) -> Producer:
            return Producer(
                quiet.settings.producer,
                publishers,
                stores=quiet.stores.relays,
                database=database,
                observer=quiet.observer("producer"),
            )

        def serve(relay: Producer) -> None:
            publisher = holder[0].publisher
            assert publisher is not None, "the publisher is made when the part runs"
            relay.serve_database(publisher)

        supervisor = self._supervisor("producer", make, serve)
        checks = (
            [] if probe is None else [lambda: probe.check(self.settings.producer.connect_timeout)]
        )
        part = Supervised(
            supervisor,
            Observability(
                "producer",
                self.observer("producer"),
                tuning=self.settings.producer,
                heartbeat=supervisor.heartbeat,
                relay_id=self.settings.producer.relay_id,
                transport=probe,
                databases=supervisor.databases,
                parked=supervisor.parked,
            ),
            checks,
            publishers,
        )
        holder.append(part)
        self._export_budget(part.observability)
        return part

    def _export_budget(self, observability: Observability) -> None:
        """The budget and who holds it in `observability`'s metrics and /readyz (the
        supervisors' /readyz lines end with it; the consumer's is it)."""
        budget = self.budget()
        if budget is not None and budget.size is not None:
            observability.metrics.connection_budget(
                budget.size, budget.holders, budget.reserved, budget.waiting
            )
            if observability.health.report is None:  # the consumer's: the supervisors' say it
                observability.health.report = budget.describe

    def _handlers_part(self) -> Supervised[HandlerRunner]:
        """One Handler relay (and its workers) per database."""
        handlers = self.handlers
        quiet = self._of_many()
        budget = self.budget()
        slots: WorkerSlots | None = None
        if budget is not None and budget.size is not None:
            # Under a budget the databases share --concurrency worker sessions (at most half
            # of the budget, so that relays keep connections of their own).
            size = max(1, min(self.settings.handler.concurrency, budget.size // 2))
            slots = WorkerSlots(budget, size)

        def make(database: Database) -> HandlerRunner:
            runner = quiet.handler(database)
            runner.slots = slots
            return runner

        supervisor = self._supervisor("handler", make, lambda relay: relay.serve_database())
        part = Supervised(
            supervisor,
            Observability(
                "handler",
                self.observer("handler"),
                tuning=self.settings.handler,
                heartbeat=supervisor.heartbeat,
                relay_id=self.settings.handler.relay_id,
                databases=supervisor.databases,
                parked=supervisor.parked,
            ),
            [lambda: check_async_support(handlers)],
        )
        self._export_budget(part.observability)
        return part
