"""The `outbox` command: migrate, run the relays, run the demo.

Errors are one line on stderr and a non-zero exit: 2 for a usage error, 1 for anything else
(with `--log-format json`, that line is a JSON log line too). Secrets given on the command line
(database password, secret `--kafka-config` settings) are masked in every line printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

from outbox import __version__, settings
from outbox.cli.arguments import (
    ENV_DATABASE_URL,
    Parser,
    add_budget,
    add_databases,
    add_log,
    add_logging,
    add_many,
    add_routing,
    add_runtime,
    add_start,
    add_topics,
    add_transport,
    databases_of,
    named_url,
    settings_of,
    single_database,
)
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.numbers import Rule, flag_type
from outbox.core.text import first_line

if TYPE_CHECKING:
    from outbox.core.handlers import Handlers
    from outbox.runtime.app import Kind

#: What `outbox demo` says: the demo runs the example services, which the package does not ship.
DEMO_ELSEWHERE = (
    "the demo runs the example services of the source repository, not part of the installed "
    "package: in a checkout of pg-kafka-outbox, run `./run demo` (or `python -m examples.demo`)"
)


class UsageError(Exception):
    """A command given settings that cannot go together, or without one it needs, that the
    parser cannot see alone: one line, exit 2 (as argparse's usage errors)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `outbox` command."""
    parser: argparse.ArgumentParser = Parser(
        prog="outbox", description="Transactional outbox and inbox over PostgreSQL and Kafka."
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"outbox {__version__}",
        help="print `outbox VERSION` (pg-kafka-outbox's version) and exit",
    )
    add_logging(parser)
    # Not required: `outbox` alone prints the whole help (main), not argparse's one line.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the outbox tables (and, with --log-url, the PostgreSQL log's)",
        description="Create or upgrade the outbox tables of each database given (several: "
        "--database-url more than once, or --databases-file), one after the other; one that "
        "fails is reported and the others are still migrated, then the command exits 1 naming "
        "those that failed. With --log-url, the PostgreSQL log's tables too. See "
        "docs/how-to/many-databases.md.",
    )
    add_databases(migrate)
    add_log(migrate)
    migrate.add_argument(
        "--sql", action="store_true", help="print the SQL instead of running it (for a DBA)"
    )

    producer = commands.add_parser(
        "producer", help="relay producer_queue to Kafka (or to the PostgreSQL log)"
    )
    add_databases(producer)
    add_transport(producer, "producer")
    add_runtime(producer)
    producer.add_argument(
        "--batch-size",
        type=flag_type("count"),
        default=1000,
        help="rows fetched and produced per batch; doubled while a backlog keeps batches full, "
        "up to 8 times",
    )
    producer.add_argument(
        "--poll-interval",
        type=flag_type("seconds"),
        default=1.0,
        help="longest sleep between looks at the queue when no NOTIFY arrives (seconds)",
    )
    add_many(producer)

    consumer = commands.add_parser(
        "consumer",
        help="store Kafka (or PostgreSQL log) records in consumer_queue",
        description="Stores the records of its topics in consumer_queue, for `outbox handler`. "
        "The topics: those registered in the Handlers registry MODULE:ATTRIBUTE (the one "
        "`outbox handler` runs), or those of --topic for a consumer without handlers. Given "
        "both, it consumes exactly the --topic list (to split a registry's topics over "
        "several consumers) and warns at start, one line each, about a listed topic no "
        "handler reads (its messages go dead at once) and a registered topic not listed (its "
        "handler waits for messages this consumer does not store).",
    )
    consumer.add_argument(
        "handlers",
        nargs="?",
        metavar="MODULE:ATTRIBUTE",
        help="the Handlers registry whose topics are consumed, e.g. svc.handlers:h (imported "
        "as `outbox handler` does); optional with --topic",
    )
    add_databases(consumer)
    add_routing(consumer)
    add_budget(consumer)
    add_transport(consumer, "consumer")
    add_runtime(consumer)
    add_topics(consumer, "topics to consume, comma-separated; repeatable")
    consumer.add_argument(
        "--group",
        default=os.environ.get(settings.GROUP),
        help=f"consumer group id (env {settings.GROUP}; required)",
    )
    add_start(consumer)
    consumer.add_argument(
        "--batch-size",
        type=flag_type("poll_records"),
        default=1000,
        help="Kafka records stored per inbox transaction, at most",
    )

    handler = commands.add_parser("handler", help="run a service's handlers over consumer_queue")
    handler.add_argument(
        "handlers",
        metavar="MODULE:ATTRIBUTE",
        nargs="?",
        help="the Handlers registry, e.g. svc.handlers:h (optional with --deliver)",
    )
    add_deliver(handler)
    add_databases(handler)
    add_runtime(handler)
    handler.add_argument(
        "--concurrency",
        type=flag_type("threads"),
        default=4,
        help="worker threads, each with its database session (1 to 1000); with several "
        "databases and --max-connections, shared by the databases",
    )
    handler.add_argument(
        "--batch-size",
        type=flag_type("count"),
        default=200,
        help="rows the workers claim per round, shared among them; doubled while a backlog "
        "keeps rounds full, up to 8 times",
    )
    handler.add_argument(
        "--poll-interval",
        type=flag_type("seconds"),
        default=1.0,
        help="longest sleep between looks at the queue when no NOTIFY arrives (seconds)",
    )
    handler.add_argument(
        "--dedup-window",
        type=flag_type("seconds_or_zero"),
        default=24 * 3600.0,
        help="seconds a processed message is remembered to drop redeliveries (default 1 day)",
    )
    handler.add_argument(
        "--transaction-size",
        type=flag_type("count"),
        default=500,
        help="messages handled in one database transaction (no savepoints: a failure rolls "
        "the transaction back and the messages before it run again)",
    )
    handler.add_argument(
        "--lease",
        type=flag_type("seconds"),
        default=300.0,
        help="seconds a callback may run before its transaction is terminated and the "
        "message retried (default 300)",
    )
    add_many(handler)

    _add_run_command(commands)

    from outbox.cli.operator import add_operator_commands

    add_operator_commands(commands)

    from outbox.cli.console import add_console_command

    add_console_command(commands)

    from outbox.cli.spark import add_spark_commands

    add_spark_commands(commands)

    from outbox.cli.asyncapi import add_asyncapi_command

    add_asyncapi_command(commands)

    from outbox.cli.dev import add_dev_command

    add_dev_command(commands)

    from outbox.cli.serve import add_serve_command

    add_serve_command(commands)

    demo = commands.add_parser(
        "demo",
        help="say where the two-service demo runs: a source checkout (./run demo)",
        description="The two-service demo runs the example services of the source repository, "
        "which the installed package does not ship: run `./run demo` (or `python -m "
        "examples.demo`) in a checkout. `outbox demo` says so on stderr and exits 1.",
    )
    # Accepted, so that `outbox demo --messages 5` also gets the pointer, not a usage error.
    demo.add_argument("--messages", help=argparse.SUPPRESS)
    return parser


