"""The `outbox` command (`outbox.cli:main`, the console script).

- `command`: the parser of every command and `main`, with migrate and the three daemons;
- `arguments`: the flags the commands share, each with its environment variable;
- `operator`: the operator commands `status`, `dead-letters`, `log-groups` and `log-topics`;
- `reference`: docs/reference/configuration.md, generated from the parser.

`outbox console` and `outbox spark` declare their flags in `outbox.cli.console` and
`outbox.cli.spark`; `outbox dev` (local servers for development) in `outbox.cli.dev`.
"""

from outbox.cli.command import build_parser, main

__all__ = ["build_parser", "main"]
