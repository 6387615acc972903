"""The configuration reference, generated from the code: `docs/reference/configuration.md`.

    python -m outbox.cli.reference > docs/reference/configuration.md

Walks `outbox.cli.build_parser()` (every command and nested command), `outbox.settings.ENVIRONMENT`,
the librdkafka settings of `outbox.kafka`, and the signatures and config objects of the Python API.
Hand-written prose lives in this module only; `tests/unit/test_configuration_reference.py` fails
when the committed file differs from what this prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from outbox import settings

COMMAND = "python -m outbox.cli.reference > docs/reference/configuration.md"

INTRO = f"""\
# Configuration reference

<!-- Generated from the code by `{COMMAND}`.
     Do not edit by hand: change the code, or the prose in outbox/cli/reference.py. -->

Every flag of the `outbox` command, every environment variable outbox reads, the librdkafka
settings the daemons force or default, and the options of the Python API. A flag with an
environment variable takes its default from it; the flag wins when both are given. Global
options go before the command: `outbox --log-level DEBUG producer ...`.
"""

ENVIRONMENT_NOTE = """\
The database URLs are handed to libpq, which fills in what a URL leaves out from its own
variables (`PGPASSWORD`, `PGSSLMODE`, `PGSSLROOTCERT`, ...; see the PostgreSQL manual,
"Environment Variables"), so a password can come from a secret without appearing in the URL.
Every librdkafka setting (`security.protocol`, `sasl.*`, `ssl.*`, ...) can come from three
places, so that a secret never has to be on a command line (`ps` shows it to every user of the
host): `--kafka-config KEY=VALUE`; a variable `OUTBOX_KAFKA_CONFIG_<NAME>`, NAME being the key
upper-cased with its dots written as underscores (`OUTBOX_KAFKA_CONFIG_SASL_PASSWORD` sets
`sasl.password`; librdkafka's keys use dots only, except its C callbacks and two integers,
`log_level` and `enabled_events`, whose variables are `OUTBOX_KAFKA_CONFIG_LOG_LEVEL` and
`OUTBOX_KAFKA_CONFIG_ENABLED_EVENTS`); and a properties file named by `--kafka-config-file` or
`OUTBOX_KAFKA_CONFIG_FILE` (`key=value` lines, blank lines and `#` comments ignored). For each
setting a flag beats a variable, which beats the file. A file that cannot be read, or a line
that is not `key=value`, stops the command with one line naming the file and the line number.
"""

KAFKA_NOTE = """\
The relay's and the consumer's librdkafka settings are built in three layers: outbox's defaults,
then the user's (each `--kafka-config KEY=VALUE`, `OUTBOX_KAFKA_CONFIG_<NAME>` variable or line of
`--kafka-config-file`), then the settings the guarantees depend on, which cannot be changed: a
user setting that contradicts one of those is refused at start with an error
saying what it would break. Any other librdkafka setting (see librdkafka's CONFIGURATION.md) is
passed through as given.
"""

EXIT_CODES = """\
## Exit codes

| code | when |
|---|---|
| 0 | success; a daemon stopped by SIGTERM or SIGINT after finishing the batch in hand |
| 1 | an error, one line on stderr: `outbox: error: ...` (a server unreachable, a database \
not migrated, a required setting given neither as flag nor as variable, a bad setting, an \
unknown row id, a `log-groups forget` of a group the log does not know or one with consumers \
running, a `log-topics alter` to fewer partitions than the topic has, `outbox demo`, which \
runs only from a source checkout, ...) |
| 2 | a usage error, argparse's message on stderr: `outbox` without a command (the help), an \
unknown command or flag (flags are never abbreviated: `--database` is not `--database-url`), a \
missing argument, a bad value of a flag or of the environment variable it defaults from \
(`OUTBOX_LOG_LEVEL=verbose`), a `dead-letters requeue` or `purge` without exactly one of IDs, \
`--topic` and `--all`, an `outbox consumer` given neither `MODULE:ATTRIBUTE` nor `--topic` |
| 3 | `outbox status --check`: a queue holds more dead rows than `--max-dead` (by default \
any dead row), a pending or retrying row is older than \
`--max-age`, or a consumer group lags more than `--max-lag` or its lag cannot be read; \
`outbox spark audit`: a message is missing or was handled twice (the problems are listed in \
the output) |
| 130 | interrupted by Ctrl-C outside a daemon's loop |
"""

#: Meanings of the Python API parameters; the reference renders every parameter of the
#: signatures below, and a test fails when one has no meaning here.
PARAMETER_MEANINGS: dict[str, dict[str, str]] = {
    "Broker": {
        "schema": "schema of the outbox tables (`[a-z_][a-z0-9_]{0,62}`)",
        "serializer": "encodes payloads that are neither `bytes` nor `str`",
        "max_message_bytes": "largest Kafka record `send` accepts: key, encoded payload and "
        "every header name and value (outbox's own included) with 10 bytes each; larger raises "
        "`PayloadTooLarge` before anything is written. The default (None) is 999872: "
        "librdkafka's default `message.max.bytes` less a 128-byte margin for Kafka's framing",
        "max_payload_bytes": "old name of `max_message_bytes` (it now bounds the whole record); "
        "give one or the other",
        "tenant": "the tenant whose inbox receives this broker's messages: a database NAME, sent "
        "in the `tenant_header` header for `outbox consumer --route-header` to route by; "
        "`send(..., tenant=...)` overrides it per message. An invalid name raises before "
        "anything is written",
        "tenant_header": "the header that carries the tenant (the consumer's `--route-header`)",
    },
    "Handlers": {
        "transaction": 'what callbacks receive: `"psycopg"` (a `Connection`, `AsyncConnection` '
        'for async callbacks) or `"sqlalchemy"` (a `Session`, `AsyncSession` for async callbacks)',
        "serializer": "decodes payloads for `message.payload`",
        "pipeline": "`True` (psycopg, sync callbacks): run each batch transaction in psycopg's "
        "pipeline mode, about one round trip per batch; see docs/inbox.md for what changes",
    },
    "Handlers.handler": {
        "topic": "the topic this callback handles; one handler per topic and registry",
        "max_attempts": "attempts before the message is marked dead (see `outbox dead-letters`)",
        "backoff": "delay before each retry: `Backoff(initial, maximum, multiplier=2.0, "
        "jitter=0.1)`",
        "ordered": "with `False`, a message waiting for a retry does not hold back the later "
        "messages of its key",
    },
}

#: What a None default of a Python API parameter stands for.
NONE_DEFAULTS: dict[tuple[str, str], str] = {
    ("Broker", "serializer"): "JsonSerializer()",
    ("Handlers", "serializer"): "JsonSerializer()",
    ("Handlers.handler", "backoff"): "Backoff(initial=1.0, maximum=300.0)",
}

#: Meanings of flags declared without a help text, by (*command path, dest). A test fails when
#: a flag has neither; a help text in the code is better than an entry here.
FALLBACK_HELP: dict[tuple[str, ...], str] = {}

#: Meanings of config fields without a `#:` comment and without a flag, by field name.
FIELD_MEANINGS: dict[str, str] = {
    "rebalance_interval": "seconds between two looks at the lane shares (only between batches)",
    "backoff": "delay before a failed delivery is retried; the row's key waits meanwhile",
    "connect_timeout": "seconds to wait for PostgreSQL (and Kafka) when connecting",
    "relay_id": "this process's id in `relay_state` and `outbox status` (host:pid:random)",
    "retention_interval": "seconds between two deletions of handled message ids "
    "(consumer_processed) past the dedup window",
    "retention_batch": "handled message ids deleted per statement",
    "poll_timeout": "seconds one Kafka poll waits for records",
    "observability": "metrics and health servers of the daemon",
}
#: The flags that set a config field, when its name is not the flag's.
FIELD_FLAGS: dict[str, str] = {
    "topics": "--topic",
    "fixed": "--database-url",
    "file": "--databases-file",
    "turns": "--database-turns",
    "quarantine": "--quarantine-database",
    "transport": "--transport",
    "observability": "--metrics-port, --metrics-host, --health-port, --health-host, "
    "--liveness-timeout",
}

#: Prose after a command's table, by command path.
COMMAND_NOTES: dict[tuple[str, ...], str] = {
    ("migrate",): "Runs outbox's own Alembic chain; its version table is `alembic_version` in "
    "the outbox schema, apart from any of yours. `--sql` needs no database.",
    ("producer",): "Several producers may run against one database: they share the 64 lanes "
    "and keep per-key order. SIGTERM finishes the batch in hand (waiting for its delivery "
    "reports) and exits 0.",
    ("consumer",): "Several consumers in one `--group` share the topics' partitions (more "
    "consumers than partitions idle). Offsets are committed only after the inbox insert "
    "committed. With several databases (or --databases-file, --route-header), each record is "
    "stored in the database its --route-header names, and a record no database can be chosen "
    "for is quarantined (docs/how-to/many-databases.md).",
    ("handler",): "`MODULE` is imported with the current directory first on `sys.path`. "
    "Several handler processes share the lanes like producers do; within a process a lane "
    "belongs to one of the `--concurrency` worker threads.",
}

_ENV_IN_HELP = re.compile(r"\b(OUTBOX_[A-Z0-9_]+)\b")
_SENTINEL_BASE = 7900


# -- the command line ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Command:
    """One command or nested command of `outbox`, with its parser."""

    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str | None

    @property
    def name(self) -> str:
        return " ".join(("outbox", *self.path))


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = (), help: str | None = None
) -> Iterator[Command]:
    """The command of `parser`, then each of its subcommands, depth first, in declared order."""
    yield Command(path, parser, help)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                yield from walk(sub, (*path, name), helps.get(name))


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Run with every registered and every OUTBOX_* variable unset, except `values`."""
    names = {v.name for v in settings.ENVIRONMENT} | {
        k for k in os.environ if k.startswith("OUTBOX_")
    }
    saved = {name: os.environ[name] for name in names if name in os.environ}
    try:
        for name in names:
            os.environ.pop(name, None)
        os.environ.update(values)
        yield
    finally:
        for name in names | set(values):
            os.environ.pop(name, None)
        os.environ.update(saved)


def _defaults(parser: argparse.ArgumentParser) -> dict[tuple[tuple[str, ...], str], Any]:
    return {
        (command.path, action.dest): action.default
        for command in walk(parser)
        for action in command.parser._actions
    }


def _environment_of_flags(
    build: Callable[[], argparse.ArgumentParser],
) -> dict[tuple[tuple[str, ...], str], str]:
    """Which registered variable each flag takes its default from, found by setting them.

    The parser is built once with every variable unset and once with each set to a distinct
    number (valid as a string, an int and a float); a default that changed came from that
    variable.
    """
    with _environment({}):
        baseline = _defaults(build())
    sentinels = {
        entry.name: str(_SENTINEL_BASE + index) for index, entry in enumerate(settings.ENVIRONMENT)
    }
    try:
        with _environment(sentinels):
            probed = _defaults(build())
    except Exception:  # a default that cannot take a number: fall back on the help texts
        return {}
    found: dict[tuple[tuple[str, ...], str], str] = {}
    for key, value in probed.items():
        if value == baseline.get(key):
            continue
        for name, text in sentinels.items():
            if value in (text, int(text), float(text)):
                found[key] = name
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    # A plain formatter: the default has its own column, not a `(default: X)` in the meaning.
    return argparse.HelpFormatter(parser.prog)._expand_help(action)


def _is_flag(action: argparse.Action) -> bool:
    return bool(action.option_strings) and action.nargs == 0


def _synopsis(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        if action.nargs in ("*", argparse.REMAINDER):
            return f"[{name} ...]"
        if action.nargs == "+":
            return f"{name} [{name} ...]"
        if action.nargs == "?":
            return f"[{name}]"
        return name
    flags = ", ".join(action.option_strings)
    if _is_flag(action):
        return flags
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    return f"{flags} {metavar}"


def _default(action: argparse.Action) -> str:
    if not action.option_strings:
        return "required" if action.nargs in (None, "+") or isinstance(action.nargs, int) else ""
    if action.required:
        return "required"
    if _is_flag(action) or action.default in (None, [], (), argparse.SUPPRESS, ""):
        return ""
    return f"`{action.default}`"


def _meaning(
    parser: argparse.ArgumentParser,
    action: argparse.Action,
    path: tuple[str, ...],
    env: str | None,
) -> str:
    text = _help(parser, action) or FALLBACK_HELP.get((*path, action.dest), "")
    if env:  # the env column says it already
        text = re.sub(rf"\s*\(env {env}\)", "", text)
        text = re.sub(rf"\(env {env}; ", "(", text)
    notes = []
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if isinstance(action, argparse._AppendAction) and "repeatable" not in text:
        notes.append("repeatable")
    return "; ".join(part for part in (text, *notes) if part)


def _shown(action: argparse.Action) -> bool:
    return not (
        isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        or action.help == argparse.SUPPRESS
    )


def render_commands(build: Callable[[], argparse.ArgumentParser]) -> str:
    """One section per command: its flags with environment variable, default and meaning."""
    env_of = _environment_of_flags(build)
    with _environment({}):
        parser = build()
    out: list[str] = []
    for command in walk(parser):
        actions = [a for a in command.parser._actions if _shown(a)]
        subcommands = any(
            isinstance(a, argparse._SubParsersAction) for a in command.parser._actions
        )
        if not command.path:
            out.append("## `outbox` (global options, before the command)\n")
        else:
            positionals = " ".join(_synopsis(a) for a in actions if not a.option_strings)
            title = f"{command.name} {positionals}".strip()
            for action in command.parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    title += f" {action.metavar or 'COMMAND'}"
            out.append(f"## `{title}`\n")
        description = command.parser.description or command.help
        if description and command.path:
            out.append(_cell(description) + "\n")
        if subcommands and not actions:
            continue
        if not actions:
            out.append("No options.\n")
            continue
        out.append("| flag | env | default | meaning |")
        out.append("|---|---|---|---|")
        for action in actions:
            env = env_of.get((command.path, action.dest))
            if env is None:
                mentioned = _ENV_IN_HELP.search(action.help or "")
                env = mentioned.group(1) if mentioned else None
            out.append(
                f"| `{_synopsis(action)}` | {f'`{env}`' if env else ''} | {_default(action)} "
                f"| {_cell(_meaning(command.parser, action, command.path, env))} |"
            )
        out.append("")
        if command.path in COMMAND_NOTES:
            out.extend([COMMAND_NOTES[command.path], ""])
    return "\n".join(out)


# -- environment variables and librdkafka -------------------------------------------------------


def render_environment() -> str:
    """The table of every environment variable outbox reads."""
    out = ["## Environment variables\n", "| variable | meaning | read by |", "|---|---|---|"]
    out.extend(
        f"| `{entry.name}` | {_cell(entry.meaning)} | {_cell(entry.read_by)} |"
        for entry in settings.ENVIRONMENT
    )
    out.extend(["", ENVIRONMENT_NOTE])
    return "\n".join(out)


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _kafka_table(required: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    rows = ["| setting | value | |", "|---|---|---|"]
    rows.extend(
        f"| `{key}` | `{_setting(value)}` | forced |" for key, value in sorted(required.items())
    )
    rows.extend(
        f"| `{key}` | `{_setting(value)}` | default |" for key, value in sorted(defaults.items())
    )
    return rows


def render_kafka() -> str:
    """The librdkafka settings of the relay and of the inbox consumer."""
    from outbox.kafka import publisher, subscriber

    out = ["## librdkafka settings\n", KAFKA_NOTE]
    out.append("### `outbox producer` (the relay)\n")
    out.extend(_kafka_table(publisher.REQUIRED, publisher.DEFAULTS))
    out.append("\n### `outbox consumer` (the inbox)\n")
    out.extend(_kafka_table(subscriber.REQUIRED, subscriber.DEFAULTS))
    out.append("")
    return "\n".join(out)


# -- the Python API -----------------------------------------------------------------------------


def _signature_table(owner: str, func: Callable[..., Any]) -> list[str]:
    rows = ["| parameter | default | meaning |", "|---|---|---|"]
    meanings = PARAMETER_MEANINGS.get(owner, {})
    for name, parameter in inspect.signature(func).parameters.items():
        if name == "self":
            continue
        if parameter.default is inspect.Parameter.empty:
            default = "required"
        elif parameter.default is None and (owner, name) in NONE_DEFAULTS:
            default = f"`{NONE_DEFAULTS[owner, name]}`"
        else:
            default = f"`{parameter.default!r}`"
        meaning = meanings.get(name, "(undocumented)")
        rows.append(f"| `{name}` | {default} | {_cell(meaning)} |")
    return rows


def _field_comments(cls: type) -> dict[str, str]:
    """The `#:` comments above the fields of a dataclass, by field name."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


def _field_default(item: dataclasses.Field[Any]) -> str:
    if item.default is not dataclasses.MISSING:
        return f"`{item.default!r}`"
    factory = item.default_factory
    if factory is dataclasses.MISSING:
        return "required"
    if inspect.isfunction(factory) and factory.__name__ != "<lambda>":
        return f"`{factory.__name__}()`"
    if isinstance(factory, type) and factory not in (dict, list, set, tuple):
        return f"`{factory.__name__}()`"
    return f"`{factory()!r}`"


def _config_table(cls: type, command: argparse.ArgumentParser, path: tuple[str, ...]) -> list[str]:
    flags = {option: action for action in command._actions for option in action.option_strings}
    comments = _field_comments(cls)
    rows = ["| field | default | flag | meaning |", "|---|---|---|---|"]
    for item in dataclasses.fields(cls):
        names = FIELD_FLAGS.get(item.name, "--" + item.name.replace("_", "-"))
        known = [name for name in names.split(", ") if name in flags]
        action = flags[known[0]] if len(known) == 1 else None
        if action is not None:
            mentioned = _ENV_IN_HELP.search(action.help or "")
            meaning = _meaning(command, action, path, mentioned.group(1) if mentioned else None)
        else:
            meaning = FIELD_MEANINGS.get(item.name, "")
        meaning = comments.get(item.name) or meaning
        flag = ", ".join(f"`{name}`" for name in known)
        rows.append(f"| `{item.name}` | {_field_default(item)} | {flag} | {_cell(meaning)} |")
    return rows


def render_python_api(build: Callable[[], argparse.ArgumentParser]) -> str:
    """`Broker`, `Handlers`, `@handlers.handler`, the composition root's `Settings` and the
    daemons' config objects."""
    from outbox import Broker, Handlers
    from outbox.runtime import ConsumerConfig, Databases, HandlerConfig, ProducerConfig, Settings

    out = ["## Python API\n", "### `Broker(...)`\n"]
    out.extend(_signature_table("Broker", Broker.__init__))
    out.append("\n### `Handlers(...)`\n")
    out.extend(_signature_table("Handlers", Handlers.__init__))
    out.append("\n### `@handlers.handler(...)`\n")
    out.extend(_signature_table("Handlers.handler", Handlers.handler))
    out.append(
        "\n### Settings and the daemons' config objects\n\n"
        "The daemons are built from Python by the composition root, from one `Settings`: "
        "`outbox.runtime.App(Settings(...), handlers)` gives `.producer()`, `.consumer()`, "
        "`.handler()` or `.part(kind)` (a relay per database with several), and "
        "`OutboxRuntime(handlers, settings=Settings(...))` runs the three as `outbox run` "
        "does. Every object below is validated at construction and importable from "
        "`outbox.runtime`; the flags are `outbox run`'s (the daemons' own where `run` renames "
        "them). Fields without a flag keep their default under the `outbox` command.\n"
    )
    with _environment({}):
        parser = build()
    commands = {c.path: c.parser for c in walk(parser)}
    for cls, path in (
        (Settings, ("run",)),
        (Databases, ("run",)),
        (ProducerConfig, ("producer",)),
        (ConsumerConfig, ("consumer",)),
        (HandlerConfig, ("handler",)),
    ):
        out.append(f"#### `outbox.runtime.{cls.__name__}`\n")
        out.extend(_config_table(cls, commands[path], path))
        out.append("")
    return "\n".join(out)


def render(build: Callable[[], argparse.ArgumentParser] | None = None) -> str:
    """The whole reference, as markdown."""
    if build is None:
        from outbox.cli import build_parser

        build = build_parser
    sections = [
        INTRO,
        render_commands(build),
        render_environment(),
        render_kafka(),
        render_python_api(build),
        EXIT_CODES,
    ]
    return "\n".join(section.rstrip("\n") + "\n" for section in sections)


def main() -> int:
    """Print the reference to stdout."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
