"""What the operator commands do: queue status, and inspecting, requeueing and purging dead rows.

Every function takes a psycopg connection and a schema name and returns plain dataclasses; none
prints. Functions that change rows run in `conn.transaction()`: on an autocommit connection that
is their own transaction, inside a caller's transaction it is a savepoint and the change (and its
wake-up NOTIFY) takes effect when the caller commits.

Row states (see `sql/operations.sql`): a producer row is pending, retrying or dead (dead rows
are in `producer_dead`; requeue moves them back to `producer_queue` with their id); a consumer
row is processed (its id kept in `consumer_processed` for the dedup window) or else pending,
retrying or dead. A processed message is never dead here, so requeue and purge cannot touch it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import tuple_row

from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.text import first_line
from outbox.core.wire import from_raw_json
from outbox.postgres.queries import channel, queries

Queue = Literal["producer", "consumer"]
#: The queues, in the order `status` reports them.
QUEUES: tuple[Queue, ...] = ("producer", "consumer")
#: The states of each queue, in the order they are reported.
STATES: dict[Queue, tuple[str, ...]] = {
    "producer": ("pending", "retrying", "dead"),
    "consumer": ("pending", "retrying", "dead", "processed"),
}
#: The table of each queue.
TABLES: dict[Queue, str] = {"producer": "producer_queue", "consumer": "consumer_queue"}
#: Where a queue's dead rows are: a dead producer row moves to producer_dead, a dead consumer
#: row stays in consumer_queue. Reports about dead rows name this table.
DEAD_TABLES: dict[Queue, str] = {"producer": "producer_dead", "consumer": "consumer_queue"}
#: Where a handled consumer message is kept for the dedup window (migration 0007).
PROCESSED_TABLE = "consumer_processed"
#: The column the age of a queue's rows is measured from.
AGE_COLUMNS: dict[Queue, str] = {"producer": "created_at", "consumer": "received_at"}
#: A row named on the command line: its bigserial `id` or its message UUID.
RowId = int | uuid.UUID
#: Seconds an operator tool's session waits for a row lock (`SET lock_timeout`) before it gives
#: up: a row named by id may be locked by a running handler, and requeue or purge should then
#: change nothing and say so, not wait for as long as the handler runs.
LOCK_TIMEOUT_SECONDS = 10

_MAX_BIGINT = 2**63 - 1
_MAX_PROBLEMS = 5


def limit_lock_wait(conn: psycopg.Connection[Any], schema: str) -> None:
    """Make the operator tool's session on `conn` wait at most LOCK_TIMEOUT_SECONDS for a row
    lock, then fail with `psycopg.errors.LockNotAvailable` (it changed nothing)."""
    conn.execute(queries(schema)["ops_lock_timeout"], {"timeout": f"{LOCK_TIMEOUT_SECONDS}s"})


def limit_statement_time(conn: psycopg.Connection[Any], schema: str, seconds: float) -> None:
    """Make each statement of the session on `conn` fail (`psycopg.errors.QueryCanceled`) after
    `seconds` (at least a millisecond), so that one slow database cannot hold a tool."""
    milliseconds = max(1, round(seconds * 1000))
    conn.execute(queries(schema)["ops_statement_timeout"], {"timeout": str(milliseconds)})


class NoSuchDeadLetter(OutboxError, LookupError):
    """A row named by id is not in the queue, or (for requeue and purge) is not dead."""


class RequeueConflict(OutboxError):
    """A dead producer row cannot go back: a queued row has its message id (or its id)."""


# -- status ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Count:
    """How many rows, and the age in seconds of the oldest (None when there are none)."""

    rows: int = 0
    oldest_age: float | None = None

    def __add__(self, other: Count) -> Count:
        ages = [a for a in (self.oldest_age, other.oldest_age) if a is not None]
        return Count(self.rows + other.rows, max(ages) if ages else None)


@dataclass(frozen=True)
class QueueStatus:
    """The rows of one queue by topic and state; every state of the queue has an entry."""

    queue: Queue
    table: str
    age_column: str
    states: tuple[str, ...]
    #: topic -> state -> Count, topics in name order.
    topics: dict[str, dict[str, Count]]
    #: state -> Count over every topic.
    totals: dict[str, Count]
    #: every row of the queue.
    total: Count


@dataclass(frozen=True, slots=True)
class Scheduled:
    """Messages of one topic due later (`producer_scheduled`): how many, how many of them are
    due but not yet taken by a relay, and the next due time (the seconds until it: negative
    when overdue)."""

    topic: str
    rows: int
    overdue: int
    next_due_at: datetime
    next_due_in: float


@dataclass(frozen=True, slots=True)
class Process:
    """A relay or handler process registered in `relay_state`."""

    relay_id: str
    queue: str
    backend_pid: int
    sleeping: bool
    #: False when the process's database session is gone (a stale row).
    alive: bool
    #: Seconds since it registered, went to sleep or woke up (not a heartbeat).
    since_update: float
    #: Lanes it owns right now (advisory locks held by its session).
    lanes: int = 0
    #: Since when it is parked (idle for --idle-disconnect seconds: no session, no lanes,
    #: looking for rows now and then), or None when it is not.
    parked_since: datetime | None = None

    @property
    def parked(self) -> bool:
        """Whether the process is parked on this database (see `parked_since`)."""
        return self.parked_since is not None

    @property
    def host(self) -> str | None:
        """The host the process runs on, from its relay_id (`host:pid:random`); else None."""
        return _relay_id_parts(self.relay_id)[0]

    @property
    def pid(self) -> int | None:
        """The daemon's own process id, from its relay_id; None when the id has no pid."""
        return _relay_id_parts(self.relay_id)[1]


