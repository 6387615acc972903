"""Flags shared by the `outbox` subcommands, each with its environment variable, and the one
function that turns a daemon command's parsed flags into the composition root's `Settings`
(`settings_of`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from outbox import settings, transports
from outbox.core.databases import postgres_url_type
from outbox.core.errors import ConfigurationError
from outbox.core.numbers import flag_type
from outbox.kafka.transport import add_kafka as add_kafka
from outbox.pglog.transport import add_log as add_log
from outbox.ports import Role

if TYPE_CHECKING:
    from outbox.core.databases import Database
    from outbox.runtime import ObservabilityConfig, Settings

ENV_DATABASE_URL = settings.DATABASE_URL
ENV_KAFKA_BOOTSTRAP = settings.KAFKA_BOOTSTRAP
ENV_SCHEMA = settings.SCHEMA
ENV_LOG_URL = settings.LOG_URL


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each option's default: `(default: X)` after a help text that does not
    say it already. An option read from an environment variable (`(env NAME...)` in its help)
    says its default in words: its current default may be a secret from the environment."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and text != argparse.SUPPRESS
            and "default" not in text
            and "(env " not in text
            and default is not None
            and default is not argparse.SUPPRESS
            and not isinstance(default, bool)
            and default not in ([], "")
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """Every parser of the `outbox` command, its subcommands' too (argparse gives a subparser
    the class of its parent): no abbreviated flags (`--database` is not `--database-url`),
    defaults shown in help, and a usage error is one line on stderr, exit 2 (the usage itself
    is in --help)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        #: What runs on the parsed flags after parsing (a transport's: Kafka merges its
        #: settings from the flags, the variables and a file); a `ConfigurationError` from one
        #: is a usage error.
        self.finishers: list[Callable[[argparse.Namespace], None]] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse, then run the finishers (a command with --kafka-config gets, in
        `kafka_config`, its settings from the file, the variables and the flags,
        `outbox.kafka.sources`, lowest precedence first). A file that cannot be read or has a
        bad line: one line on stderr, exit 2."""
        parsed, rest = super().parse_known_args(args, namespace)
        for finish in self.finishers:
            try:
                finish(parsed)
            except ConfigurationError as exc:
                self.exit(2, f"{self.prog}: error: {exc}\n")
        return parsed, rest

    def error(self, message: str) -> NoReturn:
        """Print `<prog>: error: <message> (see --help)` and exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def choice_type(choices: Sequence[str], env: str) -> Callable[[str], str]:
    """The argparse `type=` of a flag with `choices` (any case) that defaults to `env`.

    argparse checks `choices` only on a value typed on the command line; a default from the
    environment goes through `type=` only, so this checks both alike: a usage error (exit 2).
    """
    source = f" (from the flag, or from {env} when the flag is not given)"

    def choice(text: str) -> str:
        for known in choices:
            if text.strip().lower() == known.lower():
                return known
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(choices)}, got {text!r}{source}"
        )

    return choice


