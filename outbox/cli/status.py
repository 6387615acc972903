"""`outbox status`: the rows of the queues by topic and state, the running daemons and the
consumer groups' lag, of one database or many.

`outbox status --json` prints one document of this shape (format_version 1; keys are only ever
added):

    {"format_version": 1, "schema": "outbox", "taken_at": "<ISO 8601, database now()>",
     "queues": {
       "producer": {"table": "producer_queue", "age_column": "created_at",
                    "states": ["pending", "retrying", "dead"],
                    "topics": {"<topic>": {"<state>": COUNT, ..., "total": COUNT}},
                    "totals": {"<state>": COUNT, ..., "total": COUNT}},
       "consumer": {... "age_column": "received_at",
                    "states": ["pending", "retrying", "dead", "processed"] ...}},
     "processes": [{"relay_id": "host:4242:ab12cd34", "queue": "producer", "host": "host",
                    "pid": 4242, "backend_pid": 123,
                    "sleeping": false, "alive": true, "seconds_since_update": 1.5,
                    "lanes": 64, "parked": false, "parked_since": null}],
     (a parked process, idle for --idle-disconnect seconds with no session of its own:
      "parked": true, "parked_since": "<ISO 8601>", "alive": true, "lanes": 0)
     "claims": [{"backend_pid": 456, "state": "idle in transaction", "age_seconds": 0.2}],
     "connections": {"outbox": {"outbox-handler": 5, "outbox-cli": 1}, "database": 9,
                     "server": 42, "max_connections": 300},
     "scheduled": {"topics": {"<topic>": {"rows": N, "overdue": N,
                              "next_due_at": "<ISO 8601>", "next_due_in_seconds": <float>}},
                   "rows": N, "overdue": N, "next_due_at": "<ISO 8601>" or null}}

(scheduled: the messages sent with a due time that is still to come, per topic; overdue: due
but not yet taken by a relay, and next_due_in_seconds negative then.)

With --kafka-bootstrap (or --transport postgres and --log-url: the groups of the PostgreSQL
log), "lag": [{"group": "...", "total": N, "topics": {"<topic>": N},
"partitions": [{"topic", "partition", "committed", "end", "lag", "past_end", "went_back",
"last_went_back"}], "error": null}] (past_end: the committed offset is past the partition's end;
went_back: how often the log was found behind the group's position there, 0 on Kafka, and
last_went_back null or {"at": "<ISO 8601>", "position", "end", "read_from"}: the last time, the
group's position and the partition's end then, and the offset it read the partition again
from); with --check,
"check": {"ok": bool, "max_age_seconds": <float or null>, "max_lag": <int or null>,
"max_dead": <int>,
"problems": ["..."]} and the exit code is 3 when not ok.

where COUNT is {"count": <rows>, "oldest_age_seconds": <float, or null when count is 0>}. Every
state of a queue appears under each listed topic and in totals; a topic appears when it has
rows.

With several databases (or a --databases-file), the document is
{"format_version": 1, "databases": [{"name": "...", "url": "<masked>", "schema": "...",
"error": null or "<why it could not be read>", and when read: "taken_at", "queues",
"processes", "claims" as above}], "lag": ..., "check": ...}, each problem of the check starting
`database NAME: `.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from outbox import formatting as fmt
from outbox import settings
from outbox.cli.arguments import (
    add_databases,
    add_groups,
    add_transport,
    databases_of,
    env_groups,
    transport_of,
)
from outbox.cli.common import DatabaseCommandFailed, _connected, _print, _safe, _table
from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.lag import GroupLag, PartitionLag, lag_json
from outbox.core.numbers import flag_type
from outbox.core.redact import redact_text, redact_url
from outbox.core.text import first_line
from outbox.postgres import operations as ops

if TYPE_CHECKING:
    from outbox.transports import Transport


#: Exit code of `outbox status --check` when a row is dead or older than --max-age.
CHECK_FAILED = 3


#: Databases `outbox status` reads at the same time; the others wait for a free slot.
STATUS_CONCURRENCY = 16


#: Seconds `outbox status` waits for each database by default (`--database-timeout`).
STATUS_DATABASE_TIMEOUT = 10.0


def add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `status` to the `outbox` command's subparsers."""
    status = commands.add_parser(
        "status",
        help="queue rows by topic and state; the running daemons; consumer-group lag",
        description="The rows of the queues by topic and state, and the running daemons, of "
        "each database given (several: --database-url more than once, or --databases-file; each "
        "is listed under its name, one that cannot be read is shown as such). With "
        "--kafka-bootstrap, the lag of the Kafka cluster's consumer groups; with --transport "
        "postgres and --log-url, the lag of the PostgreSQL log's. See "
        "docs/how-to/many-databases.md.",
    )
    add_databases(status)
    status.add_argument(
        "--database-timeout",
        type=flag_type("seconds"),
        default=STATUS_DATABASE_TIMEOUT,
        metavar="SECONDS",
        help=f"with several databases: seconds each may take to answer, after which it is shown "
        f"as not answering; up to {STATUS_CONCURRENCY} are read at the same time",
    )
    add_transport(status, "reader")
    add_groups(status, every="of the Kafka cluster, or of the log with --transport postgres")
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.add_argument(
        "--check",
        action="store_true",
        help=f"exit {CHECK_FAILED} when a queue holds more dead rows than --max-dead (any dead "
        "row by default), a pending or retrying row is older "
        "than --max-age, a group lags more than --max-lag, or a group's committed offset is "
        "past a partition's end (for cron and deploy gates); 0 otherwise",
    )
    status.add_argument(
        "--max-age",
        type=flag_type("seconds", settings.STATUS_MAX_AGE),
        default=os.environ.get(settings.STATUS_MAX_AGE),
        help=f"with --check: seconds a pending or retrying row may wait (env "
        f"{settings.STATUS_MAX_AGE}; default no limit)",
    )
    status.add_argument(
        "--max-dead",
        type=flag_type("count_or_zero"),
        default=0,
        help="with --check: dead rows each queue (producer_dead, consumer_queue) may hold, to "
        "accept the ones already known until they are requeued or purged; more fail the check "
        "(default 0: any dead row fails it)",
    )
    status.add_argument(
        "--max-lag",
        type=flag_type("count_or_zero", settings.STATUS_MAX_LAG),
        default=os.environ.get(settings.STATUS_MAX_LAG),
        help="with --check and --kafka-bootstrap (or --transport postgres and --log-url): "
        "records a consumer group may lag behind; a group above it, or whose lag cannot be "
        "read (a --group without any committed offset, a cluster that does not answer), "
        f"fails the check (env {settings.STATUS_MAX_LAG}; default no limit)",
    )


