"""The `outbox asyncapi` command: the AsyncAPI 3.0 document of a service: its handlers, and
the topics it sends (a module of Topics, a Topic list or a registry)."""

from __future__ import annotations

import argparse
import os
import sys

from outbox.cli.arguments import add_transport
from outbox.core.errors import ConfigurationError


def add_asyncapi_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `outbox asyncapi` to the `outbox` command's subparsers."""
    asyncapi = commands.add_parser(
        "asyncapi",
        help="write the AsyncAPI 3.0 document of a service: what it sends and receives",
        description="Writes the AsyncAPI 3.0 document of a service: a channel per topic it "
        "receives (its handlers) or sends (its Topics, or handlers.sends), each message's JSON "
        "Schema, key and headers, a receive or send operation, and the server: Kafka "
        "(--kafka-bootstrap) or, with --transport postgres, the log at --log-url (host, port "
        "and database only). Nothing connects. See docs/how-to/asyncapi.md.",
    )
    asyncapi.add_argument(
        "handlers",
        metavar="MODULE[:ATTRIBUTE]",
        help="a module of the service (its Handlers registries and Topics at top level: a "
        "Topic no handler there receives is one it sends), or an attribute of one: a Handlers "
        "registry, a Topic or a list of Topics; e.g. svc.handlers:handlers, svc.contracts",
    )
    asyncapi.add_argument(
        "--format",
        choices=("json", "yaml"),
        default=None,
        help="json or yaml (default: yaml when --output ends in .yaml or .yml, else json)",
    )
    asyncapi.add_argument(
        "--output", metavar="FILE", default=None, help="write the document to FILE, not stdout"
    )
    asyncapi.add_argument(
        "--title",
        default=None,
        help="the document's title (default: the MODULE[:ATTRIBUTE] given)",
    )
    asyncapi.add_argument(
        "--api-version", default="1.0.0", help="the document's info.version (default 1.0.0)"
    )
    add_transport(asyncapi, "reader")


def run_asyncapi(args: argparse.Namespace) -> int:
    """Write the document; a service that cannot be loaded or described is one line and
    exit 1."""
    from outbox import transports
    from outbox.asyncapi import build_document, dumps, load_service
    from outbox.cli.arguments import transport_of

    service = load_service(args.handlers)
    servers, schemes = transports.get(args.transport, what="--transport").asyncapi_servers(
        transports.options(transport_of(args))
    )
    document = build_document(
        service,
        title=args.title or args.handlers,
        version=args.api_version,
        servers=servers,
        security_schemes=schemes,
        source=args.handlers,
    )
    format = args.format
    if format is None:
        suffix = os.path.splitext(args.output or "")[1].lower()
        format = "yaml" if suffix in (".yaml", ".yml") else "json"
    text = dumps(document, format)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        raise ConfigurationError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    return 0