class Once(argparse.Action):
    """A flag that may be given once: a second one is a usage error, not silently the last."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        seen = f"_given_{self.dest}"
        if getattr(namespace, seen, False):
            parser.error(
                f"{option_string} is given more than once: this command serves one database "
                "(outbox status, migrate and console take several)"
            )
        setattr(namespace, seen, True)
        setattr(namespace, self.dest, values)


def add_database(parser: argparse.ArgumentParser) -> None:
    """--database-url (once; `[NAME[/SCHEMA]=]URL`, see `single_database`) and --schema, for a
    command that serves one database."""
    parser.add_argument(
        "--database-url",
        action=Once,
        type=database_entry_type,
        default=os.environ.get(ENV_DATABASE_URL),
        metavar="[NAME[/SCHEMA]=]URL",
        help="the PostgreSQL database, once; a line of a databases file also names one (its "
        f"SCHEMA, when given, overrides --schema) (env {ENV_DATABASE_URL})",
    )
    add_schema(parser)


def add_schema(parser: argparse.ArgumentParser) -> None:
    """--schema: the schema of the outbox tables."""
    parser.add_argument(
        "--schema",
        default=os.environ.get(ENV_SCHEMA, "outbox"),
        help=f"schema of the outbox tables (env {ENV_SCHEMA}; default outbox)",
    )


def add_databases(parser: argparse.ArgumentParser) -> None:
    """The repeatable --database-url (`[NAME[/SCHEMA]=]URL`), --databases-file and --schema of
    a command that serves many databases (`databases_of` reads them)."""
    parser.add_argument(
        "--database-url",
        action="append",
        type=database_entry_type,
        default=[],
        metavar="[NAME[/SCHEMA]=]URL",
        help="a PostgreSQL database to serve; repeatable (a database per tenant): NAME names it "
        "in logs, metrics and status (default: its database name) and SCHEMA overrides "
        f"--schema for it (env {ENV_DATABASE_URL}: one database, used when neither this flag "
        "nor --databases-file gives one)",
    )
    parser.add_argument(
        "--databases-file",
        default=os.environ.get(settings.DATABASES_FILE),
        metavar="PATH",
        help="a file of more databases, one [NAME[/SCHEMA]=]URL per line (# comments); a "
        f"daemon re-reads it while running (env {settings.DATABASES_FILE})",
    )
    add_schema(parser)


def named_url(text: str) -> tuple[str, str] | None:
    """(NAME[/SCHEMA], URL) of a `NAME[/SCHEMA]=scheme://...` entry, or None for anything
    else (a URL, libpq `key=value` settings): the one test of that form for the CLI."""
    label, sep, rest = text.partition("=")
    if sep and "://" in rest and "://" not in label and label.strip():
        return label, rest
    return None


def database_entry_type(text: str) -> str:
    """The argparse `type=` of one `[NAME[/SCHEMA]=]URL`: the URL part checked as
    `postgres_url_type` checks a URL (a SQLAlchemy driver name dropped, another scheme refused)."""
    check = postgres_url_type(ENV_DATABASE_URL)
    named = named_url(text)
    if named is not None:
        label, url = named
        return f"{label}={check(url)}"
    return check(text)


def single_database(args: argparse.Namespace) -> None:
    """A command of one database given `NAME[/SCHEMA]=URL` (a line of a databases file): its
    URL in `args.database_url` and its SCHEMA, when given, in `args.schema`. Anything else is
    left for the connection to judge, as a URL always was."""
    from outbox.core.databases import parse_entry

    text = getattr(args, "database_url", None)
    if not isinstance(text, str) or named_url(text) is None:
        return
    database = parse_entry(text, getattr(args, "schema", None) or "outbox")
    args.database_url = database.url
    if hasattr(args, "schema"):
        args.schema = database.schema


def databases_of(args: argparse.Namespace) -> list[Database]:
    """The databases of --database-url (each `[NAME[/SCHEMA]=]URL`) and --databases-file, or
    else the one of OUTBOX_DATABASE_URL; a usage error when there are none."""
    from outbox.core.databases import gather, parse_entry

    schema = args.schema
    entries: list[str] = list(args.database_url or [])
    listed = gather(entries, schema, file=args.databases_file or None)
    if listed:
        return listed
    fallback = os.environ.get(ENV_DATABASE_URL, "").strip()
    if fallback:
        return [parse_entry(database_entry_type(fallback), schema)]
    if args.databases_file:
        raise ConfigurationError(f"the databases file {args.databases_file!r} lists no database")
    raise ConfigurationError(
        f"--database-url is required (or --databases-file, or set {ENV_DATABASE_URL})"
    )


def add_transport(parser: argparse.ArgumentParser, role: Role) -> None:
    """--transport, and the flags of every registered transport that can serve the CLI's
    processes (each adds its own, `Transport.add_arguments`, for a command of `role`)."""
    offered = transports.names("processes")
    parser.add_argument(
        "--transport",
        type=choice_type(offered, settings.TRANSPORT),
        choices=offered,
        default=os.environ.get(settings.TRANSPORT, "kafka"),
        help="kafka, or postgres for the log kept in PostgreSQL at --log-url, or a transport "
        f"registered by your own module (docs/how-to/transports.md) (env {settings.TRANSPORT}; "
        "default kafka)",
    )
    for entry in transports.entries("processes"):
        entry.add_arguments(parser, role)


def _start(text: str) -> str:
    """The argparse `type=` of --start: the text, checked (the subscriber parses it again)."""
    from outbox.kafka.start import parse_start

    try:
        return str(parse_start(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (from the flag, or from {settings.CONSUMER_START} when the flag is not given)"
        ) from None


def add_start(parser: argparse.ArgumentParser) -> None:
    """The consumer's --start: where a new group starts in a partition."""
    parser.add_argument(
        "--start",
        type=_start,
        default=os.environ.get(settings.CONSUMER_START),
        metavar="earliest|latest|TIME",
        help="where the group starts in a partition it has never committed an offset for: "
        "earliest (the oldest record kept), latest (only records produced from now on), or an "
        "ISO 8601 time with its offset, e.g. 2024-05-01T12:00:00Z (the first record at or "
        "after it); partitions with a committed offset resume there whatever this says "
        f"(env {settings.CONSUMER_START}; default earliest; Kafka only)",
    )


