"""The operator commands of `outbox`: `status`, `dead-letters list|show|requeue|purge`,
`log-groups forget` and `log-topics list|create|alter`.

`outbox.cli` calls `add_operator_commands` while building its parser and `run_operator_command`
before its own commands. Errors follow the CLI's rules: an `OutboxError` (one line, exit 1, as
printed by `outbox.cli.main`), or a usage error (one line on stderr, exit 2).

Each command group is a module of its own: `status` (outbox/cli/status.py, whose docstring
gives the shape of `outbox status --json`), `dead-letters` (dead_letters.py), `log-groups` and
`log-topics` (log_admin.py); what they share is outbox/cli/common.py.
"""

from __future__ import annotations

import argparse

from outbox.cli.dead_letters import _dead_letters, add_dead_letters
from outbox.cli.log_admin import _log_groups, _log_topics, add_log_commands
from outbox.cli.status import _status, add_status


def add_operator_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `status`, `dead-letters`, `log-groups` and `log-topics` commands to the
    `outbox` command's subparsers."""
    add_status(commands)
    add_dead_letters(commands)
    add_log_commands(commands)


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
