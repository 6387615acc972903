"""Chaos soak: two services sending to each other through the transport while things break.

It runs on both of the daemons' transports (`relay_transport`): Kafka (the session's broker,
`test_chaos_soak[kafka]`) and the log kept in PostgreSQL (`test_chaos_soak[postgres]`, a log
database on the same PostgreSQL cluster as the services' databases).

Services A and B (a database each on one cluster, two producers, two consumers and two
handlers each, as real processes) send keyed messages to each other continuously (A on
`a2b`, which B handles; B on `b2a`, which A handles); every third message of a key asks for a
reply, which the receiving handler sends with `broker.send` in its transaction. Meanwhile a
chaos loop with a seeded random generator, at random intervals:

- SIGKILLs a random daemon (restarted at once), or SIGSTOPs one for a few seconds;
- restarts PostgreSQL (on the log transport, the log database goes down with it), or, on
  Kafka only, freezes the broker (SIGSTOP) for a few seconds (the log has no broker process);
- produces poison records (raw records not in outbox's format: NUL bytes and non-UTF-8 bytes
  in header values, a garbage message id or content type, invalid JSON with a JSON content
  type); on the log they are appended straight into the log's records table with the
  publisher's own append statement (gapless offsets), as a foreign producer would, plus a
  header name with NUL, which confluent-kafka cannot produce;
- has a writer send a message whose handler raises an odd text (NUL, lone surrogate) until
  the message is dead.

Then chaos stops, everything drains (bounded) and a table per topic says: sent, handled once,
handled twice (must be 0), lost (must be 0), per-key order violations (must be 0: a message
that goes dead leaves a gap in its key's sequence, not a reordering), failing messages dead,
poison records quarantined (dead, with last_error; raw_headers where the record could not be
stored as an ordinary row), and the chaos actions by kind. No daemon may exit on its own.
When the drain times out, each group's committed offsets are printed (Kafka's lag reader, or
the log's `PgLog.lag`), and a lost message is looked for on the topic (read from the broker,
or looked up in the log's records by its message id header).

OUTBOX_SOAK_SECONDS (default 60, for each transport) sets the chaos time; OUTBOX_SOAK_SEED
replays a seed (the actions and their order, not the exact timing); OUTBOX_SOAK_SKIP lists
actions to leave out (e.g. "failing message,poison records"). `pytest -m soak` selects only
this test, `-k kafka` or `-k postgres` one transport.

A daemon that a supervisor restarted while PostgreSQL was down exits at start-up with
"cannot connect to PostgreSQL" (or, on the log transport, "cannot connect to the log
database") (fail fast, by design); such exits within 20 s of an outage are counted as
"start-up exits during an outage", not as exits on its own.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer as KafkaProducer

from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID
from outbox.core.partitioning import partition_for
from outbox.pglog.log import DEFAULT_SCHEMA, Topics, encode_headers, queries, wake_channel
from outbox.testing.servers import Servers

from ..integration.relay_helpers import RelayTransport, is_log_url
from . import soak_app
from .conftest import FaultResult
from .fleet import (
    Fleet,
    Poison,
    Service,
    Writer,
    account,
    assert_clean,
    drained,
    env_float,
    exits_report,
    find_on_topic,
    lanes_report,
    report,
    wait_fair_lanes,
    wait_until,
)

pytestmark = pytest.mark.soak

JSON = b"application/json"
NOT_JSON = b'{"key": "poison", "seq": \xff\xfe not json'
#: Replaced by a new message id for each record (one id twice is a redelivery, dropped).
FRESH_ID = b"fresh-uuid"

#: kind -> (headers, value, whether the record cannot be stored as an ordinary row). Header
#: names must be str: confluent-kafka turns a bytes name into its repr and crashes (SIGSEGV)
#: on a name with a lone surrogate, so non-UTF-8 names cannot be produced from Python.
POISONS: dict[str, tuple[list[tuple[str, Any]], bytes, bool]] = {
    "nul in header value": (
        [("x-note", b"before\x00after"), (CONTENT_TYPE, JSON)],
        NOT_JSON,
        False,  # a header value that is not storable text is stored as bytes
    ),
    "only NUL header value": (
        [(MESSAGE_ID, FRESH_ID), ("x-nul", b"\x00"), (CONTENT_TYPE, JSON)],
        b"{}",
        False,
    ),
    "non-UTF-8 header value": (
        [("x-latin", b"\xff\xfe\xfd"), (CONTENT_TYPE, JSON)],
        NOT_JSON,
        False,
    ),
    "garbage message id": (
        [(MESSAGE_ID, b"\xff\x00not-a-uuid"), (CONTENT_TYPE, JSON)],
        NOT_JSON,
        False,
    ),
    "garbage content type": ([(CONTENT_TYPE, b"\xff\xfegarbage/\x00type")], b'{"seq": 1}', True),
    "NUL in content type": ([(CONTENT_TYPE, JSON + b"\x00")], b"{}", True),
    "unknown content type": ([(CONTENT_TYPE, b"application/x-nobody-knows")], b"{}", False),
    "invalid JSON": (
        [(MESSAGE_ID, FRESH_ID), (CONTENT_TYPE, JSON)],
        NOT_JSON,
        False,
    ),
    "garbage created-at": (
        [(CREATED_AT, b"20\x0024-13-99"), (CONTENT_TYPE, JSON)],
        NOT_JSON,
        False,
    ),
}

#: The log's own poison kinds, beside POISONS (written with `encode_headers`): raw bytes
#: can carry header names confluent-kafka cannot produce.
LOG_POISONS: dict[str, tuple[list[tuple[str, Any]] | bytes, bytes, bool]] = {
    "NUL in header name": ([("x-\x00name", b"v"), (CONTENT_TYPE, JSON)], NOT_JSON, True),
}

#: Headers bytes not in the log's form (a name that is not UTF-8, a length cut short, garbage):
#: the record is quarantined with the reason (the subscriber once raised on them, and the
#: consumer exited at every restart). They cannot be ordinary rows.
LOG_UNDECODABLE: dict[str, tuple[list[tuple[str, Any]] | bytes, bytes, bool]] = {
    "non-UTF-8 header name": (b"\x00\x03\xff\xfe\xfd\x00\x00\x00\x01v", b"{}", True),
    "headers cut in a length": (b"\x00\x01a\x00\x00", b"{}", True),
    "garbage headers bytes": (b"\xff\xff\xff", NOT_JSON, True),
}

ACTIONS = {
    "kill daemon": 4,
    "freeze daemon": 3,
    "restart postgres": 1,
    "freeze broker": 1,
    "poison records": 2,
    "failing message": 2,
}
#: The log has no broker process: the PostgreSQL restart takes the log database down instead.
LOG_ACTIONS = {k: v for k, v in ACTIONS.items() if k != "freeze broker"}


def log_poisons() -> dict[str, tuple[list[tuple[str, Any]] | bytes, bytes, bool]]:
    """The poison kinds written into the log: POISONS, LOG_POISONS and LOG_UNDECODABLE."""
    return {**POISONS, **LOG_POISONS, **LOG_UNDECODABLE}


class LogWriter:
    """Appends raw records to the PostgreSQL log as a foreign producer would: with the
    publisher's statement (`log_append`), so offsets stay gapless, but
    with headers bytes of our choosing. A keyed record goes where the publisher would put it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sql = queries(DEFAULT_SCHEMA)
        self.channel = wake_channel(DEFAULT_SCHEMA)
        self.topics = Topics(DEFAULT_SCHEMA)

    def append(self, topic: str, records: list[tuple[bytes, bytes, bytes]]) -> None:
        """Append (key, value, headers bytes) records in one transaction."""
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            if topic not in self.topics.partitions:
                self.topics.load(conn, [topic])
            ids = self.topics.partitions[topic]
            partition_ids = [ids[partition_for(key, len(ids))] for key, _, _ in records]
            expected = sorted(set(partition_ids))
            with conn.transaction():
                row = conn.execute(
                    self.sql["log_append"],
                    {
                        "partition_ids": partition_ids,
                        "keys": [k for k, _, _ in records],
                        "values": [v for _, v, _ in records],
                        "headers": [h for _, _, h in records],
                        "channel": self.channel,
                        "expected_ids": expected,
                        "expected_topics": [self.topics.names[i][0] for i in expected],
                        "expected_partitions": [self.topics.names[i][1] for i in expected],
                    },
                ).fetchone()
                assert row is not None and row[0] == len(records), row

    def positions(self, topic: str, keys: list[bytes]) -> dict[bytes, tuple[int, int]]:
        """(partition, offset) of the records of `topic` with one of `keys` (unique keys):
        which of the records of an append whose commit may have failed are in the log."""
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT r.key, p.partition, r.log_offset FROM outbox_log.log_records r"
                " JOIN outbox_log.log_partitions p ON p.id = r.partition_id"
                " JOIN outbox_log.log_topics t ON t.id = p.topic_id"
                " WHERE t.name = %s AND r.key = ANY(%s)",
                (topic, keys),
            ).fetchall()
        return {bytes(k): (int(p), int(o)) for k, p, o in rows}


