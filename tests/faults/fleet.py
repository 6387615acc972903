"""Services made of real daemon processes, writers that send with keys, and the accounting.

A `Service` is one database (and outbox schema) with its producers, consumers and handlers
(`outbox producer|consumer|handler` processes, the handlers from `tests.faults.soak_app`). A
`Fleet` starts them, restarts the ones the test killed and notes any that exited on its own.
A `Writer` thread sends keyed messages with a per-key sequence number and logs each message in
the service's `<name>_sent` table in the same transaction, so what was sent is exactly what
committed, even across a PostgreSQL restart. `account` compares, per topic, what was sent with
what the receiving service recorded and what went dead.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outbox import Broker, Message
from outbox.core.lanes import LANES

from ..integration.relay_helpers import (
    Daemon,
    is_log_url,
    spawn_consumer,
    spawn_handler,
    spawn_producer,
)
from . import soak_app

APP = "tests.faults.soak_app:handlers"
#: What a daemon restarted while PostgreSQL is down says as it exits at start-up: its own
#: database, or (on the log transport) the log database, checked first by the CLI.
OUTAGE_EXITS = ("cannot connect to PostgreSQL", "cannot connect to the log database")


# --------------------------------------------------------------------------------------------
# Services and their processes


@dataclass
class Service:
    """One service: a database, an outbox schema, the topics it handles and how many daemons."""

    name: str
    url: str
    bootstrap: str
    schema: str = "outbox"
    consumes: list[str] = field(default_factory=list)
    replies: dict[str, str] = field(default_factory=dict)
    producers: int = 1
    consumers: int = 1
    handlers: int = 1

    def __post_init__(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(soak_app.tables(self.name))

    @property
    def group(self) -> str:
        return f"g-{self.name}-{self.consumes[0]}" if self.consumes else ""

    def env(self) -> dict[str, str]:
        return {
            "FAULTS_APP_SERVICE": self.name,
            "FAULTS_APP_SCHEMA": self.schema,
            "FAULTS_APP_TOPICS": ",".join(self.consumes),
            "FAULTS_APP_REPLIES": ",".join(f"{i}={o}" for i, o in self.replies.items()),
        }

    def spawn(self, kind: str) -> Daemon:
        schema = ("--schema", self.schema)
        if kind == "producer":
            return spawn_producer(
                self.url,
                self.bootstrap,
                *schema,
                "--poll-interval",
                "0.2",
                "--batch-size",
                "100",
                "--kafka-config",
                "message.timeout.ms=30000",
                env=self.env(),
            )
        if kind == "consumer":
            more = [a for t in self.consumes[1:] for a in ("--topic", t)]
            return spawn_consumer(
                self.url,
                self.bootstrap,
                self.consumes[0],
                self.group,
                *more,
                *schema,
                "--batch-size",
                "100",
                "--kafka-config=fetch.wait.max.ms=10",
                env=self.env(),
            )
        return spawn_handler(
            self.url,
            APP,
            *schema,
            "--concurrency",
            "2",
            "--batch-size",
            "50",
            "--transaction-size",
            "20",
            env=self.env(),
        )

    def kinds(self) -> list[tuple[str, int]]:
        counts = {"producer": self.producers, "consumer": self.consumers, "handler": self.handlers}
        if not self.consumes:
            counts["consumer"] = counts["handler"] = 0
        return [(kind, i) for kind, n in counts.items() for i in range(n)]


@dataclass
class Exit:
    """A daemon that exited without being told to."""

    name: str
    code: int | None
    output: str


class Fleet:
    """The daemons of several services; restarts what the test killed, notes other exits."""

    def __init__(self, services: Iterable[Service]) -> None:
        self.services = {s.name: s for s in services}
        self.daemons: dict[str, Daemon] = {}
        self.owner: dict[str, tuple[Service, str]] = {}
        self.killed_by_us: set[int] = set()
        self.stopped_until: dict[str, float] = {}
        self.unexpected: list[Exit] = []
        self.restarts: Counter[str] = Counter()
        self.started_at: dict[str, float] = {}
        self.outage_exits: list[Exit] = []
        #: When the last PostgreSQL outage ended (time.monotonic()); set by the chaos loop.
        self.last_outage: Callable[[], float] = lambda: -1e9

    def start(self) -> None:
        for service in self.services.values():
            for kind, i in service.kinds():
                name = f"{service.name}.{kind}{i}"
                self.owner[name] = (service, kind)
                self.daemons[name] = service.spawn(kind)
                self.started_at[name] = time.monotonic()

    def names(self, kind: str | None = None, service: str | None = None) -> list[str]:
        return [
            n
            for n, (s, k) in self.owner.items()
            if (kind is None or k == kind) and (service is None or s.name == service)
        ]

    def kill(self, name: str) -> None:
        """SIGKILL a daemon; `supervise` restarts it."""
        daemon = self.daemons[name]
        self.killed_by_us.add(daemon.process.pid)
        with contextlib.suppress(ProcessLookupError):
            daemon.signal(signal.SIGKILL)
        self.stopped_until.pop(name, None)
        daemon.process.wait(10)

    def freeze(self, name: str, seconds: float) -> None:
        """SIGSTOP a daemon; `supervise` sends SIGCONT after `seconds`."""
        if name in self.stopped_until:
            return
        with contextlib.suppress(ProcessLookupError):
            self.daemons[name].signal(signal.SIGSTOP)
        self.stopped_until[name] = time.monotonic() + seconds

    def thaw_all(self) -> None:
        for name in list(self.stopped_until):
            with contextlib.suppress(ProcessLookupError):
                self.daemons[name].signal(signal.SIGCONT)
        self.stopped_until.clear()

    def supervise(self) -> None:
        """SIGCONT frozen daemons whose time is up; restart every daemon that exited."""
        now = time.monotonic()
        for name, until in list(self.stopped_until.items()):
            if now >= until:
                with contextlib.suppress(ProcessLookupError):
                    self.daemons[name].signal(signal.SIGCONT)
                del self.stopped_until[name]
        for name, daemon in list(self.daemons.items()):
            code = daemon.process.poll()
            if code is None:
                continue
            output = daemon.output()[-4000:]
            if daemon.process.pid in self.killed_by_us:
                self.killed_by_us.discard(daemon.process.pid)
            elif any(m in output for m in OUTAGE_EXITS) and now - self.last_outage() < 20:
                self.outage_exits.append(Exit(name, code, output))
            else:
                self.unexpected.append(Exit(name, code, output))
            daemon.close()
            service, kind = self.owner[name]
            self.daemons[name] = service.spawn(kind)
            self.started_at[name] = time.monotonic()
            self.restarts[name] += 1

    def stop(self) -> list[Exit]:
        """SIGTERM everything; the daemons that did not exit 0 within 60 s."""
        self.thaw_all()
        self.supervise()
        # A daemon gets SIGTERM only once it handles it (Python exits -15 before the handlers
        # are in): on a loaded machine a restarted daemon may still be importing after 5 s.
        deadline = time.monotonic() + 60
        for daemon in self.daemons.values():
            while daemon.process.poll() is None and time.monotonic() < deadline:
                caught = daemon.catches(signal.SIGTERM)
                if caught is None:  # no /proc: give it the time a start takes
                    time.sleep(max(0.0, self.started_at_of(daemon) + 5.0 - time.monotonic()))
                    break
                if caught:
                    break
                time.sleep(0.05)
        bad = []
        for daemon in self.daemons.values():
            with contextlib.suppress(ProcessLookupError):
                daemon.signal(signal.SIGTERM)
        for name, daemon in self.daemons.items():
            try:
                code: int | None = daemon.wait(60)
            except Exception:
                code = None
            if code != 0:
                bad.append(Exit(name, code, daemon.output()[-4000:]))
            daemon.close()
        return bad

    def started_at_of(self, daemon: Daemon) -> float:
        """When `daemon` was (re)started."""
        for name, running in self.daemons.items():
            if running is daemon:
                return self.started_at[name]
        return 0.0

    def close(self) -> None:
        self.thaw_all()
        for daemon in self.daemons.values():
            daemon.close()


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str | Callable[[], str],
    fleet: Fleet | None = None,
    interval: float = 0.2,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if fleet is not None:
            fleet.supervise()
        if predicate():
            return
        if time.monotonic() > deadline:
            detail = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {detail}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# Lanes


def lane_holders(service: Service, table: str) -> dict[int, int]:
    """Lanes (advisory locks) of `table`'s relays in `service`'s database: {backend pid: n}."""
    lock_class = zlib.crc32(f"{service.schema}.{table}".encode()) & 0x7FFFFFFF
    with psycopg.connect(service.url) as conn:
        rows = conn.execute(
            "SELECT l.pid, count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.granted"
            " AND l.classid::bigint = %s AND l.objsubid = 2 GROUP BY l.pid",
            (lock_class,),
        ).fetchall()
    return {int(pid): int(n) for pid, n in rows}


def lanes_fair(service: Service, table: str, relays: int) -> bool:
    """Every lane held, by exactly `relays` sessions, none holding more than its share."""
    held = lane_holders(service, table)
    share = math.ceil(LANES / relays)
    return len(held) == relays and sum(held.values()) == LANES and max(held.values()) <= share


def lanes_report(services: Iterable[Service]) -> str:
    parts = []
    for s in services:
        for table in ("producer_queue", "consumer_queue"):
            parts.append(f"{s.name}/{s.schema}.{table}: {sorted(lane_holders(s, table).values())}")
    return "lanes held per relay: " + "; ".join(parts)


def wait_fair_lanes(services: Iterable[Service], fleet: Fleet, timeout: float = 30) -> None:
    services = list(services)

    def fair() -> bool:
        return all(
            (s.producers == 0 or lanes_fair(s, "producer_queue", s.producers))
            and (not s.consumes or lanes_fair(s, "consumer_queue", s.handlers))
            for s in services
        )

    wait_until(
        fair,
        timeout,
        lambda: (
            "all 64 lanes of each queue held and shared fairly by its relays; "
            + lanes_report(services)
        ),
        fleet,
        interval=0.5,
    )


# --------------------------------------------------------------------------------------------
# Writers


class Writer(threading.Thread):
    """Sends keyed messages on `topic` from `service`'s database until stopped (or `total`).

    Each transaction sends 1-4 messages and logs them in `<service>_sent`. Keys come from a
    small key space; each key's messages carry an increasing `seq`. Every `reply_every`-th
    message asks the receiver for a reply. `fail(kind)` makes the next message one whose
    handler raises an odd text until it is dead.
    """

    def __init__(
        self,
        service: Service,
        topic: str,
        *,
        keys: int = 8,
        total: int | None = None,
        pause: float = 0.02,
        reply_every: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(daemon=True, name=f"writer-{service.name}-{topic}")
        self.service = service
        self.topic = topic
        self.keys = [f"{service.name}-k{i}" for i in range(keys)]
        self.total = total
        self.pause = pause
        self.reply_every = reply_every
        self.random = random.Random(seed)
        self.seq: Counter[str] = Counter()
        self.sent = 0
        self.reconnects = 0
        self.failing: list[str] = []
        self.errors: list[BaseException] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.broker = Broker(schema=service.schema)

    def fail(self, kind: str) -> None:
        with self._lock:
            self.failing.append(kind)

    def stop(self) -> None:
        self._halt.set()

    def _batch(self) -> list[tuple[Message, dict[str, Any]]]:
        out = []
        for _ in range(self.random.randint(1, 4)):
            key = self.random.choice(self.keys)
            body: dict[str, Any] = {"key": key, "seq": self.seq[key]}
            self.seq[key] += 1
            with self._lock:
                if self.failing:
                    body["fail"] = self.failing.pop(0)
            if self.reply_every and self.seq[key] % self.reply_every == 0 and "fail" not in body:
                body["reply"] = True
            out.append((Message(self.topic, body, key=key, message_id=uuid.uuid4()), body))
        return out

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        table = f"{self.service.name}_sent"
        try:
            while not self._halt.is_set() and (self.total is None or self.sent < self.total):
                batch = self._batch()
                if self.total is not None:
                    batch = batch[: self.total - self.sent]
                while not self._halt.is_set():
                    try:
                        if conn is None or conn.closed:
                            conn = psycopg.connect(self.service.url, connect_timeout=3)
                        with conn.transaction():
                            self.broker.send_many(conn, [m for m, _ in batch])
                            with conn.cursor() as cur:
                                cur.executemany(
                                    f"INSERT INTO {table} (message_id, topic, key, seq, fail,"
                                    " reply) VALUES (%s, %s, %s, %s, %s, %s)",
                                    [
                                        (
                                            m.message_id,
                                            self.topic,
                                            b["key"],
                                            b["seq"],
                                            b.get("fail"),
                                            bool(b.get("reply")),
                                        )
                                        for m, b in batch
                                    ],
                                )
                        self.sent += len(batch)
                        break
                    except psycopg.OperationalError:
                        # The commit may or may not have happened: the sent table says which.
                        self.reconnects += 1
                        if conn is not None:
                            conn.close()
                        conn = None
                        time.sleep(0.2)
                        break
                if self.pause:
                    time.sleep(self.pause)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            if conn is not None:
                conn.close()


def send_backlog(service: Service, topic: str, total: int, keys: int = 8) -> None:
    """Send `total` keyed messages at once (before the daemons start)."""
    writer = Writer(service, topic, keys=keys, total=total, pause=0)
    writer.run()
    assert not writer.errors, writer.errors


# --------------------------------------------------------------------------------------------
# Accounting


@dataclass
class Poison:
    """A raw record produced on a topic, not in outbox's format."""

    kind: str
    topic: str
    partition: int
    offset: int
    needs_raw_headers: bool