T = TypeVar("T")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What was read from one database: its value, or why there is none (one line)."""

    database: Database
    value: T | None
    error: str | None = None


def read_each(
    databases: Sequence[Database],
    read: Callable[[Database], T],
    timeout: float,
    concurrency: int = STATUS_CONCURRENCY,
) -> list[Outcome[T]]:
    """`read(database)` of each database, in their order, at most `concurrency` at a time.

    A database whose read raises an `OutboxError` or `psycopg.Error`, or has not returned
    `timeout` seconds after it started, gets its reason instead of a value, and never holds
    the others back: with N databases the whole takes at most about ceil(N / concurrency)
    * `timeout` seconds. A read that does not return is left to its daemon thread."""
    results: dict[int, Outcome[T]] = {}
    lock = threading.Lock()
    finished: queue.Queue[int] = queue.Queue()

    def work(index: int) -> None:
        database = databases[index]
        try:
            outcome = Outcome(database, read(database))
        except (OutboxError, psycopg.Error) as exc:
            outcome = Outcome(database, None, redact_text(first_line(exc)))
        except Exception as exc:  # one database's surprise must not hide the others
            reason = f"unexpected {type(exc).__name__}: {redact_text(first_line(exc))}"
            outcome = Outcome(database, None, reason)
        with lock:
            results.setdefault(index, outcome)
        finished.put(index)

    waiting = list(range(len(databases)))
    running: dict[int, float] = {}
    while waiting or running:
        while waiting and len(running) < concurrency:
            index = waiting.pop(0)
            running[index] = time.monotonic()
            name = f"outbox-status-{databases[index].name}"
            threading.Thread(target=work, args=(index,), name=name, daemon=True).start()
        due = min(running.values()) + timeout
        try:
            running.pop(finished.get(timeout=max(0.0, due - time.monotonic())), None)
        except queue.Empty:
            now = time.monotonic()
            for index, started in list(running.items()):
                if now - started >= timeout:
                    late: Outcome[T] = Outcome(
                        databases[index], None, f"no answer within {timeout:g} s"
                    )
                    with lock:
                        results.setdefault(index, late)
                    del running[index]
    return [results[index] for index in range(len(databases))]


def _read_status(timeout: float) -> Callable[[Database], ops.Status]:
    def read(database: Database) -> ops.Status:
        with _connected(database.url, database.schema, "status", timeout=timeout) as conn:
            return ops.status(conn, database.schema)

    return read


def _status(args: argparse.Namespace) -> int:
    from outbox import transports
    from outbox.core.redact import remember_secrets, secrets_of_url

    max_lag = None if args.max_lag is None or not args.check else int(args.max_lag)
    # The lag comes from the transport the consumers read: Kafka, or the PostgreSQL log.
    transport = transports.get(args.transport, what="--transport")
    where = transports.options(transport_of(args))
    endpoint = transport.endpoint(where)
    remember_secrets(transport.secrets(where))
    if max_lag is not None and not endpoint:
        raise ConfigurationError(transport.max_lag_needs)
    databases = databases_of(args)
    for database in databases:
        remember_secrets(secrets_of_url(database.url))
    # One database given as today: today's output. Several, or a file (whose length may vary
    # from one run to the next): each listed under its name.
    several = len(databases) > 1 or bool(args.databases_file)
    if several:
        outcomes = read_each(
            databases, _read_status(float(args.database_timeout)), float(args.database_timeout)
        )
    else:
        [database] = databases
        with _connected(database.url, database.schema, "status") as conn:
            outcomes = [Outcome(database, ops.status(conn, database.schema))]
    groups = args.groups if args.groups is not None else env_groups()
    lag: list[GroupLag] | None = None
    if endpoint:
        lag = _read_lag(transport, where, groups)
    if lag is not None and groups:
        lag = [_known(g) for g in lag]
    elif lag is None and args.groups:
        print(
            f"outbox status: --group is not read without {transport.endpoint_flag}: no lag "
            "is shown",
            file=sys.stderr,
        )
    max_age = None if args.max_age is None else float(args.max_age)
    max_dead = int(args.max_dead)
    problems: list[str] | None = None
    if args.check and not several:
        problems = check_problems(outcomes[0].value, max_age, lag, max_lag, max_dead)
    elif args.check:
        problems = []
        for o in outcomes:
            if o.value is None:
                problems.append(f"database {o.database.name}: cannot read its status: {o.error}")
            else:
                found = check_problems(o.value, max_age, max_dead=max_dead)
                problems.extend(f"database {o.database.name}: {p}" for p in found)
        problems.extend(check_problems(None, max_age, lag, max_lag, max_dead))
    if args.json:
        if several:
            doc: dict[str, Any] = {
                "format_version": fmt.STATUS_FORMAT_VERSION,
                "databases": [_database_json(o) for o in outcomes],
            }
        else:
            assert outcomes[0].value is not None
            doc = fmt.status_json(outcomes[0].value)
        if lag is not None:
            doc["lag"] = lag_json(lag)
        if problems is not None:
            doc["check"] = {
                "ok": not problems,
                "max_age_seconds": max_age,
                "max_lag": max_lag,
                "max_dead": max_dead,
                "problems": problems,
            }
        _print(json.dumps(doc, indent=2))
    else:
        if several:
            lines = _databases_text(outcomes)
        else:
            assert outcomes[0].value is not None
            lines = _status_text(outcomes[0].value)
        if lag is not None:
            lines += _lag_text(lag)
        if problems is not None:
            lines.append("")
            lines.append("check: ok" if not problems else f"check: FAILED ({len(problems)})")
            lines.extend(f"  {_safe(p)}" for p in problems)
        _print(lines)
    if problems:
        return CHECK_FAILED
    unread = [o.database.name for o in outcomes if o.value is None]
    if unread:
        raise DatabaseCommandFailed(
            f"status could not read {len(unread)} of {len(outcomes)} databases: "
            f"{', '.join(unread)} (each one's reason is printed above)"
        )
    return 0


def _database_json(outcome: Outcome[ops.Status]) -> dict[str, Any]:
    """One database's entry in the `databases` list of `outbox status --json`."""
    d = outcome.database
    doc: dict[str, Any] = {
        "name": d.name,
        "url": redact_url(d.url),
        "schema": d.schema,
        "error": outcome.error,
    }
    if outcome.value is not None:
        found = fmt.status_json(outcome.value)
        del found["format_version"]
        doc.update(found)
    return doc


