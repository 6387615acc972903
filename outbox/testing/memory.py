"""An in-memory transport for fast unit tests: Kafka's semantics, in this process's memory.

`InMemoryTransport` keeps topics of ordered partitions with offsets, places a keyed record in
the partition Kafka's default partitioner would (murmur2, as the Java client and outbox's
relay), and keeps consumer groups with committed offsets. `InMemoryPublisher` and
`InMemorySubscriber` implement the `Publisher` and `Subscriber` ports over it and pass the
same contract suite as Kafka (tests/transport/). It is for tests and examples in one process;
it never replaces the end-to-end tests against a real broker.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.core.batches import InboxBatch, OutgoingRecord
from outbox.core.envelope import InboxRow
from outbox.core.errors import ConfigurationError, InvalidHeaders
from outbox.core.lag import GroupLag, PartitionLag
from outbox.core.partitioning import murmur2, partition_for
from outbox.core.text import storable
from outbox.core.topics import validate_topic
from outbox.core.wire import as_bytes, decode_record
from outbox.ports import (
    ArgumentAdder,
    DeliveryFailure,
    FixtureSource,
    Publisher,
    PublisherFactory,
    Role,
    Subscriber,
    SubscriberFactory,
    Transport,
    TransportProbe,
    TransportSettings,
)

__all__ = [
    "MEMORY",
    "InMemoryPublisher",
    "InMemorySubscriber",
    "InMemoryTransport",
    "MemoryOptions",
    "Record",
    "murmur2",
    "partition_for",
]

#: librdkafka's default `message.max.bytes`: a larger record is refused, permanently.
DEFAULT_MAX_MESSAGE_BYTES = 1_000_000


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a topic partition, as a broker keeps it (headers in their wire form)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int

    def to_inbox_row(self) -> InboxRow:
        """The row the inbox stores for this record (the same decoding as for Kafka)."""
        return decode_record(
            topic=self.topic,
            partition=self.partition,
            offset=self.offset,
            key=self.key,
            value=self.value,
            headers=self.headers,
            timestamp_ms=self.timestamp_ms,
        )


@dataclass
class _Group:
    """A consumer group: its members (subscriber id -> topics) and committed offsets."""

    members: dict[int, tuple[str, ...]] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    generation: int = 0


class InMemoryTransport:
    """Topics, partitions, offsets and consumer groups in memory; safe to share between threads.

    Topics are created on first publish with `default_partitions` (as brokers that auto-create
    topics do), or beforehand with `create_topic`. A record larger than `max_message_bytes` is
    refused with a permanent `DeliveryFailure`, as Kafka refuses it.
    """

    def __init__(
        self,
        *,
        default_partitions: int = 3,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if default_partitions < 1:
            raise ConfigurationError(f"default_partitions must be >= 1, got {default_partitions}")
        self.default_partitions = default_partitions
        self.max_message_bytes = max_message_bytes
        self._topics: dict[str, list[list[Record]]] = {}
        self._groups: dict[str, _Group] = {}
        self._failures: dict[str, DeliveryFailure] = {}
        self._changed = threading.Condition()
        self._member_ids = itertools.count(1)
        self._random = random.Random()

    # -- topics --------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 3) -> None:
        """Create a topic; a ValueError if it exists (as Kafka's TOPIC_ALREADY_EXISTS)."""
        validate_topic(name)
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        with self._changed:
            if name in self._topics:
                raise ValueError(f"topic {name!r} already exists")
            self._topics[name] = [[] for _ in range(partitions)]
            self._changed.notify_all()

    @property
    def topics(self) -> list[str]:
        """The topics that exist, sorted."""
        with self._changed:
            return sorted(self._topics)

    def partitions(self, topic: str) -> int:
        """The number of partitions of `topic`; KeyError if it does not exist."""
        with self._changed:
            return len(self._topics[topic])

    def records(self, topic: str) -> list[Record]:
        """Every record of `topic` (empty if it does not exist), by partition, then offset."""
        with self._changed:
            return [r for partition in self._topics.get(topic, []) for r in partition]

    def fail_topic(self, topic: str, failure: DeliveryFailure | None) -> None:
        """Make every publish to `topic` fail with `failure` (None: accept them again)."""
        with self._changed:
            if failure is None:
                self._failures.pop(topic, None)
            else:
                self._failures[topic] = failure

    # -- groups --------------------------------------------------------------------------------

    def committed(self, group: str, topic: str, partition: int) -> int:
        """The offset `group` resumes from in a partition (0 when it never committed)."""
        with self._changed:
            state = self._groups.get(group)
            return state.committed.get((topic, partition), 0) if state else 0

    def lag(self, group: str, topics: Iterable[str]) -> int:
        """How many records of `topics` lie after `group`'s committed offsets."""
        with self._changed:
            state = self._groups.get(group) or _Group()
            return sum(
                len(records) - state.committed.get((topic, p), 0)
                for topic in topics
                for p, records in enumerate(self._topics.get(topic, []))
            )

    # -- clients -------------------------------------------------------------------------------

    def publisher(self) -> InMemoryPublisher:
        """A `Publisher` that appends to this transport."""
        return InMemoryPublisher(self)

    def subscriber(self, topics: Sequence[str], group: str) -> InMemorySubscriber:
        """A `Subscriber` joining `group` for `topics`."""
        return InMemorySubscriber(self, topics, group)

    # -- used by the clients -------------------------------------------------------------------

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Record | DeliveryFailure:
        """Store one record, or say why it was refused."""
        size = len(value) + len(key or b"") + sum(len(n) + len(v) for n, v in headers)
        if size > self.max_message_bytes:
            return DeliveryFailure(
                error=f"MSG_SIZE_TOO_LARGE: record of {size} bytes is larger than "
                f"max_message_bytes={self.max_message_bytes}",
                permanent=True,
            )
        with self._changed:
            failure = self._failures.get(topic)
            if failure is not None:
                return failure
            partitions = self._topics.setdefault(
                topic, [[] for _ in range(self.default_partitions)]
            )
            index = (
                partition_for(key, len(partitions))
                if key is not None
                else self._random.randrange(len(partitions))
            )
            record = Record(
                topic=topic,
                partition=index,
                offset=len(partitions[index]),
                key=key,
                value=value,
                headers=tuple(headers),
                timestamp_ms=int(time.time() * 1000),
            )
            partitions[index].append(record)
            self._changed.notify_all()
            return record

    def _join(self, group: str, topics: tuple[str, ...]) -> int:
        with self._changed:
            member = next(self._member_ids)
            state = self._groups.setdefault(group, _Group())
            state.members[member] = topics
            state.generation += 1
            return member

    def _leave(self, group: str, member: int) -> None:
        with self._changed:
            state = self._groups[group]
            if state.members.pop(member, None) is not None:
                state.generation += 1
                self._changed.notify_all()

    def _assignment(self, state: _Group, member: int) -> list[tuple[str, int]]:
        """The partitions of `member`: per topic, partition p goes to the (p mod n)-th of the
        n members subscribed to it (by join order). Call with the lock held."""
        assigned = []
        for topic in state.members[member]:
            subscribed = sorted(m for m, topics in state.members.items() if topic in topics)
            for p in range(len(self._topics.get(topic, []))):
                if subscribed[p % len(subscribed)] == member:
                    assigned.append((topic, p))
        return assigned

    def _commit(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        with self._changed:
            self._groups.setdefault(group, _Group()).committed.update(offsets)
            self._changed.notify_all()


class InMemoryPublisher:
    """A `Publisher` over an `InMemoryTransport`: records carry the same headers as on Kafka."""

    def __init__(self, transport: InMemoryTransport) -> None:
        self.transport = transport

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        """Append each record to its topic; one outcome per record, in order."""
        results: list[DeliveryFailure | None] = []
        for record in records:
            try:
                headers = as_bytes(record.wire_headers())
            except InvalidHeaders as exc:
                results.append(DeliveryFailure(error=storable(str(exc)), permanent=True))
                continue
            outcome = self.transport.append(record.topic, record.key, record.payload, headers)
            results.append(outcome if isinstance(outcome, DeliveryFailure) else None)
        if meanwhile is not None:
            meanwhile()
        return results

    def close(self) -> None:
        """Nothing is buffered: every publish is complete when it returns."""


class InMemorySubscriber:
    """A `Subscriber` over an `InMemoryTransport`: one member of a consumer group.

    Partitions are shared among the group's members; when members join or leave, every
    member starts again from the group's committed offsets (records polled but not committed
    are delivered again, as after a Kafka rebalance).
    """

    def __init__(self, transport: InMemoryTransport, topics: Sequence[str], group: str) -> None:
        if not group:
            raise ConfigurationError("a consumer group is required")
        for topic in topics:
            validate_topic(topic)
        self.transport = transport
        self.group = group
        self._member = transport._join(group, tuple(topics))
        self._generation = -1
        self._positions: dict[tuple[str, int], int] = {}
        self._closed = False

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        """Records after this member's positions, up to `max_records`, waiting up to `timeout`."""
        if self._closed:
            raise RuntimeError("poll() on a closed InMemorySubscriber")
        deadline = time.monotonic() + timeout
        transport = self.transport
        with transport._changed:
            while True:
                records = self._take(max_records)
                remaining = deadline - time.monotonic()
                if records or remaining <= 0:
                    break
                transport._changed.wait(remaining)
        batch = InboxBatch()
        add = batch.add
        for r in records:
            add(r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp_ms)
        return batch

    def _take(self, max_records: int) -> list[Record]:
        """Advance over the next records of the assigned partitions (lock held)."""
        state = self.transport._groups[self.group]
        if state.generation != self._generation:
            self._generation = state.generation
            self._positions.clear()
        taken: list[Record] = []
        for topic, p in self.transport._assignment(state, self._member):
            position = self._positions.get((topic, p))
            if position is None:
                position = state.committed.get((topic, p), 0)
            batch = self.transport._topics[topic][p][position : position + max_records - len(taken)]
            taken.extend(batch)
            self._positions[(topic, p)] = position + len(batch)
            if len(taken) >= max_records:
                break
        return taken

    def commit(self, batch: InboxBatch) -> None:
        """The group resumes after the last record of `batch` in each of its partitions."""
        self.transport._commit(self.group, batch.next_offsets())

    def close(self) -> None:
        """Leave the group; its partitions go to the other members."""
        if not self._closed:
            self._closed = True
            self.transport._leave(self.group, self._member)


# -- the registry's entry (outbox/transports.py) ----------------------------------------------


@dataclass(frozen=True)
class MemoryOptions:
    """The in-memory transport a process's daemons share (`transport`; None: one made for the
    process, `shared()`)."""

    transport: InMemoryTransport | None = None

    def resolved(self) -> InMemoryTransport:
        return self.transport if self.transport is not None else shared()


_SHARED: list[InMemoryTransport] = []
_SHARED_LOCK = threading.Lock()


def shared() -> InMemoryTransport:
    """The process's in-memory transport: the one `--transport memory` means."""
    with _SHARED_LOCK:
        if not _SHARED:
            _SHARED.append(InMemoryTransport())
        return _SHARED[0]


class _MemoryLag:
    """The in-memory transport's `LagReader`: the groups it knows, or those asked for."""

    def __init__(self, transport: InMemoryTransport) -> None:
        self._transport = transport

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        memory = self._transport
        with memory._changed:
            names = list(dict.fromkeys(groups)) if groups is not None else sorted(memory._groups)
            found = []
            for group in names:
                state = memory._groups.get(group) or _Group()
                # Every topic: a group that never committed lags by all of a topic's records.
                topics = sorted(memory._topics)
                found.append(
                    GroupLag(
                        group,
                        tuple(
                            PartitionLag(topic, p, state.committed.get((topic, p), 0), len(rows))
                            for topic in topics
                            for p, rows in enumerate(memory._topics.get(topic, []))
                        ),
                    )
                )
            return found

    def close(self) -> None:
        """Nothing to release."""


def _memory_options(values: Mapping[str, Any]) -> MemoryOptions:
    given = values.get("memory_transport")
    return MemoryOptions(given if isinstance(given, InMemoryTransport) else None)


def _memory_publishers(options: MemoryOptions) -> tuple[PublisherFactory, TransportProbe | None]:
    return options.resolved().publisher, None


def _memory_subscribers(
    options: MemoryOptions, group: str, topics: Sequence[str], start: str | None
) -> tuple[SubscriberFactory, TransportProbe | None]:
    memory = options.resolved()
    topic_list = list(topics)
    return (lambda: memory.subscriber(topic_list, group)), None


def _no_arguments(parser: ArgumentAdder, role: Role) -> None:
    """No flags: the transport lives in the process."""


def _nothing(options: MemoryOptions, *more: object) -> None:
    """Nothing to check: the transport is in the process."""


class MemoryUnderTest:
    """The in-memory transport for the contract suite: nothing crosses a process."""

    name = "memory"
    settle = 0.02  # everything published is there at once

    def __init__(self, request: FixtureSource | None = None) -> None:
        self.transport = InMemoryTransport()
        self._names = itertools.count()
        self._open: list[Any] = []

    def topic(self, partitions: int = 3) -> str:
        name = f"topic-{next(self._names)}"
        self.transport.create_topic(name, partitions)
        return name

    def publisher(self) -> Publisher:
        made = self.transport.publisher()
        self._open.append(made)
        return made

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        made = self.transport.subscriber(topics, group)
        self._open.append(made)
        return made

    def settings(self) -> TransportSettings:
        return TransportSettings(MEMORY.name, MemoryOptions(self.transport))

    def close_all(self) -> None:
        for client in reversed(self._open):
            with contextlib.suppress(RuntimeError):  # a client the test closed already
                client.close()


MEMORY: Transport[MemoryOptions] = Transport(
    name="memory",
    label="the in-memory transport",
    add_arguments=_no_arguments,
    options_of=_memory_options,
    # Always "given": it is where the process is.
    endpoint=lambda options: "memory",
    endpoint_flag="--transport memory",
    endpoint_dest="memory_transport",
    endpoint_env="",
    shown=lambda endpoint: endpoint,
    make_publishers=_memory_publishers,
    make_subscribers=_memory_subscribers,
    probe=lambda options: None,
    lag_reader=lambda options, timeout: _MemoryLag(options.resolved()),
    asyncapi_servers=lambda options: ({}, {}),
    check=_nothing,
    check_consumer=_nothing,
    lag_note="",
    max_lag_needs="",
    in_force=lambda options, kind, group: {},
    secrets=lambda options: (),
    # Its records never leave the process: no CLI daemon, no contract case across processes.
    features=frozenset(),
    contract=MemoryUnderTest,
)