def topic_list_type(env: str) -> Callable[[str], list[str]]:
    """The argparse `type=` of a comma-separated list of topic names (`--topic a,b`, or the
    variable `env`): each name checked as Kafka would, an empty item refused, duplicates
    collapsed in their first order. A bad list is a usage error naming the flag and `env`."""
    from outbox.core.errors import InvalidTopic
    from outbox.core.topics import validate_topic

    source = f" (from the flag, or from {env} when the flag is not given)"

    def topic_list(text: str) -> list[str]:
        names: list[str] = []
        for item in text.split(","):
            name = item.strip()
            if not name:
                raise argparse.ArgumentTypeError(
                    f"empty topic name in {text!r}: give names separated by single commas{source}"
                )
            try:
                validate_topic(name)
            except InvalidTopic as exc:
                raise argparse.ArgumentTypeError(f"{exc}{source}") from None
            names.append(name)
        return list(dict.fromkeys(names))

    topic_list.__name__ = "topic list"
    return topic_list


class TopicsAction(argparse.Action):
    """A repeatable flag of comma-separated topic lists: the lists given on the command line
    are joined, duplicates collapsed; a default from the environment is replaced, not joined."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        # Not a list yet: the default (the variable's text, or None), which the flag overrides.
        joined = list(current) if isinstance(current, list) else []
        joined.extend(values if isinstance(values, list) else [values])
        setattr(namespace, self.dest, list(dict.fromkeys(joined)))


def add_topics(parser: argparse.ArgumentParser, help: str) -> None:
    """--topic: a comma-separated list of topics, repeatable, defaulting to OUTBOX_TOPICS."""
    parser.add_argument(
        "--topic",
        dest="topics",
        action=TopicsAction,
        type=topic_list_type(settings.TOPICS),
        # An empty variable counts as unset. argparse converts a string default with `type`.
        default=os.environ.get(settings.TOPICS) or None,
        metavar="TOPIC[,TOPIC...]",
        help=f"{help} (env {settings.TOPICS})",
    )


def env_groups() -> list[str]:
    """The consumer groups of OUTBOX_LAG_GROUPS (comma-separated)."""
    return [g.strip() for g in os.environ.get(settings.LAG_GROUPS, "").split(",") if g.strip()]


def add_groups(parser: argparse.ArgumentParser, every: str = "of the cluster") -> None:
    """The repeatable --group of the commands that show lag; by default they show every group
    `every` (where they read the lag)."""
    parser.add_argument(
        "--group",
        dest="groups",
        action="append",
        default=None,
        metavar="GROUP",
        help=f"consumer group whose lag is shown; repeatable (env {settings.LAG_GROUPS}, "
        f"comma-separated; default every group {every})",
    )


def require(value: str | None, flag: str, env: str) -> str:
    """The value of a required setting, or a ConfigurationError naming its flag and variable."""
    if not value:
        raise ConfigurationError(f"{flag} is required (or set {env})")
    return value


def add_logging(parser: argparse.ArgumentParser) -> None:
    """The global --log-level and --log-format."""
    parser.add_argument(
        "--log-level",
        type=choice_type(LOG_LEVELS, settings.LOG_LEVEL),
        choices=LOG_LEVELS,
        default=os.environ.get(settings.LOG_LEVEL, "INFO"),
        help=f"DEBUG, INFO, WARNING or ERROR, in any case (env {settings.LOG_LEVEL}; default INFO)",
    )
    parser.add_argument(
        "--log-format",
        type=choice_type(LOG_FORMATS, settings.LOG_FORMAT),
        choices=LOG_FORMATS,
        default=os.environ.get(settings.LOG_FORMAT, "text"),
        help=f"text, or json for one JSON object per line (env {settings.LOG_FORMAT}; "
        "default text)",
    )


def add_runtime(parser: argparse.ArgumentParser) -> None:
    """Metrics and health servers of a daemon: --metrics-port/-host, --health-port/-host."""
    parser.add_argument(
        "--metrics-port",
        type=flag_type("port", settings.METRICS_PORT),
        default=os.environ.get(settings.METRICS_PORT),
        help=f"serve Prometheus metrics on this port at /metrics (env {settings.METRICS_PORT}; "
        "default off; needs the `metrics` extra)",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get(settings.METRICS_HOST, "0.0.0.0"),
        help=f"address the metrics server binds (env {settings.METRICS_HOST}; default 0.0.0.0, "
        "every interface)",
    )
    parser.add_argument(
        "--health-port",
        type=flag_type("port", settings.HEALTH_PORT),
        default=os.environ.get(settings.HEALTH_PORT),
        help=f"serve /livez and /readyz on this port (env {settings.HEALTH_PORT}; default off)",
    )
    parser.add_argument(
        "--health-host",
        default=os.environ.get(settings.HEALTH_HOST, "0.0.0.0"),
        help=f"address the health server binds (env {settings.HEALTH_HOST}; default 0.0.0.0, "
        "every interface)",
    )
    parser.add_argument(
        "--liveness-timeout",
        type=flag_type("seconds", settings.LIVENESS_TIMEOUT),
        default=os.environ.get(settings.LIVENESS_TIMEOUT, "120"),
        help="seconds without progress of the main loop before /livez answers 503 "
        f"(env {settings.LIVENESS_TIMEOUT}; default 120)",
    )
    parser.add_argument(
        "--log-interval",
        type=flag_type("seconds_or_zero", settings.LOG_INTERVAL),
        default=os.environ.get(settings.LOG_INTERVAL, "10"),
        metavar="SECONDS",
        help="sum the batches into one INFO line per this many seconds (per daemon, whatever "
        "its number of databases; each batch's line is DEBUG); 0: an INFO line per batch "
        f"(env {settings.LOG_INTERVAL}; default 10)",
    )
    parser.add_argument(
        "--wait-for-database",
        type=flag_type("seconds_or_zero", settings.WAIT_FOR_DATABASE),
        default=os.environ.get(settings.WAIT_FOR_DATABASE, "0"),
        help="at start, wait up to this many seconds for PostgreSQL to accept connections, "
        "retrying with backoff and a WARNING per attempt, then exit 1 "
        f"(env {settings.WAIT_FOR_DATABASE}; default 0: exit 1 at once, for a supervisor "
        "to restart)",
    )


def runtime_config(args: argparse.Namespace) -> ObservabilityConfig:
    """The metrics and health settings of a daemon from its parsed flags."""
    from outbox.runtime import ObservabilityConfig

    return ObservabilityConfig(
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        health_port=args.health_port,
        health_host=args.health_host,
        liveness_timeout=args.liveness_timeout,
        wait_for_database=args.wait_for_database,
        log_interval=args.log_interval,
    )


def add_many(parser: argparse.ArgumentParser) -> None:
    """The flags of a relay serving several databases (`outbox producer`, `handler`, `run`)."""
    parser.add_argument(
        "--database-turns",
        type=flag_type("threads"),
        default=2,
        metavar="N",
        help="with several databases: how many of them process a batch at the same time; "
        "the others wait their turn, first come first served, so a busy database cannot "
        "starve a quiet one (default 2)",
    )
    parser.add_argument(
        "--idle-disconnect",
        type=flag_type("seconds_or_zero"),
        default=60.0,
        metavar="SECONDS",
        help="with several databases: seconds without rows after which a database's relay "
        "leaves its lanes and closes its connections; it then looks for rows on a short-lived "
        "connection after --poll-interval, then less and less often up to every 10 times "
        "--poll-interval (no NOTIFY wake-up meanwhile). 0: never (default 60)",
    )
    add_budget(parser)


def add_budget(parser: argparse.ArgumentParser) -> None:
    """The connection budget of a process serving several databases."""
    parser.add_argument(
        "--max-connections",
        type=flag_type("count_or_zero", settings.MAX_CONNECTIONS),
        default=os.environ.get(settings.MAX_CONNECTIONS, "0"),
        metavar="N",
        help="with several databases: the most connections the process holds to its databases "
        "at once (relays, a handler's workers, the consumer's, shared by the daemons of "
        "`outbox run`); short of them a database waits for one, the database idle longest "
        "gives its own back first, busy ones take turns, and a handler's --concurrency "
        "workers are shared by its databases, at most N/2 of them "
        f"(env {settings.MAX_CONNECTIONS}; at least 2; "
        "default 0: unlimited)",
    )


def add_routing(parser: argparse.ArgumentParser) -> None:
    """The consumer's routing over several databases (`outbox consumer`, `outbox run`)."""
    parser.add_argument(
        "--route-header",
        default=os.environ.get(settings.ROUTE_HEADER) or None,
        metavar="NAME",
        help="with several databases (or --databases-file): the header whose value is the NAME "
        "of the database that stores a record; a record without it, or naming no database "
        "served, is quarantined in --quarantine-database. Given with one database, routing is "
        f"on too (env {settings.ROUTE_HEADER}; default outbox-tenant, which Broker(tenant=...) "
        "sets)",
    )
    parser.add_argument(
        "--quarantine-database",
        default=os.environ.get(settings.QUARANTINE_DATABASE) or None,
        metavar="NAME|NAME=URL",
        help="when routing (required then): the database that stores, dead, the records no "
        "database can be chosen for: the NAME of one served, or NAME[/SCHEMA]=URL for one of its "
        "own, which stores nothing else and whose NAME is no tenant; not guessed, so that no "
        f"tenant's inbox holds another's records unasked (env {settings.QUARANTINE_DATABASE})",
    )