def _databases_text(outcomes: Sequence[Outcome[ops.Status]]) -> list[str]:
    """Each database under a line naming it; one that could not be read says why."""
    lines: list[str] = []
    for o in outcomes:
        if lines:
            lines.append("")
        where = f"database {_safe(o.database.name)} ({redact_url(o.database.url)}, schema "
        where += f"{o.database.schema})"
        if o.value is None:
            lines.append(f"{where}: {_safe(o.error or 'unknown error')}")
            continue
        lines.append(f"{where}:")
        lines.extend(f"  {line}" if line else "" for line in _status_text(o.value))
    return lines


def _known(group: GroupLag) -> GroupLag:
    """A group named with --group that has no committed offset anywhere: not "lag 0" (a
    misspelt name in a deploy gate passed), but a lag that cannot be read."""
    if group.error is None and not group.partitions:
        return GroupLag(
            group.group,
            error="no committed offsets: no such group, or it has not committed yet",
        )
    return group


def _read_lag(transport: Transport[Any], found: Any, groups: Sequence[str]) -> list[GroupLag]:
    """The lag of `groups` (every group when empty) read from `transport` with its options
    `found`."""
    transport.check(found, 0.0)  # the log: one line when unreachable or not migrated
    reader = transport.lag_reader(found, 10.0)
    try:
        return reader.lag(groups or None)
    except psycopg.Error as exc:  # the log's database
        raise DatabaseCommandFailed(
            f"status failed reading the log's lag in PostgreSQL: {first_line(exc)}"
        ) from None
    finally:
        reader.close()


