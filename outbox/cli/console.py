"""The `outbox console` command: its flags, and running it until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import os

from outbox import settings
from outbox.cli.arguments import (
    add_databases,
    add_groups,
    add_transport,
    env_groups,
)
from outbox.core.numbers import flag_type


def env_flag(name: str) -> bool:
    """True when the environment variable `name` is 1, true, yes or on."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def add_console_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `outbox console` to the `outbox` command's subparsers."""
    console = commands.add_parser(
        "console",
        help="serve an operator's web page: queues, processes, lag, throughput, dead letters",
        description="A web page per service database, refreshing on its own; the databases "
        "are listed at the top, one the console cannot read marked (a --databases-file is "
        "read again every few seconds). Binds 127.0.0.1 unless an auth token is set. The "
        "consumer groups' lag is read from Kafka (--kafka-bootstrap) or, with --transport "
        "postgres, from the log at --log-url. See docs/how-to/console.md.",
    )
    add_databases(console)
    add_transport(console, "reader")
    add_groups(console, every="of the Kafka cluster, or of the log with --transport postgres")
    console.add_argument(
        "--host",
        default=os.environ.get(settings.CONSOLE_HOST, "127.0.0.1"),
        help=f"address to bind (env {settings.CONSOLE_HOST}; default 127.0.0.1; any other "
        "address needs --auth-token)",
    )
    console.add_argument(
        "--port",
        type=flag_type("port", settings.CONSOLE_PORT),
        default=os.environ.get(settings.CONSOLE_PORT, "8470"),
        help=f"port to listen on, 0 for any free one (env {settings.CONSOLE_PORT}; default 8470)",
    )
    console.add_argument(
        "--auth-token",
        default=os.environ.get(settings.CONSOLE_TOKEN),
        help=f"token every request must carry: the password of HTTP basic auth (any user) or "
        f"`Authorization: Bearer TOKEN` (env {settings.CONSOLE_TOKEN}, preferred: a flag "
        "shows in ps)",
    )
    console.add_argument(
        "--read-only",
        action="store_true",
        default=env_flag(settings.CONSOLE_READ_ONLY),
        help=f"hide and refuse requeue and purge (env {settings.CONSOLE_READ_ONLY})",
    )
    console.add_argument(
        "--asyncapi",
        metavar="MODULE[:ATTRIBUTE]",
        default=os.environ.get(settings.CONSOLE_ASYNCAPI) or None,
        help="serve the AsyncAPI document of this service at /asyncapi, a page linked from "
        "the console's (the argument of `outbox asyncapi`: a module of the service, or its "
        f"Handlers registry, Topic or list of Topics; env {settings.CONSOLE_ASYNCAPI})",
    )
    console.add_argument(
        "--refresh",
        type=flag_type("seconds", settings.CONSOLE_REFRESH),
        default=os.environ.get(settings.CONSOLE_REFRESH, "3"),
        help=f"seconds between refreshes of the page (env {settings.CONSOLE_REFRESH}; default 3)",
    )


def run_console(args: argparse.Namespace) -> int:
    """Serve the console until SIGTERM or SIGINT."""
    import signal
    from types import FrameType

    from outbox import transports
    from outbox.cli.arguments import databases_of, transport_of
    from outbox.console.server import Console, ConsoleConfig, Database
    from outbox.core.databases import gather
    from outbox.core.redact import remember_secrets, secrets_of_url

    # Every entry checked now (a bad one is one line before the console starts); the console
    # reads the databases file again while it runs.
    databases = databases_of(args)
    for d in databases:
        remember_secrets(secrets_of_url(d.url))
    if args.databases_file:
        databases = gather(args.database_url or [], args.schema)
    if args.auth_token:
        remember_secrets([args.auth_token])
    transport = transport_of(args)
    remember_secrets(transports.get(transport.name).secrets(transports.options(transport)))
    config = ConsoleConfig(
        databases=tuple(Database(d.name, d.url, d.schema) for d in databases),
        databases_file=args.databases_file or None,
        schema=args.schema,
        host=args.host,
        port=args.port,
        auth_token=args.auth_token or None,
        read_only=args.read_only,
        refresh=args.refresh,
        groups=tuple(args.groups if args.groups is not None else env_groups()),
        transport=transport,
        asyncapi=args.asyncapi,
    )
    console = Console(config)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        console.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"outbox console: {console.url}", flush=True)
    console.run()
    return 0