def transport_of(args: argparse.Namespace) -> transports.TransportSettings:
    """The transport settings of a command's parsed flags: the chosen transport's options,
    parsed by its entry from the flags it added (the one place the CLI builds them)."""
    return transports.settings_of(getattr(args, "transport", None) or "kafka", vars(args))


#: Each daemon's tuning: its config's field and the parsed flag that sets it, per command
#: (`outbox run` names the batch sizes by daemon).
TUNING: dict[str, dict[str, dict[str, str]]] = {
    "producer": {"producer": {"batch_size": "batch_size", "poll_interval": "poll_interval"}},
    "consumer": {"consumer": {"batch_size": "batch_size"}},
    "handler": {
        "handler": {
            name: name
            for name in (
                "concurrency",
                "batch_size",
                "poll_interval",
                "dedup_window",
                "transaction_size",
                "lease",
            )
        }
    },
    "run": {
        "producer": {"batch_size": "producer_batch_size", "poll_interval": "poll_interval"},
        "consumer": {"batch_size": "consumer_batch_size"},
        "handler": {
            "concurrency": "concurrency",
            "batch_size": "handler_batch_size",
            "poll_interval": "poll_interval",
            "dedup_window": "dedup_window",
            "transaction_size": "transaction_size",
            "lease": "lease",
        },
    },
}


