"""A transport defined only in the tests: an append-only log in a directory of files.

It is what a third party's transport looks like: one module that declares its registry entry
(`outbox.ports.Transport`) and registers it (`outbox.transports.register`). Naming the module in
`OUTBOX_TRANSPORT_MODULES` makes `--transport files` run under every command, `outbox status`,
the console, AsyncAPI and `drain`, with no other file changed (tests/integration/
test_third_transport.py), and it passes the transport contract suite (tests/transport/).

The layout under `--files-dir DIR`: `topics/TOPIC/N.log` is partition N of TOPIC, one JSON line
per record (its offset is its line number), `topics/TOPIC/partitions` their count;
`groups/GROUP.json` a consumer group's committed offsets and members. Every change is made
under an exclusive `flock` of `DIR/lock`, so processes share the log as they would a broker; an
append is flushed and fsynced before it is acknowledged. A group's partitions are spread over
its live members (a member that has not beaten for `SESSION_TIMEOUT` seconds is evicted); when
the members change, each starts again from the group's committed offsets, and a member commits
only partitions it still owns.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox import transports
from outbox.core.batches import InboxBatch, OutgoingRecord
from outbox.core.errors import ConfigurationError, InvalidHeaders, OutboxError
from outbox.core.lag import GroupLag, PartitionLag
from outbox.core.partitioning import partition_for
from outbox.core.text import storable
from outbox.core.topics import validate_topic
from outbox.core.wire import as_bytes
from outbox.ports import (
    ArgumentAdder,
    ContractTransport,
    DeliveryFailure,
    FixtureSource,
    LagReader,
    Publisher,
    PublisherFactory,
    Role,
    Subscriber,
    SubscriberFactory,
    Transport,
    TransportProbe,
    TransportSettings,
)

FILES_DIR = "OUTBOX_FILES_DIR"
DEFAULT_PARTITIONS = 3
MAX_RECORD_BYTES = 1_000_000
#: Seconds a member may go without beating before the others take its partitions.
SESSION_TIMEOUT = 3.0
BEAT_INTERVAL = 0.3


@dataclass(frozen=True)
class FilesOptions:
    """Where the log is (`--files-dir`)."""

    directory: str = ""
    partitions: int = DEFAULT_PARTITIONS


class FilesLog:
    """The directory of the log, locked for every change."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory)
        self._thread_lock = threading.Lock()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with self._thread_lock, open(self.root / "lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- topics (lock held) --------------------------------------------------------------------

    def _topic_dir(self, topic: str) -> Path:
        return self.root / "topics" / topic

    def partitions(self, topic: str) -> int:
        count = self._topic_dir(topic) / "partitions"
        return int(count.read_text()) if count.exists() else 0

    def create_topic(self, topic: str, partitions: int) -> None:
        validate_topic(topic)
        with self.locked():
            self._create(topic, partitions)

    def _create(self, topic: str, partitions: int) -> None:
        where = self._topic_dir(topic)
        where.mkdir(parents=True, exist_ok=True)
        for n in range(partitions):
            (where / f"{n}.log").touch()
        _write(where / "partitions", str(partitions))

    def topics(self) -> list[str]:
        base = self.root / "topics"
        return sorted(p.name for p in base.iterdir()) if base.exists() else []

    def length(self, topic: str, partition: int) -> int:
        path = self._topic_dir(topic) / f"{partition}.log"
        if not path.exists():
            return 0
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)

    # -- groups (lock held) --------------------------------------------------------------------

    def group(self, group: str) -> dict[str, Any]:
        path = self.root / "groups" / f"{group}.json"
        if not path.exists():
            return {"committed": {}, "members": {}, "generation": 0}
        found: dict[str, Any] = json.loads(path.read_text())
        return found

    def save_group(self, group: str, state: Mapping[str, Any]) -> None:
        where = self.root / "groups"
        where.mkdir(parents=True, exist_ok=True)
        _write(where / f"{group}.json", json.dumps(state))

    def groups(self) -> list[str]:
        base = self.root / "groups"
        return sorted(p.stem for p in base.glob("*.json")) if base.exists() else []