def _relay_id_parts(relay_id: str) -> tuple[str | None, int | None]:
    """(host, pid) of a relay_id `host:pid:random` (see outbox.daemons.relay.new_relay_id)."""
    parts = relay_id.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None, None
    return parts[0] or None, int(parts[1])


@dataclass(frozen=True, slots=True)
class Claim:
    """A handler transaction in flight, holding the row of the message it is handling."""

    backend_pid: int
    state: str
    #: Seconds since its transaction began; compare with the Handler's --lease.
    age: float


@dataclass(frozen=True, slots=True)
class Connections:
    """Who holds a database's connections, as `pg_stat_activity` shows them to this role."""

    #: outbox's sessions of this database by application name (`outbox-handler`, ...).
    outbox: dict[str, int]
    #: Client sessions of this database, and of the whole server, and its max_connections.
    database: int
    server: int
    max_connections: int


@dataclass(frozen=True)
class Status:
    """Everything `outbox status` reports, read in one transaction."""

    schema: str
    #: The database's now() for this read; ages are relative to it.
    taken_at: datetime
    queues: tuple[QueueStatus, ...]
    processes: tuple[Process, ...]
    claims: tuple[Claim, ...] = ()
    #: Messages due later, per topic in name order (decision 21).
    scheduled: tuple[Scheduled, ...] = ()
    #: Who holds the database's connections (None: not read).
    connections: Connections | None = None


def _queue_status(queue: Queue, rows: list[tuple[Any, ...]]) -> QueueStatus:
    states = STATES[queue]
    topics: dict[str, dict[str, Count]] = {}
    for topic, state, count, oldest in rows:
        per_state = topics.setdefault(topic, {s: Count() for s in states})
        per_state[state] = Count(int(count), float(oldest))
    totals = {s: Count() for s in states}
    for per_state in topics.values():
        for s in states:
            totals[s] += per_state[s]
    total = Count()
    for count in totals.values():
        total += count
    return QueueStatus(
        queue=queue,
        table=TABLES[queue],
        age_column=AGE_COLUMNS[queue],
        states=states,
        topics=dict(sorted(topics.items())),
        totals=totals,
        total=total,
    )


def status(conn: psycopg.Connection[Any], schema: str) -> Status:
    """Counts and oldest ages per queue, topic and state, and the registered processes."""
    sql = queries(schema)
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        now_row = cur.execute(sql["ops_now"]).fetchone()
        assert now_row is not None
        queues = tuple(
            _queue_status(queue, cur.execute(sql[f"ops_status_{queue}"]).fetchall())
            for queue in QUEUES
        )
        processes = tuple(
            Process(
                relay_id=relay_id,
                queue=queue,
                backend_pid=int(pid),
                sleeping=bool(sleeping),
                alive=bool(alive),
                since_update=float(since),
                lanes=int(lanes),
                parked_since=parked_at,
            )
            for relay_id, queue, pid, sleeping, alive, since, lanes, parked_at in cur.execute(
                sql["ops_status_processes"]
            ).fetchall()
        )
        claims = tuple(
            Claim(backend_pid=int(pid), state=str(state), age=float(age))
            for pid, state, age in cur.execute(sql["ops_status_claims"]).fetchall()
        )
        scheduled = tuple(
            Scheduled(str(topic), int(rows), int(overdue), at, float(due_in))
            for topic, rows, overdue, at, due_in in cur.execute(
                sql["ops_status_scheduled"]
            ).fetchall()
        )
        named, here, server, most = cur.execute(sql["ops_status_connections"]).fetchone() or (
            {},
            0,
            0,
            0,
        )
    return Status(
        schema=schema,
        taken_at=now_row[0],
        queues=queues,
        processes=processes,
        claims=claims,
        scheduled=scheduled,
        connections=Connections(
            {str(k): int(v) for k, v in dict(named or {}).items()},
            int(here),
            int(server),
            int(most),
        ),
    )


