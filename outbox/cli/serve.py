"""The `outbox serve` command: its flags, and serving until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import os

from outbox import settings
from outbox.cli.arguments import add_databases, add_transport, transport_of
from outbox.core.numbers import flag_type


def add_serve_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `outbox serve` to the `outbox` command's subparsers."""
    serve = commands.add_parser(
        "serve",
        help="serve topics, publish and subscriptions over HTTP, for services in any language",
        description="An HTTP server (FastAPI on uvicorn; the `serve` extra): publish into the "
        "outbox of each database given (?database=NAME), and, with --transport postgres, the "
        "log's topics and subscriptions that each read at their own position. Bearer tokens "
        "with scopes from --tokens-file; binds 127.0.0.1 unless --host says otherwise, and "
        "another address needs tokens. OpenAPI at /openapi.json, its page at /docs. See "
        "docs/http.md.",
    )
    add_databases(serve)
    add_transport(serve, "reader")
    serve.add_argument(
        "--log-partitions",
        type=flag_type("count", settings.LOG_PARTITIONS),
        default=os.environ.get(settings.LOG_PARTITIONS, "8"),
        help="partitions of a topic created without a count "
        f"(env {settings.LOG_PARTITIONS}; default 8)",
    )
    serve.add_argument(
        "--host",
        default=os.environ.get(settings.SERVE_HOST, "127.0.0.1"),
        help=f"address to bind (env {settings.SERVE_HOST}; default 127.0.0.1; any other "
        "address needs --tokens-file)",
    )
    serve.add_argument(
        "--port",
        type=flag_type("port", settings.SERVE_PORT),
        default=os.environ.get(settings.SERVE_PORT, "8480"),
        help=f"port to listen on (env {settings.SERVE_PORT}; default 8480)",
    )
    serve.add_argument(
        "--tokens-file",
        default=os.environ.get(settings.SERVE_TOKENS_FILE) or None,
        metavar="PATH",
        help="the bearer tokens accepted, one `SCOPE[,SCOPE] TOKEN` a line (scopes publish, "
        f"consume, admin; # comments) (env {settings.SERVE_TOKENS_FILE}; default none: no "
        "token asked, on a loopback address only)",
    )
    serve.add_argument(
        "--registry",
        metavar="MODULE[:ATTRIBUTE]",
        default=None,
        help="a module, Handlers registry, Topic or list of Topics whose typed topics' payloads "
        "are validated on publish (422 naming the field)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=flag_type("count"),
        default=4 * 1024 * 1024,
        help="largest request body; a larger one is answered 413 unread",
    )
    serve.add_argument(
        "--lease",
        type=flag_type("seconds"),
        default=30.0,
        help="seconds the records of a `next` stay leased to its client unless it gives "
        "lease_ms; not acknowledged by then, they are handed out again",
    )
    serve.add_argument(
        "--idempotency-window",
        type=flag_type("seconds"),
        default=7 * 24 * 3600.0,
        help="seconds a message id given to a publish is remembered: a publish with it again "
        "within the window writes nothing",
    )
    serve.add_argument(
        "--pool-size",
        type=flag_type("threads"),
        default=8,
        help="connections per database",
    )


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT."""
    from outbox.cli.arguments import databases_of
    from outbox.core.redact import remember_secrets, secrets_of_url
    from outbox.http import ServeConfig, require_extra, serve
    from outbox.runtime import Databases, Settings

    require_extra()
    databases = databases_of(args)
    for database in databases:
        remember_secrets(secrets_of_url(database.url))
    config = ServeConfig.of(
        tokens_file=args.tokens_file,
        host=args.host,
        port=args.port,
        registry=args.registry,
        max_body_bytes=args.max_body_bytes,
        lease=args.lease,
        idempotency_window=args.idempotency_window,
        pool_size=args.pool_size,
    )
    for token in config.tokens:
        remember_secrets([token.secret.decode()])
    the_settings = Settings(
        databases=Databases(fixed=tuple(databases), schema=args.schema),
        transport=transport_of(args),
    )
    print(f"outbox serve: http://{args.host}:{args.port}", flush=True)
    serve(the_settings, config)
    return 0