def check_problems(
    status: ops.Status | None,
    max_age: float | None,
    lag: Sequence[GroupLag] | None = None,
    max_lag: int | None = None,
    max_dead: int = 0,
) -> list[str]:
    """What fails `outbox status --check`: a queue with more than max_dead dead rows (each
    topic's dead rows listed), waiting rows older than max_age, and consumer groups (`lag`,
    GroupLag) with a committed offset past a partition's end, lagging more than max_lag, or
    whose lag cannot be read (the last two with max_lag)."""
    problems = []
    for q in status.queues if status is not None else ():
        table = ops.DEAD_TABLES[q.queue]
        all_dead = q.totals.get("dead", ops.Count()).rows
        too_many = all_dead > max_dead
        if too_many and max_dead:
            problems.append(f"{table}: {all_dead} dead rows (> --max-dead {max_dead})")
        for topic, per_state in q.topics.items():
            dead = per_state.get("dead", ops.Count())
            if dead.rows and too_many:
                problems.append(f"{table}: {dead.rows} dead in topic {topic}")
            if max_age is None:
                continue
            for state in ("pending", "retrying"):
                count = per_state.get(state, ops.Count())
                if count.oldest_age is not None and count.oldest_age > max_age:
                    problems.append(
                        f"{q.table}: {state} row of topic {topic} waiting "
                        f"{fmt.age(count.oldest_age)} (> {max_age:g} s)"
                    )
    for g in lag or ():
        for p in g.past_end:
            problems.append(
                f"consumer group {g.group}: committed offset {p.committed} is past the end "
                f"({p.end}) of topic {p.topic} partition {p.partition}"
            )
    if max_lag is not None:
        for g in lag or ():
            if g.error is not None:
                problems.append(f"consumer group {g.group}: cannot read its lag: {g.error}")
            elif g.total > max_lag:
                problems.append(f"consumer group {g.group}: lag {g.total} (> {max_lag})")
    return problems


def _lag_text(groups: Sequence[GroupLag]) -> list[str]:
    lines = [""]
    if not groups:
        return [*lines, "consumer groups: none"]
    for g in groups:
        if g.error is not None:
            lines.append(f"consumer group {_safe(g.group)}: cannot read its lag: {_safe(g.error)}")
            continue
        past_end = len(g.past_end)
        where = "partition" if past_end == 1 else "partitions"
        beyond = f" (committed past the end in {past_end} {where})" if past_end else ""
        lines.append(f"consumer group {_safe(g.group)}: lag {g.total}{beyond}")
        if g.partitions:
            body = [
                [
                    _safe(p.topic),
                    str(p.partition),
                    str(p.committed),
                    str(p.end),
                    "past end" if p.past_end else str(p.lag),
                ]
                for p in g.partitions
            ]
            header = ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"]
            lines.extend(_table(header, body, indent="  "))
        lines.extend(f"  {_went_back(p)}" for p in g.partitions if p.went_back)
    return lines


def _went_back(p: PartitionLag) -> str:
    """A partition under which the log went back (restored, rolled back by hand), in a line."""
    times = "time" if p.went_back == 1 else "times"
    line = f"topic {_safe(p.topic)} partition {p.partition} went back under the group "
    line += f"{p.went_back} {times}"
    w = p.last_went_back
    if w is not None:
        line += (
            f", last at {fmt.when(w.at)}: position {w.position}, end {w.end}, read again from "
            f"offset {w.read_from}"
        )
    return line


