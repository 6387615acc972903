"""The one typed settings object of a process of outbox daemons.

`Settings` holds everything the composition root (`outbox.runtime.App`) needs to build a
producer, a consumer, a handler or all three: the databases served, the transport and where it
is, the consumer group and topics, each daemon's tuning and the observability settings. The
`outbox` command fills it from its flags, their `OUTBOX_*` variables and the files they name
(`outbox.cli.arguments.settings_of`); a Python caller builds it directly. Every part is a
frozen dataclass validated at construction, so a bad value fails where it is given, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outbox.core.databases import (
    Database,
    check_distinct,
    gather,
    parse_entry,
    read_file,
    validate_name,
)
from outbox.core.databases import validate_schema as _validate_schema
from outbox.core.errors import ConfigurationError
from outbox.core.headers import validate_tenant_header
from outbox.core.numbers import check_fields
from outbox.core.topics import validate_topic
from outbox.daemons.consumer import ConsumerConfig
from outbox.daemons.handler.config import HandlerConfig
from outbox.daemons.producer import ProducerConfig
from outbox.observability.runtime import ObservabilityConfig
from outbox.transports import TransportSettings

__all__ = [
    "ConsumerConfig",
    "Databases",
    "HandlerConfig",
    "ObservabilityConfig",
    "ProducerConfig",
    "Settings",
    "TransportSettings",
]


@dataclass(frozen=True)
class Databases:
    """The databases a process serves, and how it shares itself among several.

    With several databases (or a databases file) the producer and the handler run a relay per
    database under a supervisor, and the consumer routes each record to the database its tenant
    header names (docs/how-to/many-databases.md). One database alone runs as it always did.
    """

    #: The databases given one by one, each `[NAME[/SCHEMA]=]URL` (`Databases.of` parses them).
    fixed: tuple[Database, ...] = ()
    #: A file of more databases, one entry per line, re-read while the daemons run.
    file: str | None = None
    #: The schema of the outbox tables of an entry that names none.
    schema: str = "outbox"
    #: With several databases: how many process a batch at the same time.
    turns: int = 2
    #: With several databases: seconds without rows after which a relay parks (0: never).
    idle_disconnect: float = 60.0
    #: With several databases: the most connections the process holds to them at once
    #: (outbox/daemons/budget.py), shared by its daemons; 0: unlimited. At least 2.
    max_connections: int = 0
    #: The header naming a record's database (tenant); given, routing is on with one database too.
    route_header: str | None = None
    #: When routing: the database that stores what cannot be routed, the NAME of one served or
    #: a database of its own (`NAME[/SCHEMA]=URL`, `quarantine_database`). Required when the
    #: consumer routes (`routed`): None is refused at start-up, not guessed.
    quarantine: str | None = None

    def __post_init__(self) -> None:
        _validate_schema(self.schema)
        check_fields(
            self,
            {
                "turns": "threads",
                "idle_disconnect": "seconds_or_zero",
                "max_connections": "count_or_zero",
            },
        )
        if self.max_connections == 1:
            raise ConfigurationError(
                "max_connections must be 0 (unlimited) or at least 2 (a handler's relay and "
                "one worker), got 1"
            )
        if self.route_header is not None:
            validate_tenant_header(self.route_header)
        if self.quarantine is not None and self.quarantine_database() is None:
            validate_name(self.quarantine)

    def quarantine_database(self) -> Database | None:
        """The quarantine database when it is one of its own (`quarantine` is an entry,
        `NAME[/SCHEMA]=URL`): it stores only what cannot be routed and its NAME is no tenant.
        None when `quarantine` names one of the databases served (or is not given)."""
        if self.quarantine is None or not ("=" in self.quarantine or "://" in self.quarantine):
            return None
        return parse_entry(self.quarantine, self.schema, source="--quarantine-database")

    @classmethod
    def of(cls, *entries: str, schema: str = "outbox", file: str | None = None) -> Databases:
        """The databases of `entries` (each `[NAME[/SCHEMA]=]URL`, as `--database-url` takes
        them) and `file`."""
        return cls(fixed=tuple(gather(list(entries), schema)), file=file, schema=schema)

    def listed(self) -> list[Database]:
        """The databases to serve now: the fixed ones, then the file's; a `ConfigurationError`
        when there are none."""
        from_file = read_file(self.file, self.schema) if self.file else []
        databases = check_distinct([*self.fixed, *from_file])
        if databases:
            return databases
        if self.file:
            raise ConfigurationError(f"the databases file {self.file!r} lists no database")
        raise ConfigurationError(
            "--database-url is required (or --databases-file, or set OUTBOX_DATABASE_URL)"
        )

    @property
    def several(self) -> bool:
        """Whether the relays serve several databases (a file may grow: it counts as several):
        a relay per database under a supervisor. One database alone runs as it always did."""
        return len(self.fixed) > 1 or bool(self.file)

    @property
    def routed(self) -> bool:
        """Whether the consumer routes records to databases by their tenant header."""
        return self.several or self.route_header is not None or self.quarantine is not None


@dataclass(frozen=True)
class Settings:
    """Everything a process of outbox daemons runs with (see the module)."""

    #: The databases served (`Databases`).
    databases: Databases = field(default_factory=Databases)
    #: The transport, where it is and how the daemons use it (`TransportSettings`).
    transport: TransportSettings = field(default_factory=TransportSettings)
    #: The consumer's group.
    group: str = ""
    #: The topics the consumer reads; empty: those of the Handlers registry it feeds.
    topics: tuple[str, ...] = ()
    #: The Producer's tuning (`ProducerConfig`).
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    #: The Consumer's tuning (`ConsumerConfig`).
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    #: The Handler's tuning (`HandlerConfig`).
    handler: HandlerConfig = field(default_factory=HandlerConfig)
    #: Metrics, health and start-up settings (for `outbox run`, the process's one port).
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        for topic in self.topics:
            validate_topic(topic)