@dataclass
class TopicRow:
    service: str  # receiving service
    topic: str
    sent: int = 0
    handled_once: int = 0
    handled_twice: int = 0
    lost: int = 0
    order_violations: int = 0
    failing: int = 0
    failing_dead: int = 0
    poison: int = 0
    poison_quarantined: int = 0
    poison_raw_headers: int = 0
    other_dead: int = 0
    details: list[str] = field(default_factory=list)
    #: Ids of the messages lost (neither handled nor dead), for a closer look.
    missing: list[Any] = field(default_factory=list)


COLUMNS = (
    ("service/topic", None),
    ("sent", "sent"),
    ("handled once", "handled_once"),
    ("handled twice", "handled_twice"),
    ("lost", "lost"),
    ("order violations", "order_violations"),
    ("failing", "failing"),
    ("failing dead", "failing_dead"),
    ("poison", "poison"),
    ("poison quarantined", "poison_quarantined"),
    ("raw_headers", "poison_raw_headers"),
    ("other dead", "other_dead"),
)


def _rows(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _producer_dead(service: Service) -> set[Any]:
    q = f'"{service.schema}"'
    query = f"SELECT message_id FROM {q}.producer_queue WHERE dead_at IS NOT NULL"
    dead = {r[0] for r in _rows(service.url, query)}
    with contextlib.suppress(psycopg.errors.UndefinedTable):
        dead |= {r[0] for r in _rows(service.url, f"SELECT message_id FROM {q}.producer_dead")}
    return dead


def where_is(message_id: Any, sender: Service, receiver: Service) -> str:
    """Where a message that was not handled is: still in the sender's outbox, in the
    receiver's inbox (and in which state), or in neither (so on the transport: relayed, never
    stored)."""
    out = _rows(
        sender.url,
        f'SELECT lane, attempts, next_attempt_at, last_error FROM "{sender.schema}".producer_queue'
        " WHERE message_id = %s",
        (message_id,),
    )
    if out:
        lane, attempts, due, error = out[0]
        return (
            f"{message_id}: in {sender.name}'s producer_queue, lane {lane}, attempts "
            f"{attempts}, due {due}, last error {error!r}"
        )
    inbox = _rows(
        receiver.url,
        "SELECT lane, attempts, next_attempt_at, processed_at, dead_at, last_error,"
        f' source_partition, source_offset FROM "{receiver.schema}".consumer_queue'
        " WHERE message_id = %s",
        (message_id,),
    )
    if inbox:
        lane, attempts, due, processed, dead_at, error, partition, offset = inbox[0]
        return (
            f"{message_id}: in {receiver.name}'s consumer_queue, lane {lane}, partition "
            f"{partition} offset {offset}, attempts {attempts}, due {due}, processed "
            f"{processed}, dead {dead_at}, last error {error!r}"
        )
    handled = _rows(
        receiver.url,
        f'SELECT processed_at, attempts, handled_count FROM "{receiver.schema}".consumer_processed'
        " WHERE message_id = %s",
        (message_id,),
    )
    if handled:
        processed, attempts, times = handled[0]
        return (
            f"{message_id}: handled by {receiver.name} at {processed} (attempts {attempts},"
            f" handled {times} time(s))"
        )
    return f"{message_id}: in neither queue: relayed, never stored by {receiver.name}"


def account(
    services: Iterable[Service],
    routes: dict[str, tuple[str, str]],
    poisons: Iterable[Poison] = (),
) -> list[TopicRow]:
    """Per topic: `routes[topic] = (sending service, receiving service)`."""
    by_name = {s.name: s for s in services}
    poisons = list(poisons)
    result = []
    for topic, (sender_name, receiver_name) in routes.items():
        sender, receiver = by_name[sender_name], by_name[receiver_name]
        row = TopicRow(receiver.name, topic)
        sent = {
            r[0]: r
            for r in _rows(
                sender.url,
                f"SELECT message_id, key, seq, fail FROM {sender.name}_sent WHERE topic = %s",
                (topic,),
            )
        }
        received = _rows(
            receiver.url,
            f"SELECT message_id, key, seq FROM {receiver.name}_received WHERE topic = %s"
            " ORDER BY n",
            (topic,),
        )
        q = f'"{receiver.schema}"'
        dead_rows = _rows(
            receiver.url,
            f"SELECT message_id, last_error, raw_headers IS NOT NULL, source_partition,"
            f" source_offset FROM {q}.consumer_queue WHERE dead_at IS NOT NULL AND topic = %s",
            (topic,),
        )
        consumer_dead = {r[0]: r for r in dead_rows}
        dead = set(consumer_dead) | _producer_dead(sender)
        times = Counter(r[0] for r in received)
        row.sent = len(sent)
        row.handled_once = sum(1 for i in sent if times[i] == 1)
        row.handled_twice = sum(1 for i in sent if times[i] > 1)
        phantom = set(times) - set(sent)
        if phantom:
            row.details.append(f"{len(phantom)} handled but never sent: {sorted(phantom)[:3]}")
        failing = {i for i, r in sent.items() if r[3]}
        row.failing = len(failing)
        row.failing_dead = len(failing & dead)
        row.lost = sum(1 for i in sent if times[i] == 0 and i not in dead)
        lost = [sent[i][1:3] for i in sent if times[i] == 0 and i not in dead]
        if lost:
            row.details.append(f"lost (key, seq), first ones: {sorted(lost)[:5]}")
            row.missing = [i for i in sent if times[i] == 0 and i not in dead]
            row.details += [f"  {where_is(i, sender, receiver)}" for i in row.missing[:5]]
        last: dict[str, int] = {}
        for _mid, key, seq in received:
            if key in last and seq <= last[key]:
                row.order_violations += 1
                if row.order_violations <= 3:
                    row.details.append(f"key {key}: seq {seq} handled after {last[key]}")
            last[key] = max(seq, last.get(key, -1))
        positions = {(r[3], r[4]): r for r in dead_rows}
        mine = [p for p in poisons if p.topic == topic]
        row.poison = len(mine)
        poison_ids = set()
        for p in mine:
            found = positions.get((p.partition, p.offset))
            if found is None:
                row.details.append(f"poison {p.kind} at {p.partition}/{p.offset} not dead")
                continue
            poison_ids.add(found[0])
            if found[1]:
                row.poison_quarantined += 1
            else:
                row.details.append(f"poison {p.kind} dead without last_error")
            if found[2]:
                row.poison_raw_headers += 1
            elif p.needs_raw_headers:
                row.details.append(f"poison {p.kind} dead without raw_headers")
        row.other_dead = len(set(consumer_dead) - poison_ids - failing)
        result.append(row)
    return result


def _short(topic: str) -> str:
    """A test topic's name without the test name it starts with."""
    head, _, tail = topic.rpartition("-")
    return f"{head[-12:]}-{tail}" if head else topic


def format_table(title: str, rows: list[TopicRow], extra: Iterable[str] = ()) -> str:
    total = TopicRow("total", "")
    for r in rows:
        for _, attr in COLUMNS[1:]:
            setattr(total, attr, getattr(total, attr) + getattr(r, attr))
    cells = [[f"{r.service}/{_short(r.topic)}" if r.topic else r.service] for r in [*rows, total]]
    for cell, r in zip(cells, [*rows, total], strict=True):
        cell.extend(str(getattr(r, attr)) for _, attr in COLUMNS[1:])
    header = [c for c, _ in COLUMNS]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        pairs = enumerate(zip(values, widths, strict=True))
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in pairs)

    out = [f"== {title}", line(header), "  ".join("-" * w for w in widths)]
    out += [line(c) for c in cells[:-1]]
    out += ["  ".join("-" * w for w in widths), line(cells[-1])]
    for r in rows:
        out += [f"   {r.service}/{_short(r.topic)}: {d}" for d in r.details[:10]]
    out += list(extra)
    return "\n".join(out)