def _count_cell(count: ops.Count) -> str:
    return "-" if count.rows == 0 else f"{count.rows} ({fmt.age(count.oldest_age)})"


def _status_text(status: ops.Status) -> list[str]:
    lines = [f"outbox schema {status.schema!r} at {fmt.when(status.taken_at)}"]
    for q in status.queues:
        lines.append("")
        if q.total.rows == 0:
            lines.append(f"{q.table}: empty")
            continue
        # A handled message has left the queue: only its id is kept, in consumer_processed.
        handled = q.totals.get("processed", ops.Count())
        held = ops.Count()
        for state, count in q.totals.items():
            if state != "processed":
                held += count
        rows = "row" if held.rows == 1 else "rows"
        head = f"{q.table}: " + (
            f"{held.rows} {rows}, oldest {fmt.age(held.oldest_age)}" if held.rows else "empty"
        )
        if handled.rows:
            ids = "its id" if handled.rows == 1 else "their ids"
            head += f"; {handled.rows} handled, {ids} kept in {ops.PROCESSED_TABLE}"
        lines.append(f"{head}; each cell: rows (age of the oldest, by {q.age_column})")
        body = [
            [_safe(topic), *(_count_cell(per_state[s]) for s in q.states)]
            for topic, per_state in q.topics.items()
        ]
        body.append(["TOTAL", *(_count_cell(q.totals[s]) for s in q.states)])
        lines.extend(_table(["TOPIC", *(s.upper() for s in q.states)], body, indent="  "))
    lines.extend(_scheduled_text(status))
    lines.extend(_connections_text(status.connections))
    lines.append("")
    if not status.processes:
        lines.append("processes: none registered in relay_state")
    else:
        parked = sum(p.parked for p in status.processes)
        lines.append(
            f"processes: {len(status.processes)} registered in relay_state"
            + (f" ({parked} parked: idle, holding no connection)" if parked else "")
        )
        body = [
            [
                _safe(p.relay_id),
                _safe(p.host or "-"),
                "-" if p.pid is None else str(p.pid),
                _safe(p.queue),
                str(p.backend_pid),
                fmt.process_state(p, status.taken_at),
                str(p.lanes),
                fmt.age(p.since_update),
            ]
            for p in status.processes
        ]
        header = ["ID", "HOST", "PID", "QUEUE", "BACKEND PID", "STATE", "LANES", "SINCE"]
        lines.extend(_table(header, body, indent="  "))
    if status.claims:
        lines.append("")
        lines.append(f"claims: {len(status.claims)} handler transactions in flight")
        body = [[str(c.backend_pid), _safe(c.state), fmt.age(c.age)] for c in status.claims]
        lines.extend(_table(["BACKEND PID", "STATE", "AGE"], body, indent="  "))
    return lines


def _connections_text(connections: ops.Connections | None) -> list[str]:
    """Who holds the database's connections: outbox's by application name, then all."""
    if connections is None:
        return []
    ours = sum(connections.outbox.values())
    named = ", ".join(f"{_safe(name)} {n}" for name, n in connections.outbox.items())
    return [
        "",
        f"connections: {ours} of outbox here"
        + (f" ({named})" if named else "")
        + f"; {connections.database} to this database, {connections.server} to the server "
        f"of max_connections {connections.max_connections}",
    ]


def _scheduled_text(status: ops.Status) -> list[str]:
    """The messages due later (producer_scheduled), per topic: how many, how many overdue,
    and the next due time."""
    if not status.scheduled:
        return ["", "producer_scheduled: none due later"]
    rows = sum(s.rows for s in status.scheduled)
    first = min(status.scheduled, key=lambda s: s.next_due_in)
    lines = [
        "",
        f"producer_scheduled: {rows} due later, next at {fmt.when(first.next_due_at)} "
        f"({_due_in(first.next_due_in)}); overdue: due, not yet taken by a relay",
    ]
    body = [
        [_safe(s.topic), str(s.rows), str(s.overdue) if s.overdue else "-", _due_in(s.next_due_in)]
        for s in status.scheduled
    ]
    lines.extend(_table(["TOPIC", "SCHEDULED", "OVERDUE", "NEXT DUE"], body, indent="  "))
    return lines


def _due_in(seconds: float) -> str:
    return f"in {fmt.age(seconds)}" if seconds > 0 else f"{fmt.age(-seconds)} overdue"