def _install_stop_handlers(stop: object) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("outbox").info("received %s, finishing", signal.Signals(signum).name)
        stop()  # type: ignore[operator]

    def ignore_hangup(_signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("outbox").warning(
            "received SIGHUP: outbox reads its configuration only at start and reloads nothing; "
            "restart the process to change it"
        )

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGHUP, ignore_hangup)


def _migrate(args: argparse.Namespace) -> int:
    """The outbox schema of each database given, and the log schema at --log-url when given;
    with only --log-url, the log alone. Says, for each, what it did. Several databases are
    migrated one after the other; one that fails is reported (`database NAME: failed: ...`)
    and the others are still migrated, then the command fails naming those that failed."""
    from outbox.core.redact import redact_text, remember_secrets, secrets_of_url
    from outbox.pglog import log as pglog
    from outbox.postgres import migrate

    given = bool(args.database_url or args.databases_file or os.environ.get(ENV_DATABASE_URL))
    databases = databases_of(args) if given or not (args.log_url or args.sql) else []
    for database in databases:
        remember_secrets(secrets_of_url(database.url))
    if args.sql:
        schemas = dict.fromkeys(d.schema for d in databases) or (
            {} if args.log_url else {args.schema: None}
        )
        for schema in schemas:
            sys.stdout.write(migrate.upgrade_sql(schema))
        if args.log_url:
            sys.stdout.write(pglog.upgrade_sql(args.log_schema))
        return 0
    several = len(databases) > 1 or bool(args.databases_file)
    failed: list[str] = []
    for database in databases:
        if not several:
            print(_migrate_one(database.url, database.schema))
            continue
        try:
            done = _migrate_one(database.url, database.schema)
        except Exception as exc:  # any failure of one database; the others are still migrated
            failed.append(database.name)
            reason = first_line(exc) if isinstance(exc, OutboxError) else _unforeseen(exc)
            print(f"database {database.name}: failed: {redact_text(reason)}", flush=True)
        else:
            print(f"database {database.name}: {done}", flush=True)
    if args.log_url:
        version = pglog.queries(args.log_schema)["log_schema_version"]
        before = _revision(args.log_url, version, "the log database")
        pglog.upgrade(args.log_url, args.log_schema)
        after = _revision(args.log_url, version, "the log database")
        print(_migrated(f"log schema {args.log_schema!r}", before, after))
    if failed:
        raise OutboxError(
            f"migrate failed for {len(failed)} of {len(databases)} databases: "
            f"{', '.join(failed)} (each one's reason is printed above; the others are migrated)"
        )
    return 0