def settings_of(args: argparse.Namespace) -> Settings:
    """The `Settings` of a daemon command (`producer`, `consumer`, `handler`, `run`) from its
    parsed flags: the flags, their `OUTBOX_*` variables (the flags' defaults) and the files
    they name (a databases file, a Kafka properties file) reach the composition root through
    this one function."""
    from outbox.core.databases import gather, parse_entry
    from outbox.runtime import (
        ConsumerConfig,
        Databases,
        HandlerConfig,
        ProducerConfig,
        Settings,
    )

    schema = args.schema
    fixed = gather(list(args.database_url or []), schema)
    fallback = os.environ.get(ENV_DATABASE_URL, "").strip()
    if not fixed and not args.databases_file and fallback:
        fixed = [parse_entry(database_entry_type(fallback), schema)]
    tuning = TUNING.get(args.command, {})

    def tuned(daemon: str) -> dict[str, Any]:
        return {field: getattr(args, flag) for field, flag in tuning.get(daemon, {}).items()}

    return Settings(
        databases=Databases(
            fixed=tuple(fixed),
            file=args.databases_file or None,
            schema=schema,
            turns=getattr(args, "database_turns", 2),
            idle_disconnect=getattr(args, "idle_disconnect", 60.0),
            max_connections=getattr(args, "max_connections", 0),
            route_header=getattr(args, "route_header", None),
            quarantine=getattr(args, "quarantine_database", None),
        ),
        transport=transport_of(args),
        group=getattr(args, "group", None) or "",
        topics=tuple(getattr(args, "topics", None) or ()),
        producer=ProducerConfig(**tuned("producer")),
        consumer=ConsumerConfig(**tuned("consumer")),
        handler=HandlerConfig(**tuned("handler")),
        observability=runtime_config(args),
    )