#: Tables printed again in the terminal summary (tests/faults/conftest.py).
TABLES: list[str] = []


def report(title: str, rows: list[TopicRow], extra: Iterable[str] = ()) -> str:
    table = format_table(title, rows, extra)
    print("\n" + table, flush=True)
    TABLES.append(table)
    return table


def assert_clean(rows: list[TopicRow], table: str) -> None:
    problems = []
    for r in rows:
        where = f"{r.service}/{r.topic}"
        if r.handled_twice:
            problems.append(f"{where}: {r.handled_twice} handled twice")
        if r.lost:
            problems.append(f"{where}: {r.lost} lost")
        if r.order_violations:
            problems.append(f"{where}: {r.order_violations} per-key order violations")
        if r.failing_dead != r.failing:
            problems.append(f"{where}: {r.failing - r.failing_dead} failing messages not dead")
        if r.poison_quarantined != r.poison:
            problems.append(f"{where}: {r.poison - r.poison_quarantined} poisons not quarantined")
        if r.other_dead:
            problems.append(f"{where}: {r.other_dead} unexpected dead rows")
        problems += [f"{where}: {d}" for d in r.details if "raw_headers" in d or "never" in d]
    assert not problems, "\n".join(problems) + "\n" + table


def drained(
    services: Iterable[Service], routes: dict[str, tuple[str, str]], poisons: list[Poison]
) -> bool:
    """Every message handled or dead, every failing message and every poison dead."""
    return all(
        r.lost == 0 and r.failing_dead == r.failing and not any("not dead" in d for d in r.details)
        for r in account(services, routes, poisons)
    )