def _migrate_one(url: str, schema: str) -> str:
    """Migrate the outbox schema `schema` at `url`; what was done, in one line."""
    from outbox.postgres import migrate
    from outbox.postgres.queries import queries

    version = queries(schema)["schema_version"]
    before = _revision(url, version)
    migrate.upgrade(url, schema)
    return _migrated(f"outbox schema {schema!r}", before, _revision(url, version))


def _revision(url: str, version_sql: str, what: str = "PostgreSQL") -> str | None:
    """The revision a schema is at by its Alembic version table; None when it has none yet."""
    import psycopg

    from outbox.postgres.connection import connect_or_raise

    with connect_or_raise(url, what=what, application_name="outbox-migrate") as conn:
        try:
            row = conn.execute(version_sql).fetchone()
        except psycopg.errors.UndefinedTable:  # no schema, or no version table in it
            return None
    return None if row is None else str(row[0])


def _migrated(schema: str, before: str | None, after: str | None) -> str:
    """What `outbox migrate` did to one schema, in one line."""
    if before == after:
        return f"{schema} is already at revision {after} (nothing to do)"
    if before is None:
        return f"{schema} created at revision {after}"
    return f"{schema} migrated from revision {before} to {after}"


def _daemon(args: argparse.Namespace, kind: Kind, handlers: Handlers | str | None = None) -> int:
    """`outbox producer`, `consumer` or `handler`: the part the composition root builds from
    the flags (one database's daemon, or a relay per database), run until SIGTERM."""
    from outbox.runtime import App

    app = App(settings_of(args), handlers)
    part = app.part(kind)
    if kind != "handler":
        app.check_transport(consumer=kind == "consumer")
    _install_stop_handlers(part.stop)
    part.run()
    return 0


def _producer(args: argparse.Namespace) -> int:
    return _daemon(args, "producer")