def _write(path: Path, text: str) -> None:
    """Replace `path`'s content atomically and durably."""
    fresh = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    with open(fresh, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(fresh, path)


def _encode(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _decode(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class FilesPublisher:
    """Appends records to the log's partition files; acknowledged once fsynced."""

    def __init__(self, options: FilesOptions) -> None:
        self.log = FilesLog(options.directory)
        self.options = options
        self._random = random.Random()

    def publish(
        self, records: Sequence[OutgoingRecord], meanwhile: Callable[[], None] | None = None
    ) -> list[DeliveryFailure | None]:
        results: list[DeliveryFailure | None] = [None] * len(records)
        lines: dict[tuple[str, int], list[str]] = {}
        now = int(time.time() * 1000)
        with self.log.locked():
            for index, record in enumerate(records):
                try:
                    headers = as_bytes(record.wire_headers())
                except InvalidHeaders as exc:
                    results[index] = DeliveryFailure(storable(str(exc)), permanent=True)
                    continue
                size = len(record.payload) + len(record.key or b"")
                if size > MAX_RECORD_BYTES:
                    results[index] = DeliveryFailure(
                        f"MSG_SIZE_TOO_LARGE: record of {size} bytes is larger than "
                        f"{MAX_RECORD_BYTES}",
                        permanent=True,
                    )
                    continue
                count = self.log.partitions(record.topic)
                if not count:
                    self.log._create(record.topic, self.options.partitions)
                    count = self.options.partitions
                partition = (
                    partition_for(record.key, count)
                    if record.key is not None
                    else self._random.randrange(count)
                )
                line = json.dumps(
                    {
                        "key": _encode(record.key),
                        "value": _encode(record.payload),
                        "headers": [[name, _encode(value)] for name, value in headers],
                        "timestamp": now,
                    }
                )
                lines.setdefault((record.topic, partition), []).append(line + "\n")
            for (topic, partition), appended in lines.items():
                path = self.log._topic_dir(topic) / f"{partition}.log"
                with open(path, "a") as handle:
                    handle.write("".join(appended))
                    handle.flush()
                    os.fsync(handle.fileno())
        if meanwhile is not None:
            meanwhile()
        return results

    def close(self) -> None:
        """Nothing is buffered: a publish is durable when it returns."""


class FilesSubscriber:
    """One member of a consumer group of the log."""

    def __init__(self, options: FilesOptions, topics: Sequence[str], group: str) -> None:
        if not group:
            raise ConfigurationError("a consumer group is required")
        for topic in topics:
            validate_topic(topic)
        self.log = FilesLog(options.directory)
        self.topics = list(topics)
        self.group = group
        self.member = uuid.uuid4().hex
        self._generation = -1
        self._assigned: list[tuple[str, int]] = []
        self._positions: dict[tuple[str, int], tuple[int, int]] = {}  # offset, byte position
        self._beat = 0.0
        self._closed = False
        with self.log.locked():
            self._refresh(join=True)

    def _refresh(self, *, join: bool = False) -> None:
        """Beat, evict the silent, and take this generation's assignment (lock held)."""
        state = self.log.group(self.group)
        members: dict[str, Any] = state["members"]
        now = time.time()
        changed = join or self.member not in members
        members[self.member] = {"topics": self.topics, "beat": now}
        for other, seen in list(members.items()):
            if now - float(seen["beat"]) > SESSION_TIMEOUT:
                del members[other]
                changed = True
        if changed:
            state["generation"] = int(state["generation"]) + 1
        self.log.save_group(self.group, state)
        self._beat = time.monotonic()
        if state["generation"] != self._generation:
            self._generation = int(state["generation"])
            self._positions.clear()  # from the committed offsets again, as after a rebalance
        # Every member computes the same assignment from the same members (topics created
        # since are taken up here).
        self._assigned = []
        for topic in self.topics:
            subscribed = sorted(m for m, seen in members.items() if topic in seen["topics"])
            for p in range(self.log.partitions(topic)):
                if subscribed[p % len(subscribed)] == self.member:
                    self._assigned.append((topic, p))
        self._committed = dict(state["committed"])

    def poll(self, max_records: int, timeout: float) -> InboxBatch:
        if self._closed:
            raise RuntimeError("poll() on a closed FilesSubscriber")
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() - self._beat >= BEAT_INTERVAL:
                with self.log.locked():
                    self._refresh()
            batch = self._take(max_records)
            if batch or time.monotonic() >= deadline:
                return batch
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def _take(self, max_records: int) -> InboxBatch:
        batch = InboxBatch()
        taken = 0
        for topic, p in self._assigned:
            offset, position = self._positions.get((topic, p), (-1, 0))
            if offset < 0:
                offset, position = self._seek(topic, p, int(self._committed.get(f"{topic}/{p}", 0)))
            path = self.log._topic_dir(topic) / f"{p}.log"
            with open(path, "rb") as handle:
                handle.seek(position)
                while taken < max_records:
                    line = handle.readline()
                    if not line.endswith(b"\n"):
                        break  # nothing more, or a line still being written
                    position += len(line)
                    record = json.loads(line)
                    headers = [(name, _decode(value) or b"") for name, value in record["headers"]]
                    batch.add(
                        topic,
                        p,
                        offset,
                        _decode(record["key"]),
                        _decode(record["value"]) or b"",
                        headers,
                        int(record["timestamp"]),
                    )
                    offset += 1
                    taken += 1
            self._positions[(topic, p)] = (offset, position)
            if taken >= max_records:
                break
        return batch

    def _seek(self, topic: str, partition: int, offset: int) -> tuple[int, int]:
        path = self.log._topic_dir(topic) / f"{partition}.log"
        position = 0
        with open(path, "rb") as handle:
            for _ in range(offset):
                line = handle.readline()
                if not line.endswith(b"\n"):
                    break
                position += len(line)
        return offset, position

    def commit(self, batch: InboxBatch) -> None:
        """The group resumes after `batch`, in the partitions this member still owns."""
        offsets = batch.next_offsets()
        if not offsets:
            return
        with self.log.locked():
            state = self.log.group(self.group)
            if int(state["generation"]) != self._generation:
                return  # a rebalance happened: the new owners redeliver (as Kafka refuses)
            for (topic, p), offset in offsets.items():
                if (topic, p) in self._assigned:
                    state["committed"][f"{topic}/{p}"] = offset
            self.log.save_group(self.group, state)
            self._committed = dict(state["committed"])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.log.locked():
            state = self.log.group(self.group)
            if state["members"].pop(self.member, None) is not None:
                state["generation"] = int(state["generation"]) + 1
                self.log.save_group(self.group, state)


class FilesLag:
    """The log's `LagReader`."""

    def __init__(self, options: FilesOptions) -> None:
        self.log = FilesLog(options.directory)

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        with self.log.locked():
            names = list(dict.fromkeys(groups)) if groups is not None else self.log.groups()
            found = []
            for group in names:
                state = self.log.group(group)
                topics = sorted(
                    {key.rpartition("/")[0] for key in state["committed"]}
                    | {t for seen in state["members"].values() for t in seen["topics"]}
                )
                found.append(
                    GroupLag(
                        group,
                        tuple(
                            PartitionLag(
                                topic,
                                p,
                                int(state["committed"].get(f"{topic}/{p}", 0)),
                                self.log.length(topic, p),
                            )
                            for topic in topics
                            for p in range(self.log.partitions(topic))
                        ),
                    )
                )
            return found

    def close(self) -> None:
        """Nothing is kept open."""


# -- the registry's entry --------------------------------------------------------------------


def _options(values: Mapping[str, Any]) -> FilesOptions:
    return FilesOptions(directory=str(values.get("files_dir") or ""))


def _add_arguments(parser: ArgumentAdder, role: Role) -> None:
    parser.add_argument(
        "--files-dir",
        default=os.environ.get(FILES_DIR),
        help=f"directory of the tests' log of files, for --transport files (env {FILES_DIR})",
    )


def _publishers(options: FilesOptions) -> tuple[PublisherFactory, TransportProbe | None]:
    return (lambda: FilesPublisher(options)), _probe(options)


def _subscribers(
    options: FilesOptions, group: str, topics: Sequence[str], start: str | None
) -> tuple[SubscriberFactory, TransportProbe | None]:
    listed = list(topics)
    return (lambda: FilesSubscriber(options, listed, group)), _probe(options)


def _check(options: FilesOptions, wait: float = 0.0) -> None:
    if not Path(options.directory).is_dir():
        raise OutboxError(f"the files log {options.directory!r} is not a directory")


def _probe(options: FilesOptions) -> TransportProbe:
    return TransportProbe("files", "the files log", lambda timeout: _check(options))


def _in_force(options: FilesOptions, kind: str, group: str) -> dict[str, Any]:
    return {"files_dir": options.directory}


def _servers(options: FilesOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"files": {"host": "localhost", "protocol": "file", "pathname": "/"}}, {}


class FilesUnderTest:
    """The log of files for the contract suite: a fresh directory per test."""

    name = "files"
    settle = 0.3

    def __init__(self, request: FixtureSource) -> None:
        directory = request.getfixturevalue("tmp_path") / "files-log"
        directory.mkdir()
        self.options = FilesOptions(str(directory))
        self.log = FilesLog(directory)
        self._count = 0
        self._open: list[Any] = []

    def topic(self, partitions: int = 3) -> str:
        self._count += 1
        name = f"topic-{self._count}"
        self.log.create_topic(name, partitions)
        return name

    def publisher(self) -> Publisher:
        made = FilesPublisher(self.options)
        self._open.append(made)
        return made

    def subscriber(self, topics: Sequence[str], group: str) -> Subscriber:
        made = FilesSubscriber(self.options, topics, group)
        self._open.append(made)
        return made

    def settings(self) -> TransportSettings:
        return TransportSettings(FILES.name, self.options)

    def close_all(self) -> None:
        for client in reversed(self._open):
            with contextlib.suppress(RuntimeError):
                client.close()


def _contract(request: FixtureSource) -> ContractTransport:
    return FilesUnderTest(request)


def _lag(options: FilesOptions, timeout: float) -> LagReader:
    return FilesLag(options)


FILES: Transport[FilesOptions] = Transport(
    name="files",
    label="the files log",
    add_arguments=_add_arguments,
    options_of=_options,
    endpoint=lambda options: options.directory,
    endpoint_flag="--files-dir",
    endpoint_dest="files_dir",
    endpoint_env=FILES_DIR,
    shown=lambda endpoint: endpoint,
    make_publishers=_publishers,
    make_subscribers=_subscribers,
    probe=_probe,
    lag_reader=_lag,
    asyncapi_servers=_servers,
    check=_check,
    check_consumer=lambda options: None,
    lag_note="Lag of the files log needs --files-dir.",
    max_lag_needs=f"--max-lag with --transport files needs --files-dir (or {FILES_DIR})",
    in_force=_in_force,
    secrets=lambda options: (),
    features=frozenset({"processes"}),
    contract=_contract,
)

with contextlib.suppress(ConfigurationError):  # imported again under another name: registered
    transports.register(FILES)