class Chaos:
    def __init__(
        self,
        seed: int,
        fleet: Fleet,
        servers: Servers,
        writers: list[Writer],
        topics: list[str],
        transport: RelayTransport,
    ) -> None:
        self.random = random.Random(seed)
        self.fleet = fleet
        self.servers = servers
        self.writers = writers
        self.topics = topics
        self.done: Counter[str] = Counter()
        self.poisons: list[Poison] = []
        self.last_outage = -1e9
        fleet.last_outage = lambda: self.last_outage
        skip = os.environ.get("OUTBOX_SOAK_SKIP", "")
        self.skip = {a.strip() for a in skip.split(",") if a.strip()}
        self.started = time.monotonic()
        self.actions = LOG_ACTIONS if transport.is_log else ACTIONS
        self.kafka: Any = None
        self.log_writer: LogWriter | None = None
        #: Poison records written into the log so far (their keys stay unique).
        self.log_written = 0
        if transport.is_log:
            self.log_writer = LogWriter(transport.endpoint)
        else:
            self.kafka = KafkaProducer(
                {"bootstrap.servers": servers.kafka.bootstrap, "message.timeout.ms": 20000}
            )

    def log(self, text: str) -> None:
        print(f"[chaos {time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.fleet.supervise()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        kinds, weights = list(self.actions), list(self.actions.values())
        while time.monotonic() < deadline:
            self.sleep(self.random.uniform(0.3, 2.0))
            action = self.random.choices(kinds, weights)[0]
            # Past half time, every kind of action not done yet comes first.
            missing = [k for k in kinds if k not in self.skip and not self.done[k]]
            if missing and time.monotonic() > deadline - seconds / 2:
                action = missing[0]
            if action in self.skip:
                continue
            if action in ("restart postgres", "freeze broker"):
                if time.monotonic() - self.last_outage < 8:
                    continue  # let the system recover between outages
                self.last_outage = time.monotonic()
            getattr(self, action.replace(" ", "_"))()
            self.done[action] += 1

    def kill_daemon(self) -> None:
        name = self.random.choice(sorted(self.fleet.daemons))
        self.log(f"SIGKILL {name}")
        self.fleet.kill(name)
        self.fleet.supervise()

    def freeze_daemon(self) -> None:
        name = self.random.choice(sorted(self.fleet.daemons))
        seconds = self.random.uniform(0.5, 4.0)
        self.log(f"SIGSTOP {name} for {seconds:.1f}s")
        self.fleet.freeze(name, seconds)

    def restart_postgres(self) -> None:
        downtime = self.random.uniform(0.2, 2.0)
        self.log(f"restart PostgreSQL, down {downtime:.1f}s")
        self.servers.postgres.restart(downtime=downtime)  # type: ignore[call-arg]
        self.last_outage = time.monotonic()

    def freeze_broker(self) -> None:
        seconds = self.random.uniform(1.0, 4.0)
        self.log(f"freeze the broker for {seconds:.1f}s")
        self.servers.kafka.pause()
        try:
            self.sleep(seconds)
        finally:
            self.servers.kafka.resume()
        self.last_outage = time.monotonic()

    def poison_records(self) -> None:
        if self.log_writer is not None:
            self.poison_log(self.log_writer)
            return
        kinds = self.random.sample(sorted(POISONS), self.random.randint(1, 3))
        topic = self.random.choice(self.topics)
        delivered: list[Any] = []
        for kind in kinds:
            headers, value, raw = POISONS[kind]
            key = f"poison-{len(self.poisons) + len(delivered)}".encode()

            def on_delivery(err: Any, msg: Any, kind: str = kind, raw: bool = raw) -> None:
                if err is None:
                    delivered.append(Poison(kind, msg.topic(), msg.partition(), msg.offset(), raw))

            fresh = [(n, str(uuid.uuid4()).encode() if v is FRESH_ID else v) for n, v in headers]
            self.kafka.produce(topic, value=value, key=key, headers=fresh, on_delivery=on_delivery)
        self.kafka.flush(25)
        self.poisons += delivered
        self.log(f"poison on {topic}: {[p.kind for p in delivered]} of {kinds}")

    def poison_log(self, writer: LogWriter) -> None:
        """Poison records appended straight into the log (a foreign producer's garbage)."""
        table = log_poisons()
        kinds = self.random.sample(sorted(table), self.random.randint(1, 3))
        topic = self.random.choice(self.topics)
        records, raw = [], {}
        for kind in kinds:
            headers, value, raw[kind] = table[kind]
            key = f"poison-log-{self.log_written}".encode()
            self.log_written += 1
            if not isinstance(headers, bytes):
                fresh = [
                    (n, str(uuid.uuid4()).encode() if v is FRESH_ID else v) for n, v in headers
                ]
                headers = encode_headers(fresh)
            records.append((key, value, headers))
        error = ""
        try:
            writer.append(topic, records)
        except psycopg.Error as exc:  # the commit's outcome may be unknown: look
            error = f" (append failed: {type(exc).__name__})"
        positions: dict[bytes, tuple[int, int]] = {}
        for _ in range(20):
            try:
                positions = writer.positions(topic, [k for k, _, _ in records])
                break
            except psycopg.OperationalError:
                self.sleep(0.5)
        delivered = []
        for kind, (key, _, _) in zip(kinds, records, strict=True):
            if key in positions:
                partition, offset = positions[key]
                delivered.append(Poison(kind, topic, partition, offset, raw[kind]))
        self.poisons += delivered
        self.log(f"poison on {topic}: {[p.kind for p in delivered]} of {kinds}{error}")

    def failing_message(self) -> None:
        writer = self.random.choice(self.writers)
        kind = self.random.choice(sorted(soak_app.ODD_TEXTS))
        self.log(f"{writer.name}: a message whose handler raises {kind!r}")
        writer.fail(kind)


def test_chaos_soak(
    outbox_servers: Servers,
    outbox_database_factory: Any,
    relay_transport: RelayTransport,
    fault_results: list[FaultResult],
) -> None:
    on_log = relay_transport.is_log
    if outbox_servers.postgres.source != "local":
        pytest.skip("needs a PostgreSQL server the harness started")
    if not on_log and outbox_servers.kafka.source != "local":
        pytest.skip("needs a PostgreSQL server and a broker the harness started")
    endpoint = relay_transport.endpoint
    # The log's title and summary row name it; Kafka's stay as they were.
    on = " on the PostgreSQL log" if on_log else ""
    seconds = env_float("OUTBOX_SOAK_SECONDS", 60)
    drain = env_float("OUTBOX_SOAK_DRAIN_SECONDS", max(30.0, seconds / 5))
    seed_text = os.environ.get("OUTBOX_SOAK_SEED", "").strip()
    seed = int(seed_text) if seed_text else random.SystemRandom().randrange(2**32)
    skip = os.environ.get("OUTBOX_SOAK_SKIP", "")
    print(f"\nsoak: skipping {skip!r}" if skip else "")
    print(f"soak{on}: {seconds:.0f} s of chaos, seed {seed} (OUTBOX_SOAK_SEED={seed} to replay)")
    started = time.monotonic()

    a2b, b2a = relay_transport.topic(), relay_transport.topic()
    per_kind = {"producers": 2, "consumers": 2, "handlers": 2}
    a = Service(
        "a",
        outbox_database_factory(),
        endpoint,
        consumes=[b2a],
        replies={b2a: a2b},
        **per_kind,
    )
    b = Service(
        "b",
        outbox_database_factory(),
        endpoint,
        consumes=[a2b],
        replies={a2b: b2a},
        **per_kind,
    )
    services = [a, b]
    routes = {a2b: ("a", "b"), b2a: ("b", "a")}
    writers = [
        Writer(a, a2b, keys=8, pause=0.03, reply_every=3, seed=seed),
        Writer(b, b2a, keys=8, pause=0.03, reply_every=3, seed=seed + 1),
    ]
    fleet = Fleet(services)
    chaos: Chaos | None = None
    drain_error = lanes_error = ""
    consumer_tails: list[str] = []
    stopped = False
    bad_stops = []
    fleet.start()
    try:
        try:
            wait_fair_lanes(services, fleet, timeout=20)
        except AssertionError as exc:  # reported in the table; the soak runs anyway
            lanes_error = str(exc)
        for writer in writers:
            writer.start()
        chaos = Chaos(seed, fleet, outbox_servers, writers, [a2b, b2a], relay_transport)
        chaos.run(seconds)
        chaos_seconds = time.monotonic() - chaos.started
        for writer in writers:
            writer.stop()
        for writer in writers:
            writer.join(30)
        fleet.thaw_all()
        drain_started = time.monotonic()
        try:
            wait_until(
                lambda: drained(services, routes, chaos.poisons),  # type: ignore[union-attr]
                drain,
                "everything to drain",
                fleet,
                interval=1.0,
            )
        except AssertionError as exc:
            offsets = _group_offsets(endpoint, services)
            drain_error = f"{exc}; {lanes_report(services)}; {offsets}"
            consumer_tails = _consumer_tails(fleet)
        drain_seconds = time.monotonic() - drain_started
        stopped = True
        bad_stops = fleet.stop()
    finally:
        if not stopped:
            fleet.close()

    assert chaos is not None
    rows = account(services, routes, chaos.poisons)
    for row in rows:
        if row.missing:  # on the broker (and skipped by the group), or never stored there?
            on_topic = find_on_topic(endpoint, row.topic, row.missing[:5])
            for i in row.missing[:5]:
                place = on_topic.get(str(i))
                row.details.append(
                    f"  {i}: on the topic at partition {place[0]} offset {place[1]}"
                    if place
                    else f"  {i}: not on the topic"
                )
    actions = ", ".join(f"{k}={v}" for k, v in sorted(chaos.done.items()))
    extra = [
        f"   seed {seed}; chaos {chaos_seconds:.0f} s; drain {drain_seconds:.1f} s"
        + (f" (NOT DRAINED: {drain_error})" if drain_error else ""),
        f"   chaos actions: {actions}",
        f"   poison records by kind: {dict(Counter(p.kind for p in chaos.poisons))}",
        f"   restarts: {sum(fleet.restarts.values())} ({dict(sorted(fleet.restarts.items()))})",
        f"   daemons that exited on their own: {len(fleet.unexpected)}"
        + (f" ({dict(Counter(e.name for e in fleet.unexpected))})" if fleet.unexpected else ""),
        f"   start-up exits during an outage: {len(fleet.outage_exits)}",
        f"   writer reconnects: {[w.reconnects for w in writers]}",
    ]
    extra += [f"   LANES NOT SHARED AT START: {lanes_error}"] if lanes_error else []
    extra += exits_report(fleet.unexpected) + exits_report(bad_stops)
    extra += consumer_tails
    table = report(f"chaos soak{on} ({seconds:.0f} s, seed {seed})", rows, extra)
    fault_results.append(
        FaultResult(
            f"chaos soak {seconds:.0f} s" + (" (postgres)" if on_log else ""),
            sum(r.sent for r in rows),
            sum(r.handled_once for r in rows),
            sum(r.handled_twice for r in rows),
            sum(r.lost for r in rows),
            sum(r.failing_dead + r.poison_quarantined + r.other_dead for r in rows),
            time.monotonic() - started,
        )
    )
    for writer in writers:
        assert not writer.errors, writer.errors
    assert not fleet.unexpected, (
        f"{len(fleet.unexpected)} daemon exits not caused by chaos\n{table}"
    )
    assert not lanes_error, table
    assert not drain_error, table
    assert_clean(rows, table)
    assert not bad_stops, "a daemon did not stop cleanly on SIGTERM\n" + table


def _group_offsets(bootstrap: str, services: list[Service]) -> str:
    """Each consumer group's committed offset and partition end (Tansu's end is only a hint
    after batched produce; the log's is exact): where a drain that did not finish stands on
    the transport. `bootstrap` may be the PostgreSQL log's URL (`PgLog.lag`)."""
    from outbox.kafka.lag import LagReader
    from outbox.pglog import PgLog

    parts = []
    try:
        reader = PgLog(bootstrap) if is_log_url(bootstrap) else LagReader(bootstrap)
        for service in services:
            if service.group:
                if isinstance(reader, PgLog):
                    [lag] = reader.lag([service.group])
                else:
                    lag = reader.group_lag(service.group)
                parts.append(
                    f"{service.group}: "
                    + ", ".join(f"p{p.partition} {p.committed}/{p.end}" for p in lag.partitions)
                )
    except Exception as exc:  # a diagnostic only
        parts.append(f"group offsets unreadable: {exc}")
    return "committed/end per partition: " + "; ".join(parts)


def _consumer_tails(fleet: Fleet, lines: int = 15) -> list[str]:
    """The last lines each running consumer logged: what a consumer that stopped making
    progress was doing (joined, assigned, revoked, committing, waiting for PostgreSQL)."""
    out = []
    for name, daemon in sorted(fleet.daemons.items()):
        if "consumer" in name and daemon.process.poll() is None:
            tail = daemon.output().splitlines()[-lines:]
            out.append(f"   last {len(tail)} lines of {name} (pid {daemon.process.pid}):")
            out += [f"     {line[:240]}" for line in tail]
    return out