# -- dead letters ---------------------------------------------------------------------------


def parse_row_id(text: str) -> RowId:
    """A row id from the command line: a positive integer id or a message UUID; else ValueError."""
    text = text.strip()
    if text.isdigit():
        number = int(text)
        if 1 <= number <= _MAX_BIGINT:
            return number
        raise ValueError(f"row id {text} is out of range")
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a row id (a positive integer) nor a message UUID"
        ) from None


def error_summary(error: str | None) -> str:
    """The telling line of `last_error`: its first, or for a Python traceback the line that
    names the last exception (`ValueError: ...`), not the traceback's last line: PostgreSQL's
    and SQLAlchemy's messages run over several lines (a caret under the statement, a "Background
    on this error" link), and an exception's own text may hold line breaks."""
    if not error:
        return ""
    # Lines end at "\n" only: a carriage return or another break inside the exception's own
    # text must not make a line of its own; the caller escapes them.
    lines = [line.rstrip() for line in error.strip().split("\n")]
    if not lines[0].startswith("Traceback (most recent call last)"):
        return next((line.strip() for line in lines if line.strip()), "")
    # The last exception's line: the first unindented line after the last frame ("  File ...",
    # then its indented source lines) of the last traceback.
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback ("))
    frames = [i for i in range(start, len(lines)) if lines[i].startswith("  File ")]
    after = (frames[-1] if frames else start) + 1
    for line in lines[after:]:
        if line.strip() and not line.startswith(" "):
            return line.strip()
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead row as `dead-letters list` shows it; `last_error` is the whole text, or for
    one longer than 8,192 characters its first 4,096 and its last lines (enough for
    `error_summary`): `dead-letters show` reads the whole row."""

    id: int
    message_id: uuid.UUID
    topic: str
    key: bytes | None
    attempts: int
    dead_at: datetime
    last_error: str | None
    #: The record could not be stored as an ordinary row (consumer queue only): `last_error`
    #: says why, and `dead-letters show` decodes its raw headers.
    quarantined: bool = False

    @property
    def error_summary(self) -> str:
        """The telling line of `last_error` (see `error_summary`)."""
        return error_summary(self.last_error)


@dataclass(frozen=True)
class DeadLetterPage:
    """The first `limit` dead rows of a queue (by id), and how many there are in all."""

    queue: Queue
    table: str
    topic: str | None
    rows: tuple[DeadLetter, ...]
    total: int


@dataclass(frozen=True)
class QueueRow:
    """Everything stored about one row of a queue; consumer-only fields are None for producer."""

    queue: Queue
    table: str
    id: int
    message_id: uuid.UUID
    topic: str
    key: bytes | None
    payload: bytes
    headers: dict[str, Any]
    content_type: str
    lane: int
    state: str
    created_at: datetime
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    dead_at: datetime | None
    source_partition: int | None = None
    source_offset: int | None = None
    received_at: datetime | None = None
    processed_at: datetime | None = None
    #: A quarantined consumer row's headers as received, decoded from `raw_headers`:
    #: (name, value or None) bytes; None for any other row.
    raw_headers: tuple[tuple[bytes, bytes | None], ...] | None = None

    @property
    def quarantined(self) -> bool:
        """Stored dead on arrival: it could not be an ordinary row (`last_error` says why).
        Requeued, its handler gets the raw payload as bytes and no headers."""
        return self.raw_headers is not None


@dataclass(frozen=True)
class Selection:
    """Which dead rows requeue or purge acts on: exactly one of `ids`, `topic`, `everything`.

    With `ids` every named row must exist and be dead, else nothing changes. With `topic` or
    `everything`, the dead rows that match (possibly none) change.
    """

    ids: tuple[RowId, ...] = field(default=())
    topic: str | None = None
    everything: bool = False

    def __post_init__(self) -> None:
        chosen = sum((bool(self.ids), self.topic is not None, self.everything))
        if chosen != 1:
            raise ConfigurationError("select dead rows by ids, by topic or all of them (one)")


def _check_queue(queue: str) -> Queue:
    if queue not in TABLES:
        raise ConfigurationError(f"queue must be 'consumer' or 'producer', got {queue!r}")
    return queue


def list_dead_letters(
    conn: psycopg.Connection[Any],
    schema: str,
    queue: Queue = "consumer",
    *,
    topic: str | None = None,
    limit: int = 100,
    text: str | None = None,
) -> DeadLetterPage:
    """The dead rows of a queue, oldest id first, optionally of one topic only, and with
    `text` only those whose id, message id, key or error contains it (case-insensitive)."""
    _check_queue(queue)
    if limit < 1:
        raise ConfigurationError(f"limit must be >= 1, got {limit}")
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            queries(schema)[f"ops_{queue}_dead_list"],
            {"topic": topic, "limit": limit, "text": text or None},
        ).fetchall()
    letters = tuple(
        DeadLetter(
            id=id_,
            message_id=message_id,
            topic=topic_,
            key=None if key is None else bytes(key),
            attempts=attempts,
            dead_at=dead_at,
            last_error=last_error,
            quarantined=bool(rest[0]) if len(rest) > 1 else False,
        )
        for id_, message_id, topic_, key, attempts, dead_at, last_error, *rest in rows
    )
    total = int(rows[0][-1]) if rows else 0
    return DeadLetterPage(
        queue=queue, table=DEAD_TABLES[queue], topic=topic, rows=letters, total=total
    )


def show_row(conn: psycopg.Connection[Any], schema: str, queue: Queue, row_id: RowId) -> QueueRow:
    """One row of a queue, in any state, by id or message UUID; NoSuchDeadLetter if absent."""
    _check_queue(queue)
    params = (
        {"id": row_id, "message_id": None}
        if isinstance(row_id, int)
        else {"id": None, "message_id": row_id}
    )
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(queries(schema)[f"ops_{queue}_show"], params).fetchone()
    if row is None:
        raise NoSuchDeadLetter(no_row(queue, row_id))
    consumer: dict[str, Any] = dict(
        zip(
            ("source_partition", "source_offset", "received_at", "processed_at"),
            row[14:18],
            strict=False,
        )
    )
    if len(row) > 18 and row[18] is not None:
        consumer["raw_headers"] = from_raw_json(row[18])
    return QueueRow(
        queue=queue,
        table=(
            DEAD_TABLES[queue]
            if row[13] == "dead"
            else PROCESSED_TABLE
            if row[13] == "processed"
            else TABLES[queue]
        ),
        id=row[0],
        message_id=row[1],
        topic=row[2],
        key=None if row[3] is None else bytes(row[3]),
        payload=bytes(row[4]),
        headers=dict(row[5] or {}),
        content_type=row[6],
        lane=row[7],
        created_at=row[8],
        attempts=row[9],
        next_attempt_at=row[10],
        last_error=row[11],
        dead_at=row[12],
        state=row[13],
        **consumer,
    )


def no_row(queue: Queue, row_id: RowId) -> str:
    """That no table of a queue holds row `row_id` (a producer row is in producer_queue, or
    in producer_dead once dead)."""
    if TABLES[queue] == DEAD_TABLES[queue]:
        return f"{TABLES[queue]} has no row {row_id}"
    return f"neither {TABLES[queue]} nor {DEAD_TABLES[queue]} has row {row_id}"


def _dead_ids(
    cur: psycopg.Cursor[tuple[Any, ...]],
    schema: str,
    queue: Queue,
    named: tuple[RowId, ...],
    verb: str,
) -> list[int]:
    """Lock the named rows; return their ids if every one exists and is dead, else raise."""
    numbers = sorted({i for i in named if isinstance(i, int)})
    uuids = sorted({i for i in named if isinstance(i, uuid.UUID)}, key=str)
    rows = cur.execute(
        queries(schema)[f"ops_{queue}_lock"], {"ids": numbers, "message_ids": uuids}
    ).fetchall()
    by_id = {r[0]: r for r in rows}
    by_message = {r[1]: r for r in rows}
    problems: list[str] = []
    ids: set[int] = set()
    for ref in dict.fromkeys(named):  # in the order given, once each
        row = by_id.get(ref) if isinstance(ref, int) else by_message.get(ref)
        if row is None:
            problems.append(f"no row {ref}")
        elif row[2] != "dead":
            problems.append(f"row {ref} is {row[2]}, not dead")
        else:
            ids.add(row[0])
    if problems:
        more = len(problems) - _MAX_PROBLEMS
        listed = "; ".join(problems[:_MAX_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")
        raise NoSuchDeadLetter(
            f"cannot {verb} in {DEAD_TABLES[queue]}: {listed}; nothing was {verb}d"
        )
    return sorted(ids)


def _change(
    conn: psycopg.Connection[Any],
    schema: str,
    queue: Queue,
    selection: Selection,
    action: Literal["requeue", "purge"],
) -> int:
    _check_queue(queue)
    sql = queries(schema)
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        ids = _dead_ids(cur, schema, queue, selection.ids, action) if selection.ids else None
        params = {"ids": ids, "topic": selection.topic}
        if queue == "producer" and action == "requeue":
            _check_clashes(cur, schema, params)
        try:
            cur.execute(sql[f"ops_{queue}_{action}"], params)
        except psycopg.errors.UniqueViolation as exc:  # a row sent since the check above
            raise RequeueConflict(
                f"cannot requeue in producer_queue: {first_line(exc)}; nothing was requeued"
            ) from None
        changed = max(cur.rowcount, 0)
        if action == "requeue" and changed:
            cur.execute(sql["ops_notify"], {"channel": channel(schema, TABLES[queue])})
    return changed


def _check_clashes(
    cur: psycopg.Cursor[tuple[Any, ...]], schema: str, params: dict[str, Any]
) -> None:
    """Raise RequeueConflict if a selected dead producer row cannot go back to the queue."""
    clashes = cur.execute(queries(schema)["ops_producer_requeue_clashes"], params).fetchall()
    if not clashes:
        return
    problems = [
        f"dead row {id_} (message {message_id}) clashes with queued row {queued}"
        for id_, message_id, queued in clashes[:_MAX_PROBLEMS]
    ]
    more = len(clashes) - _MAX_PROBLEMS
    listed = "; ".join(problems) + (f"; and {more} more" if more > 0 else "")
    raise RequeueConflict(
        f"cannot requeue in producer_queue: {listed} (the same message id is queued again: "
        "purge the dead row, or wait until the queued one is sent); nothing was requeued"
    )


def requeue(conn: psycopg.Connection[Any], schema: str, queue: Queue, selection: Selection) -> int:
    """Make the selected dead rows pending again and wake the daemon; return how many."""
    # One transaction: dead_at and last_error cleared, attempts 0, due now (a producer row
    # moved back from producer_dead with its id), then a NOTIFY on the queue's channel, which
    # PostgreSQL delivers at commit together with the change.
    return _change(conn, schema, queue, selection, "requeue")


@dataclass(frozen=True, slots=True)
class Overtaken:
    """A dead consumer row whose key's later messages were already handled."""

    id: int
    key: bytes
    #: Later rows of the same key already processed (a lower bound: processed rows older
    #: than the dedup window are forgotten).
    later: int


def overtaken(
    conn: psycopg.Connection[Any], schema: str, selection: Selection
) -> tuple[Overtaken, ...]:
    """The selected dead consumer rows that later messages of their key have overtaken.

    The Handler holds a key back behind a message waiting for a retry, not behind a dead one:
    once a message is dead its key's later messages run, and requeued it runs after them.
    Call it before `requeue` (it reads dead rows).
    """
    ids: list[int] | None = None
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        if selection.ids:
            ids = _dead_ids(cur, schema, "consumer", selection.ids, "requeue")
        rows = cur.execute(
            queries(schema)["ops_consumer_overtaken"], {"ids": ids, "topic": selection.topic}
        ).fetchall()
    return tuple(Overtaken(int(i), bytes(k), int(n)) for i, k, n in rows)


def purge(conn: psycopg.Connection[Any], schema: str, queue: Queue, selection: Selection) -> int:
    """Delete the selected dead rows (never a live or processed row); return how many."""
    return _change(conn, schema, queue, selection, "purge")
