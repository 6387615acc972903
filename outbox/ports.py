"""The small contracts the daemons are written against, and the only way they reach a transport.

Adapters: outbox/kafka/, outbox/pglog/ (a log in PostgreSQL) and outbox/testing/memory.py. The
daemons call exactly `Publisher.publish`, `Subscriber.poll`, `Subscriber.commit` and `close`,
with the core batch types of outbox/core/batches.py, and every transport passes the same
contract suite of those calls (tests/transport/). Which transport runs is chosen by the wiring
(outbox/transports.py, the CLI), which passes the daemons factories.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from outbox.core.batches import InboxBatch, OutgoingRecord, Quarantined
from outbox.core.lag import GroupLag


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """Why one message was not delivered; `permanent` means retrying cannot help."""

    error: str
    permanent: bool = False


class Publisher(Protocol):
    """Sends records to the transport and reports, per record, whether it was acknowledged.

    `publish` returns only when every record of the batch has a definite outcome: None for
    acknowledged (durably stored by the transport), or a `DeliveryFailure`. Results are in the
    order of the input. Records of one key reach the transport in the order given. A record
    whose stored headers are not outbox's form fails permanently, alone.
    """

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        """Send a batch; one result per record, in order. `meanwhile`, when given, is called
        once, after the batch was handed over and before its outcomes are awaited: the caller's
        chance to work while the batch is on its way (the relay fetches its next batch)."""
        ...

    def close(self) -> None:
        """Flush what is pending and release the connection."""
        ...


class Subscriber(Protocol):
    """Reads the topics it was created for as a member of one consumer group.

    `poll` returns records in partition order (a key's records in the order they were
    published) as an `InboxBatch`, decoded by outbox's wire codec. A group's position moves on
    only through `commit`: a new subscriber of the group starts after the last committed record
    of each partition, so records polled but never committed are delivered again. Several
    groups each receive every record.
    """

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        """Wait up to `timeout` seconds for a record, then return it and what else is already
        there, up to `max_records`; empty when nothing arrived."""
        ...

    def commit(self, batch: InboxBatch) -> None:
        """Record that `batch` is stored: the group resumes after its last record of each
        partition (`InboxBatch.next_offsets`).

        Best effort: a lost commit (logged) only means a redelivery, which the inbox absorbs.
        """
        ...

    def close(self) -> None:
        """Leave the group and release the connection; uncommitted records stay for others."""
        ...


@dataclass(frozen=True, slots=True)
class TransportProbe:
    """How a daemon checks that its transport is reachable: `check(timeout)` raises an
    `OutboxError` saying why not. `name` keys the dependency in health reports ("kafka"),
    `label` names it in their text ("Kafka")."""

    name: str
    label: str
    check: Callable[[float], None]


PublisherFactory = Callable[[], Publisher]
SubscriberFactory = Callable[[], Subscriber]


# -- the consumer side: inbox writer and lag


class InboxSession(Protocol):
    """One open connection to an inbox, used by one thread at a time.

    Each statement is atomic on its own: what it stored is committed when it returns. A
    statement the database refuses for its data (`outbox.core.retriable.refused_for_data`)
    leaves the session usable; anything else may leave it unusable (`usable`).
    """

    @property
    def usable(self) -> bool:
        """Neither closed nor lost: another statement may run on it."""
        ...

    def insert(
        self, batch: InboxBatch, meanwhile: Callable[[], None] | None = None
    ) -> Counter[str]:
        """Store the ordinary records of `batch`, once per message id (a duplicate is not
        stored again), and wake a sleeping Handler; the rows stored per topic. `meanwhile`,
        when given, is called once, after the statement was sent and before its outcome is
        awaited (and before it commits)."""
        ...

    def quarantine(self, records: Sequence[Quarantined]) -> Counter[str]:
        """Store records that cannot be ordinary rows as dead rows with their reason, once per
        message id; the rows stored per topic."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class InboxWriter(Protocol):
    """One inbox (a database and its schema) as the Consumer stores batches in it."""

    def connect(self, *, checked: bool = False) -> InboxSession:
        """A new session, or the driver's error if the database cannot be reached (retriable
        per `outbox.core.retriable`). `checked`: the schema's version is checked too
        (`SchemaNotMigrated`, `OutboxError`)."""
        ...

    def check(
        self,
        *,
        wait: float = 0.0,
        stopping: Callable[[], bool] = lambda: False,
        attempt: Callable[[], None] = lambda: None,
    ) -> None:
        """Fail fast with one clear `OutboxError` on an unreachable database or a schema not
        migrated. With `wait` > 0 an unreachable database is waited for, with backoff, up to
        `wait` seconds or until `stopping()`; `attempt()` is called before each connection."""
        ...


class InboxWriters(Protocol):
    """Makes the `InboxWriter` of one database: the wiring chooses the store (PostgreSQL's,
    outbox.postgres.inbox_writer, or an in-memory one in tests)."""

    def __call__(self, url: str, schema: str, *, connect_timeout: float) -> InboxWriter: ...


class LagReader(Protocol):
    """Reads the lag of consumer groups from a transport (Kafka, the PostgreSQL log).

    `lag` returns one `GroupLag` per group: of the groups given, in their order and each once,
    or of every group the transport knows when `groups` is None. A group that cannot be read
    carries its `error` rather than failing the others; a transport that cannot be reached at
    all raises.
    """

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        """The lag of `groups` (every group when None)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