def _consumed(args: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """The topics the consumer reads and, given a registry, the topics its handlers read.

    The registry is imported as `outbox handler` imports it (a failure is one line, exit 1);
    without it and without --topic (or OUTBOX_TOPICS), a usage error."""
    topics: list[str] = list(args.topics or [])
    if args.handlers is None:
        if not topics:
            raise UsageError(
                f"give the Handlers registry MODULE:ATTRIBUTE whose topics to consume, or "
                f"--topic (or set {settings.TOPICS}) for a consumer without handlers"
            )
        return topics, None
    from outbox.core.handlers import load_handlers

    handled = list(load_handlers(args.handlers).topics)
    return (topics or handled), handled


def _consumer(args: argparse.Namespace) -> int:
    _consumed(args)  # a usage error, or a registry that does not import: before anything else
    return _daemon(args, "consumer", args.handlers)


def _handler(args: argparse.Namespace) -> int:
    return _daemon(args, "handler", registry_of(args))


def add_deliver(parser: argparse.ArgumentParser) -> None:
    """The push-delivery flags of `outbox handler` and `outbox run`."""
    parser.add_argument(
        "--deliver",
        action="append",
        default=[],
        metavar="TOPIC=URL",
        help="POST each message of TOPIC to URL (http:// or https://) as a CloudEvent: 2xx "
        "handled, 408, 429 and 5xx retried, other 4xx dead at once; repeatable; beside the "
        "registry's handlers or without one",
    )
    parser.add_argument(
        "--deliver-timeout",
        type=flag_type("seconds"),
        default=10.0,
        metavar="SECONDS",
        help="seconds a push delivery waits for each connect, send and read (default 10)",
    )
    parser.add_argument(
        "--deliver-concurrency",
        type=flag_type("threads"),
        default=8,
        metavar="N",
        help="requests each --deliver endpoint has in flight at once, at most (default 8)",
    )


def registry_of(args: argparse.Namespace) -> Handlers | str:
    """The Handlers registry `outbox handler` or `run` runs: MODULE:ATTRIBUTE, with a push
    delivery added for each --deliver TOPIC=URL (the URLs checked now); a usage error when
    neither is given."""
    if not args.deliver:
        if args.handlers is None:
            raise UsageError("give the Handlers registry MODULE:ATTRIBUTE, or --deliver TOPIC=URL")
        return str(args.handlers)
    from outbox.core.handlers import Handlers, load_handlers
    from outbox.core.push import mask_url

    handlers = load_handlers(args.handlers, allow_empty=True) if args.handlers else Handlers()
    for entry in args.deliver:
        topic, sep, url = str(entry).partition("=")
        if not sep or not topic.strip() or not url.strip():
            raise UsageError(f"--deliver takes TOPIC=URL, got {mask_url(str(entry))!r}")
        handlers.deliver(
            topic.strip(),
            url.strip(),
            timeout=args.deliver_timeout,
            concurrency=args.deliver_concurrency,
        )
    return handlers


#: The daemons' flags `outbox run` does not take under the same name, and why (a test holds
#: `run` to every other flag of `outbox producer`, `consumer` and `handler`).
RUN_RENAMED = {
    "--batch-size": "each daemon's means another batch: `outbox run` takes "
    "--producer-batch-size, --consumer-batch-size and --handler-batch-size",
}


class _Renamed(argparse.Action):
    """A daemon's flag that `outbox run` takes under other names: a usage error saying which."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string} is not a flag of `outbox run`: {RUN_RENAMED[self.dest]}")


def _add_run_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`outbox run`: the producer, consumer and handler flags, on one process."""
    run = commands.add_parser(
        "run",
        help="relay, consumer and handler of one service in one process",
        description="Runs `outbox producer`, `outbox consumer` (of the handlers' topics, or "
        "--topic) and `outbox handler` in one process, with the same guarantees, one health "
        "and one metrics port (each series labelled with its daemon). It takes the three "
        "daemons' flags; several databases (--database-url more than once, or "
        "--databases-file) run a relay per database and route the consumed records to "
        "their tenants, as the daemons do. SIGTERM drains: the consumer stops taking records "
        "first, then the relay and the handler finish their batch. Run three processes "
        "instead to scale or restart them apart.",
    )
    run.add_argument(
        "handlers",
        metavar="MODULE:ATTRIBUTE",
        nargs="?",
        help="the Handlers registry, e.g. svc.handlers:h (optional with --deliver)",
    )
    add_deliver(run)
    add_databases(run)
    add_routing(run)
    add_transport(run, "run")
    add_runtime(run)
    add_topics(run, "topics to consume, comma-separated; repeatable (default: the handlers')")
    run.add_argument(
        "--group",
        default=os.environ.get(settings.GROUP),
        help=f"consumer group id (env {settings.GROUP}; required)",
    )
    add_start(run)
    daemon_flags: tuple[tuple[str, Rule, float, str], ...] = (
        ("--producer-batch-size", "count", 1000, "`outbox producer --batch-size`"),
        ("--consumer-batch-size", "poll_records", 1000, "`outbox consumer --batch-size`"),
        ("--handler-batch-size", "count", 200, "`outbox handler --batch-size`"),
        ("--poll-interval", "seconds", 1.0, "`--poll-interval` of the producer and handler"),
        ("--concurrency", "threads", 4, "`outbox handler --concurrency`"),
        ("--dedup-window", "seconds_or_zero", 24 * 3600.0, "`outbox handler --dedup-window`"),
        ("--transaction-size", "count", 500, "`outbox handler --transaction-size`"),
        ("--lease", "seconds", 300.0, "`outbox handler --lease`"),
    )
    for flag, kind, number, text in daemon_flags:
        run.add_argument(
            flag, type=flag_type(kind), default=number, help=f"as {text} (default {number:g})"
        )
    add_many(run)
    for flag in RUN_RENAMED:
        run.add_argument(flag, dest=flag, action=_Renamed, help=argparse.SUPPRESS)


def _run(args: argparse.Namespace) -> int:
    """The three daemons in one process until SIGTERM (exit 0 once drained) or until one stops
    with an error retrying cannot fix (its one line, exit 1)."""
    import threading

    from outbox.runtime import OutboxRuntime

    runtime = OutboxRuntime(registry_of(args), settings=settings_of(args))
    runtime.log_failures = False  # main prints the error, one line
    asked = threading.Event()

    def stop() -> None:
        asked.set()
        runtime.interrupt()  # ends a start still waiting for the database

    _install_stop_handlers(stop)
    runtime.start(timeout=120.0)
    while not asked.is_set() and not runtime.wait(0.2):
        pass
    runtime.stop()
    return 0


def _demo(args: argparse.Namespace) -> int:
    raise ConfigurationError(DEMO_ELSEWHERE)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `outbox` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # a usage error: the help says which commands there are
        parser.print_help(sys.stderr)
        return 2
    from outbox.observability.logs import configure_logging

    configure_logging(str(args.log_level), args.log_format)
    _remember_secrets(args)
    try:
        single_database(args)
    except ConfigurationError as exc:
        parser.error(str(exc))
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    handlers = {
        "migrate": _migrate,
        "producer": _producer,
        "consumer": _consumer,
        "handler": _handler,
        "run": _run,
        "demo": _demo,
    }
    try:
        if args.command == "console":
            from outbox.cli.console import run_console

            return run_console(args)
        if args.command == "asyncapi":
            from outbox.cli.asyncapi import run_asyncapi

            return run_asyncapi(args)
        if args.command == "serve":
            from outbox.cli.serve import run_serve

            return run_serve(args)
        if args.command == "dev":
            from outbox.cli.dev import run_dev

            return run_dev(args)
        if args.command == "spark":
            from outbox.cli.spark import run_spark_command

            return run_spark_command(args)
        if args.command not in handlers:
            from outbox.cli.operator import run_operator_command

            code = run_operator_command(args)
            if code is not None:
                return code
        return handlers[args.command](args)
    except UsageError as exc:
        _fatal(args, str(exc))
        return 2
    except OutboxError as exc:
        _fatal(args, str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # Not an error outbox foresaw (a bug, or a library failing in a new way): still one
        # line; the traceback goes to the DEBUG log.
        logging.getLogger("outbox").debug("unexpected error", exc_info=True)
        _fatal(args, _unforeseen(exc))
        return 1


def _unforeseen(exc: Exception) -> str:
    """The one line for an error outbox did not foresee; PostgreSQL's refusals by their kind."""
    sqlstate = getattr(exc, "sqlstate", None)
    if type(exc).__module__.startswith("psycopg") and sqlstate:
        if sqlstate == "42501":  # insufficient_privilege
            return (
                f"PostgreSQL refused: {first_line(exc)}: the database role lacks a privilege "
                "(the daemons need USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on "
                "its tables; `outbox migrate` needs CREATE on the database)"
            )
        return f"PostgreSQL refused (SQLSTATE {sqlstate}): {first_line(exc)}"
    return (
        f"unexpected {type(exc).__name__}: {first_line(exc)} "
        "(run with --log-level DEBUG for the traceback)"
    )


def _remember_secrets(args: argparse.Namespace) -> None:
    """Mask the secrets of the command line wherever they might be printed: the databases'
    passwords, and the secret settings every registered transport declares of the flags it
    added (`Transport.secrets`), chosen or not."""
    from outbox import transports
    from outbox.core.redact import remember_secrets, secrets_of_url

    values = vars(args)
    for name in ("database_url", "log_url"):
        value = values.get(name)
        # A command of many databases has a list of `[NAME[/SCHEMA]=]URL` entries: the secrets
        # of the URL part, and of the whole entry (what libpq would parse of a bad one).
        for url in value if isinstance(value, list) else [value]:
            if isinstance(url, str):
                remember_secrets(secrets_of_url(url))
                named = named_url(url)
                if named is not None:
                    remember_secrets(secrets_of_url(named[1]))
    if "transport" not in values and "kafka_config" not in values:
        return
    try:
        registered = transports.entries()
    except ConfigurationError:
        return  # said when the transport is chosen
    for entry in registered:
        try:
            remember_secrets(entry.secrets(entry.options_of(values)))
        except (ConfigurationError, TypeError, ValueError):
            continue  # options it refuses: the command says why, masked by what is known


def _fatal(args: argparse.Namespace, reason: str) -> None:
    """The one line that says why the command failed: on stderr, or as a JSON log line."""
    from outbox.core.redact import redact_text

    if getattr(args, "log_format", "text") == "json":
        logging.getLogger("outbox").error(
            reason, extra={"event": "fatal", "command": getattr(args, "command", None)}
        )
    else:
        print(f"outbox: error: {redact_text(reason)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
