"""The operator commands of `outbox`: `status`, `dead-letters list|show|requeue|purge`,
`log-groups forget` and `log-topics list|create|alter`.

`outbox.cli` calls `add_operator_commands` while building its parser and `run_operator_command`
before its own commands. Errors follow the CLI's rules: an `OutboxError` (one line, exit 1, as
printed by `outbox.cli.main`), or a usage error (one line on stderr, exit 2).

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
                    "lanes": 64}],
     "claims": [{"backend_pid": 456, "state": "idle in transaction", "age_seconds": 0.2}],
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg

from outbox import formatting as fmt
from outbox import settings
from outbox.cli.arguments import (
    ENV_DATABASE_URL,
    ENV_LOG_URL,
    add_database,
    add_databases,
    add_groups,
    add_kafka,
    add_log,
    add_transport,
    databases_of,
    env_groups,
    require,
    transport_of,
)
from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError, InvalidTopic, OutboxError
from outbox.core.lag import GroupLag, PartitionLag, lag_json
from outbox.core.numbers import flag_type
from outbox.core.redact import redact_text, redact_url
from outbox.core.text import first_line
from outbox.core.topics import validate_topic
from outbox.postgres import operations as ops
from outbox.postgres.connection import connect_or_raise
from outbox.postgres.migrate import check_schema
from outbox.postgres.queries import validate_schema

if TYPE_CHECKING:
    from outbox.pglog.log import TopicInfo
    from outbox.transports import Transport, TransportSettings

# The same variables as outbox.cli (not imported from there: outbox.cli imports this module).

#: The error column of `dead-letters list` is cut to this many characters.
ERROR_COLUMN_CHARS = 120
#: Exit code of `outbox status --check` when a row is dead or older than --max-age.
CHECK_FAILED = 3
#: Databases `outbox status` reads at the same time; the others wait for a free slot.
STATUS_CONCURRENCY = 16
#: Seconds `outbox status` waits for each database by default (`--database-timeout`).
STATUS_DATABASE_TIMEOUT = 10.0


class DatabaseCommandFailed(OutboxError):
    """PostgreSQL refused or dropped the statement of an operator command."""


class NoSuchGroup(OutboxError, LookupError):
    """`log-groups forget` named a consumer group the log does not know."""


# -- arguments ------------------------------------------------------------------------------


def _add_queue(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queue",
        choices=("consumer", "producer"),
        default="consumer",
        help="consumer (the inbox's consumer_queue; default) or producer (the outbox: its dead "
        "rows are in producer_dead)",
    )


def _row_id(text: str) -> ops.RowId:
    try:
        return ops.parse_row_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _topic(text: str) -> str:
    # Only a name Kafka accepts can be in a queue; the filter is a bound parameter anyway.
    try:
        return validate_topic(text)
    except InvalidTopic as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _partitions(text: str) -> int:
    from outbox.pglog.log import MAX_PARTITIONS

    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_PARTITIONS}, got {text!r}"
        )
    return number


def add_operator_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `status`, `dead-letters`, `log-groups` and `log-topics` commands to the
    `outbox` command's subparsers."""
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
    add_kafka(status)
    add_transport(status)
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

    dead = commands.add_parser(
        "dead-letters",
        help="list, show, requeue or purge the rows that gave up",
        description="Inspect and act on dead rows: those of consumer_queue (default) or, with "
        "--queue producer, producer_dead. "
        "See docs/how-to/dead-letters.md.",
    )
    actions = dead.add_subparsers(
        dest="dead_letters_command",
        required=True,
        metavar="ACTION",
    )

    listing = actions.add_parser("list", help="the dead rows of a queue, oldest first")
    add_database(listing)
    _add_queue(listing)
    listing.add_argument("--topic", type=_topic, help="only the rows of this topic")
    listing.add_argument(
        "--limit", type=flag_type("count"), default=100, help="show at most N rows (default 100)"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")

    show = actions.add_parser("show", help="everything about one row, with the whole error")
    add_database(show)
    _add_queue(show)
    show.add_argument("id", type=_row_id, metavar="ID", help="row id or message UUID")
    show.add_argument("--json", action="store_true", help="print one JSON document")

    for name, what in (
        ("requeue", "make dead rows pending again and wake the daemon"),
        ("purge", "delete dead rows for good"),
    ):
        change = actions.add_parser(
            name,
            help=what,
            description=f"{what[0].upper()}{what[1:]}. Select them by ID (row ids or message "
            "UUIDs; each must name a dead row, else nothing changes), by --topic, or --all."
            + (
                " A requeued consumer row runs after the later messages of its key that were "
                "handled while it was dead (requeue warns, with their count); a quarantined "
                "row's handler gets its raw payload as bytes and no headers."
                if name == "requeue"
                else ""
            ),
        )
        add_database(change)
        _add_queue(change)
        change.add_argument(
            "ids", nargs="*", type=_row_id, metavar="ID", help="row ids or message UUIDs"
        )
        change.add_argument("--topic", type=_topic, help="every dead row of this topic")
        change.add_argument(
            "--all", dest="all_rows", action="store_true", help="every dead row of the queue"
        )

    groups = commands.add_parser(
        "log-groups",
        help="forget a consumer group of the PostgreSQL log (--transport postgres)",
        description="Administer the consumer groups of the PostgreSQL log. See "
        "docs/how-to/postgres-log.md.",
    )
    group_actions = groups.add_subparsers(
        dest="log_groups_command",
        required=True,
        metavar="ACTION",
    )
    forget = group_actions.add_parser(
        "forget",
        help="drop a group's committed offsets, so that they no longer hold back retention",
        description="Drop the committed offsets of a consumer group that is gone for good: "
        "the log's retention keeps every record a known group has not read, so a group that "
        "no consumer reads any more holds records back until it is forgotten. Refused, and "
        "nothing changes, for a group the log does not know or one with a consumer running "
        "(stop its consumers first). A consumer started later with the same --group starts as "
        "a new group, at the earliest record the log keeps.",
    )
    add_log(forget)
    forget.add_argument("group", metavar="GROUP", help="the group (its consumers' --group)")

    topics = commands.add_parser(
        "log-topics",
        help="list the PostgreSQL log's topics, create one, or add partitions to one",
        description="Administer the topics of the PostgreSQL log (--transport postgres). A "
        "producer creates a topic on first publish with its --log-partitions; these commands "
        "list topics, create one ahead, and add partitions. See docs/how-to/postgres-log.md.",
    )
    topic_actions = topics.add_subparsers(
        dest="log_topics_command",
        required=True,
        metavar="ACTION",
    )
    listing = topic_actions.add_parser(
        "list",
        help="the topics with their partitions and records",
        description="The log's topics (or those named) with their partitions, records kept "
        "(offsets from the earliest kept to the end) and end (records ever appended).",
    )
    add_log(listing)
    listing.add_argument("names", nargs="*", metavar="TOPIC", help="only these topics")
    listing.add_argument(
        "--by-partition",
        action="store_true",
        help="one line per partition: its earliest offset kept, end and records",
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    create = topic_actions.add_parser(
        "create",
        help="create a topic with a number of partitions",
        description="Create a topic before any producer writes to it (which would create it "
        "with its --log-partitions). Refused, exit 1, if it exists.",
    )
    add_log(create)
    create.add_argument("name", type=_topic, metavar="TOPIC", help="the topic's name")
    create.add_argument(
        "--partitions", type=_partitions, default=8, help="how many partitions (default 8)"
    )
    alter = topic_actions.add_parser(
        "alter",
        help="add partitions to a topic (never removes any)",
        description="Give a topic --partitions partitions by adding new ones (numbers missing "
        "below the highest, partition rows deleted by hand, are added back first). Running "
        "producers use them within about 5 s, consumers within about a second. Most keys then "
        "map to another partition, murmur2(key) % partitions, as when partitions are added "
        "to a Kafka topic: such a key's records from before and after are in different "
        "partitions, with no order between them. Partitions cannot be removed: fewer than "
        "the topic has is refused (exit 1, nothing changed).",
    )
    add_log(alter)
    alter.add_argument("name", metavar="TOPIC", help="the topic")
    alter.add_argument(
        "--partitions", type=_partitions, required=True, help="the number of partitions wanted"
    )


# -- running --------------------------------------------------------------------------------


def run_operator_command(args: argparse.Namespace) -> int | None:
    """Run `args.command` if it is an operator command and return its exit code, else None."""
    command = getattr(args, "command", None)
    if command == "status":
        return _status(args)
    if command == "dead-letters":
        return _dead_letters(args)
    if command == "log-groups":
        return _log_groups(args)
    if command == "log-topics":
        return _log_topics(args)
    return None


@contextmanager
def _connection(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to --database-url (`[NAME[/SCHEMA]=]URL`), migrated to this
    outbox's schema revision; `args.schema` becomes the entry's schema."""
    from outbox.core.databases import parse_entry

    if not args.database_url:
        raise ConfigurationError(f"--database-url is required (or set {ENV_DATABASE_URL})")
    database = parse_entry(args.database_url, args.schema)
    args.schema = database.schema
    with _connected(database.url, database.schema, args.command) as conn:
        yield conn


@contextmanager
def _connected(
    url: str, schema: str, command: str, *, timeout: float | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to `url` whose `schema` is migrated to this outbox's revision;
    with `timeout`, connecting and each statement give up after that many seconds."""
    schema = validate_schema(schema)
    conn = connect_or_raise(url, application_name="outbox-cli", timeout=timeout or 10.0)
    with conn:
        try:
            # A row named by id may be locked by a running handler: wait a while, not forever.
            ops.limit_lock_wait(conn, schema)
            if timeout is not None:
                ops.limit_statement_time(conn, schema, timeout)
            check_schema(conn, schema)
            yield conn
        except psycopg.errors.LockNotAvailable:
            raise DatabaseCommandFailed(
                f"{command}: a row is locked by a running daemon or another command "
                f"(waited {ops.LOCK_TIMEOUT_SECONDS} s); nothing was changed, try again"
            ) from None
        except psycopg.Error as exc:
            raise DatabaseCommandFailed(
                f"{command} failed in PostgreSQL: {first_line(exc)}"
            ) from None


def _usage_error(args: argparse.Namespace, message: str) -> int:
    print(f"outbox {args.command} {args.dead_letters_command}: error: {message}", file=sys.stderr)
    return 2


def _dead_letters(args: argparse.Namespace) -> int:
    action = args.dead_letters_command
    queue: ops.Queue = args.queue
    if action in ("requeue", "purge"):
        chosen = sum((bool(args.ids), args.topic is not None, bool(args.all_rows)))
        if chosen != 1:
            return _usage_error(
                args,
                "give row IDs, --topic T or --all (exactly one of them)"
                if chosen == 0
                else "IDs, --topic and --all cannot be combined; give exactly one of them",
            )
        selection = ops.Selection(ids=tuple(args.ids), topic=args.topic, everything=args.all_rows)
        warnings: tuple[ops.Overtaken, ...] = ()
        with _connection(args) as conn:
            if action == "requeue":
                if queue == "consumer":
                    warnings = ops.overtaken(conn, args.schema, selection)
                count = ops.requeue(conn, args.schema, queue, selection)
            else:
                count = ops.purge(conn, args.schema, queue, selection)
        _print(_changed(action, count, ops.TABLES[queue], args.topic))
        for warning in warnings:
            messages = "message" if warning.later == 1 else "messages"
            were = "was" if warning.later == 1 else "were"
            _print(
                f"warning: row {warning.id} (key {fmt.key_text(warning.key)}): {warning.later} "
                f"later {messages} of the same key {were} already handled; it runs after them"
            )
        return 0
    if action == "list":
        with _connection(args) as conn:
            page = ops.list_dead_letters(
                conn, args.schema, queue, topic=args.topic, limit=args.limit
            )
        _print(json.dumps(_page_json(page), indent=2) if args.json else _page_text(page))
    else:
        with _connection(args) as conn:
            row = ops.show_row(conn, args.schema, queue, args.id)
        _print(json.dumps(_row_json(row), indent=2) if args.json else _row_text(row))
    return 0


def _log_groups(args: argparse.Namespace) -> int:
    from outbox.pglog import PgLog, check_log

    url = require(args.log_url, "--log-url", ENV_LOG_URL)
    check_log(url, args.log_schema)  # one line when unreachable or not migrated
    try:
        known = PgLog(url, args.log_schema).forget_group(args.group)
    except psycopg.Error as exc:
        raise DatabaseCommandFailed(
            f"log-groups forget failed in PostgreSQL: {first_line(exc)}"
        ) from None
    if not known:
        raise NoSuchGroup(
            f"log schema {args.log_schema!r} has no consumer group {args.group!r}; nothing was "
            "changed"
        )
    _print(
        f"forgot consumer group {args.group!r} of log schema {args.log_schema!r}: its offsets "
        "no longer hold back retention"
    )
    return 0


def _log_topics(args: argparse.Namespace) -> int:
    from outbox.pglog import PgLog, check_log

    url = require(args.log_url, "--log-url", ENV_LOG_URL)
    check_log(url, args.log_schema)  # one line when unreachable or not migrated
    log = PgLog(url, args.log_schema)
    action = args.log_topics_command
    try:
        if action == "list":
            found = log.topics(args.names or None)
            if args.json:
                _print(json.dumps(_topics_json(args.log_schema, found), indent=2))
            else:
                _print(_topics_text(args.log_schema, found, by_partition=args.by_partition))
        elif action == "create":
            log.create_topic(args.name, args.partitions)
            _print(f"created log topic {args.name!r} with {args.partitions} partitions")
        else:
            before = log.partitions(args.name)
            added = log.grow_topic(args.name, args.partitions)
            if not added:
                _print(
                    f"log topic {args.name!r} has {args.partitions} partitions already "
                    "(nothing to do)"
                )
            else:
                numbers = ", ".join(str(n) for n in added)
                _print(
                    f"log topic {args.name!r} grew from {before} to {args.partitions} "
                    f"partitions (added {numbers}); keys now map to other partitions "
                    f"(murmur2(key) % {args.partitions}): a moved key's later records are "
                    "not ordered after its earlier ones; running producers and consumers "
                    "pick the new partitions up within seconds"
                )
    except psycopg.Error as exc:
        raise DatabaseCommandFailed(
            f"log-topics {action} failed in PostgreSQL: {first_line(exc)}"
        ) from None
    return 0


def _topics_json(schema: str, topics: Sequence[TopicInfo]) -> dict[str, Any]:
    return {
        "log_schema": schema,
        "topics": [
            {
                "name": t.name,
                "records": t.records,
                "end": t.end,
                "partitions": [
                    {
                        "partition": p.partition,
                        "earliest": p.earliest,
                        "end": p.end,
                        "records": p.records,
                    }
                    for p in t.partitions
                ],
            }
            for t in topics
        ],
    }


def _topics_text(schema: str, topics: Sequence[TopicInfo], *, by_partition: bool) -> list[str]:
    if not topics:
        return [f"log schema {schema!r} has no topics"]
    if by_partition:
        body = [
            [_safe(t.name), str(p.partition), str(p.earliest), str(p.end), str(p.records)]
            for t in topics
            for p in t.partitions
        ]
        return _table(["TOPIC", "PARTITION", "EARLIEST", "END", "RECORDS"], body)
    body = [[_safe(t.name), str(len(t.partitions)), str(t.records), str(t.end)] for t in topics]
    return _table(["TOPIC", "PARTITIONS", "RECORDS", "END"], body)


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
    where = transport_of(args)
    endpoint = transport.endpoint(where)
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


def _read_lag(
    transport: Transport, found: TransportSettings, groups: Sequence[str]
) -> list[GroupLag]:
    """The lag of `groups` (every group when empty) read from `transport`."""
    transport.check(found, 0.0)  # the log: one line when unreachable or not migrated
    reader = transport.lag_reader(found)
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


def _print(output: str | list[str]) -> None:
    """Print a document or lines; a reader that went away (`| head`) is not an error."""
    text = output if isinstance(output, str) else "\n".join(output)
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _changed(action: str, count: int, table: str, topic: str | None) -> str:
    rows = "row" if count == 1 else "rows"
    where = f" (topic {topic})" if topic is not None else ""
    return f"{action}d {count} {rows} of {table}{where}"


# -- rendering helpers ----------------------------------------------------------------------


def _safe(text: str) -> str:
    """Text that cannot break a terminal line or send escape sequences."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Left-aligned columns two spaces apart, the header first."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [
        (indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))).rstrip()
        for row in (header, *rows)
    ]


# -- status ---------------------------------------------------------------------------------


def _count_cell(count: ops.Count) -> str:
    return "-" if count.rows == 0 else f"{count.rows} ({fmt.age(count.oldest_age)})"


def _status_text(status: ops.Status) -> list[str]:
    lines = [f"outbox schema {status.schema!r} at {fmt.when(status.taken_at)}"]
    for q in status.queues:
        lines.append("")
        if q.total.rows == 0:
            lines.append(f"{q.table}: empty")
            continue
        rows = "row" if q.total.rows == 1 else "rows"
        lines.append(
            f"{q.table}: {q.total.rows} {rows}, oldest {fmt.age(q.total.oldest_age)}; "
            f"each cell: rows (age of the oldest, by {q.age_column})"
        )
        body = [
            [_safe(topic), *(_count_cell(per_state[s]) for s in q.states)]
            for topic, per_state in q.topics.items()
        ]
        body.append(["TOTAL", *(_count_cell(q.totals[s]) for s in q.states)])
        lines.extend(_table(["TOPIC", *(s.upper() for s in q.states)], body, indent="  "))
    lines.extend(_scheduled_text(status))
    lines.append("")
    if not status.processes:
        lines.append("processes: none registered in relay_state")
    else:
        lines.append(f"processes: {len(status.processes)} registered in relay_state")
        body = [
            [
                _safe(p.relay_id),
                _safe(p.host or "-"),
                "-" if p.pid is None else str(p.pid),
                _safe(p.queue),
                str(p.backend_pid),
                ("sleeping" if p.sleeping else "busy") if p.alive else "gone",
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


# -- dead-letters list / show ---------------------------------------------------------------


def _page_json(page: ops.DeadLetterPage) -> dict[str, Any]:
    rows = []
    for r in page.rows:
        key, key_encoding = fmt.encoded_key(r.key)
        rows.append(
            {
                "id": r.id,
                "message_id": str(r.message_id),
                "topic": r.topic,
                "key": key,
                "key_encoding": key_encoding,
                "attempts": r.attempts,
                "dead_at": fmt.timestamp(r.dead_at),
                "error": r.error_summary,
                "quarantined": r.quarantined,
            }
        )
    return {
        "queue": page.queue,
        "table": page.table,
        "topic": page.topic,
        "total": page.total,
        "rows": rows,
    }


def _page_text(page: ops.DeadLetterPage) -> list[str]:
    where = f" of topic {page.topic}" if page.topic is not None else ""
    if page.total == 0:
        return [f"{page.table}: no dead rows{where}"]
    shown = "" if len(page.rows) == page.total else f", showing the first {len(page.rows)}"
    rows = "row" if page.total == 1 else "rows"
    body = [
        [
            str(r.id),
            str(r.message_id),
            _safe(r.topic),
            fmt.key_cell(r.key),
            str(r.attempts),
            fmt.when(r.dead_at),
            fmt.cut(
                _safe(("(quarantined) " if r.quarantined else "") + r.error_summary),
                ERROR_COLUMN_CHARS,
            ),
        ]
        for r in page.rows
    ]
    header = ["ID", "MESSAGE_ID", "TOPIC", "KEY", "ATTEMPTS", "DEAD_AT", "ERROR"]
    return [f"{page.table}: {page.total} dead {rows}{where}{shown}", *_table(header, body)]


def _row_json(row: ops.QueueRow) -> dict[str, Any]:
    key, key_encoding = fmt.encoded_key(row.key)
    payload, payload_encoding, truncated = fmt.payload_preview(row)
    doc: dict[str, Any] = {
        "queue": row.queue,
        "table": row.table,
        "id": row.id,
        "message_id": str(row.message_id),
        "state": row.state,
        "topic": row.topic,
        "key": key,
        "key_encoding": key_encoding,
        "lane": row.lane,
        "content_type": row.content_type,
        "headers": row.headers,
        "attempts": row.attempts,
        "created_at": fmt.timestamp(row.created_at),
        "next_attempt_at": fmt.timestamp(row.next_attempt_at),
        "dead_at": fmt.timestamp(row.dead_at),
        "last_error": row.last_error,
        "payload": payload,
        "payload_encoding": payload_encoding,
        "payload_bytes": len(row.payload),
        "payload_truncated": truncated,
    }
    if row.queue == "consumer":
        doc["source_partition"] = row.source_partition
        doc["source_offset"] = row.source_offset
        doc["received_at"] = fmt.timestamp(row.received_at)
        doc["processed_at"] = fmt.timestamp(row.processed_at)
        doc["quarantined"] = row.quarantined
        doc["raw_headers"] = (
            None if row.raw_headers is None else [fmt.raw_header_json(*h) for h in row.raw_headers]
        )
    return doc


def _indented(text: str) -> list[str]:
    return ["  " + line.rstrip() for line in text.splitlines()] or ["  "]


def _row_text(row: ops.QueueRow) -> list[str]:
    fields: list[tuple[str, str]] = [
        ("message_id", str(row.message_id)),
        ("state", row.state),
        ("topic", _safe(row.topic)),
        ("key", "(none)" if row.key is None else fmt.key_text(row.key)),
        ("lane", str(row.lane)),
        ("content_type", _safe(row.content_type)),
        ("headers", json.dumps(row.headers, ensure_ascii=True, sort_keys=True)),
        ("attempts", str(row.attempts)),
        ("created_at", fmt.when(row.created_at)),
    ]
    if row.queue == "consumer":
        fields += [
            ("received_at", fmt.when(row.received_at)),
            ("source_partition", _number(row.source_partition)),
            ("source_offset", _number(row.source_offset)),
        ]
    fields += [
        ("next_attempt_at", fmt.when(row.next_attempt_at)),
        ("dead_at", fmt.when(row.dead_at)),
    ]
    if row.queue == "consumer":
        fields.append(("processed_at", fmt.when(row.processed_at)))
    lines = [f"{row.table} row {row.id}", *_table(["FIELD", "VALUE"], fields, indent="  ")[1:]]
    if row.raw_headers is not None:
        lines.append(
            "quarantined: stored dead on arrival, it could not be an ordinary row (reason in "
            "last_error); requeued, its handler gets the raw payload as bytes and no headers"
        )
        lines.append(f"raw headers ({len(row.raw_headers)}, as received):")
        lines.extend(
            f"  {name!r}: {'(no value)' if value is None else repr(value)}"
            for name, value in row.raw_headers
        )
    lines.append("last_error:" if row.last_error else "last_error: (none)")
    if row.last_error:
        lines.extend(_indented(_escape_lines(row.last_error)))
    payload, encoding, truncated = fmt.payload_preview(row)
    size = f"{len(row.payload)} bytes"
    note = f", showing the first {fmt.PAYLOAD_PREVIEW_BYTES}" if truncated else ""
    if encoding == "hex":
        lines.append(f"payload ({size}, not UTF-8 text: hex{note}):")
        lines.extend("  " + payload[i : i + 64] for i in range(0, len(payload), 64))
    else:
        lines.append(f"payload ({size}, UTF-8{note}):")
        lines.extend(_indented(payload))
    if truncated:
        lines.append(f"  ... ({len(row.payload) - fmt.PAYLOAD_PREVIEW_BYTES} more bytes not shown)")
    return lines


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


def _escape_lines(text: str) -> str:
    """Keep line breaks and tabs, escape every other control character."""
    return "\n".join(_safe(line.replace("\t", "    ")) for line in text.splitlines())