def exits_report(exits: list[Exit]) -> list[str]:
    """One line per daemon and distinct last line of output (the error), with a count."""
    seen: Counter[tuple[str, int | None, str]] = Counter()
    for e in exits:
        lines = [line for line in e.output.strip().splitlines() if line.strip()]
        kind = e.name.split(".")[-1].rstrip("0123456789")
        seen[kind, e.code, lines[-1].strip()[:300] if lines else "(no output)"] += 1
    return [f"   {n} x {kind} exited {code}: {last}" for (kind, code, last), n in seen.items()]


def payload_summary(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=True)[:80]


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def find_on_topic(bootstrap: str, topic: str, ids: Iterable[Any]) -> dict[str, tuple[int, int]]:
    """(partition, offset) of each message id found on `topic`, read from the start of every
    partition without a group: tells a message the broker holds but the group skipped from
    one it never stored. `bootstrap` may be the PostgreSQL log's URL (`find_in_log`)."""
    if is_log_url(bootstrap):
        return find_in_log(bootstrap, topic, ids)
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    wanted = {str(i) for i in ids}
    found: dict[str, tuple[int, int]] = {}
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "soak-forensics", "fetch.wait.max.ms": 10}
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        idle = 0
        while idle < 20 and len(found) < len(wanted):
            batch = consumer.consume(1000, 0.5)
            idle = idle + 1 if not batch else 0
            for record in batch:
                if record.error() is not None:
                    continue
                for name, value in record.headers() or []:
                    if name == "outbox-message-id" and isinstance(value, bytes):
                        text = value.decode(errors="replace")
                        if text in wanted:
                            found[text] = (record.partition() or 0, record.offset() or 0)
    finally:
        consumer.close()
    return found


def find_in_log(url: str, topic: str, ids: Iterable[Any]) -> dict[str, tuple[int, int]]:
    """`find_on_topic` on the PostgreSQL log: the records of `topic` whose message id header
    is one of `ids` (looked up by the id's bytes in the headers, then the headers decoded)."""
    from outbox.core.headers import MESSAGE_ID
    from outbox.pglog.log import decode_headers

    found: dict[str, tuple[int, int]] = {}
    with psycopg.connect(url) as conn:
        for text in {str(i) for i in ids}:
            rows = conn.execute(
                "SELECT p.partition, r.log_offset, r.headers FROM outbox_log.log_records r"
                " JOIN outbox_log.log_partitions p ON p.id = r.partition_id"
                " JOIN outbox_log.log_topics t ON t.id = p.topic_id"
                " WHERE t.name = %s AND position(%s::bytea IN r.headers) > 0"
                " ORDER BY p.partition, r.log_offset",
                (topic, text.encode()),
            ).fetchall()
            for partition, offset, headers in rows:
                try:
                    decoded = decode_headers(bytes(headers))
                except Exception:  # a poison record's garbage headers
                    continue
                if (MESSAGE_ID, text.encode()) in decoded:
                    found[text] = (int(partition), int(offset))
                    break
    return found
