"""The settings of `outbox serve` beside the composition root's `Settings`: where it listens,
who may call it, and its bounds."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from outbox.core.errors import ConfigurationError
from outbox.core.numbers import check_fields
from outbox.http.tokens import Token, read_tokens

#: The port `outbox serve` listens on unless told (`--port`).
DEFAULT_PORT = 8480


@dataclass(frozen=True)
class ServeConfig:
    """How `outbox serve` listens and what it bounds (docs/http.md)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    #: The bearer tokens accepted (`read_tokens` of `--tokens-file`); none: no token asked,
    #: which only a loopback `host` may be.
    tokens: tuple[Token, ...] = field(default=(), repr=False)
    #: MODULE[:ATTRIBUTE] whose Topics validate the payloads of their topics (`--registry`).
    registry: str | None = None
    #: Largest request body, in bytes: a larger one is refused with 413 before it is read.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Seconds a client has to send its request body (a slow one gets 408).
    body_timeout: float = 10.0
    #: Longest long poll of `next` (`wait_ms` is cut to it), in seconds.
    max_wait: float = 30.0
    #: Seconds the records of a `next` stay leased to its client unless `lease_ms` says.
    lease: float = 30.0
    #: Seconds a message id given to a publish is remembered (a retry within it writes nothing).
    idempotency_window: float = 7 * 24 * 3600.0
    #: Connections per database.
    pool_size: int = 8

    def __post_init__(self) -> None:
        check_fields(
            self,
            {
                "port": "port",
                "max_body_bytes": "count",
                "body_timeout": "seconds",
                "max_wait": "seconds",
                "lease": "seconds",
                "idempotency_window": "seconds",
                "pool_size": "threads",
            },
        )
        if not self.tokens and not is_loopback(self.host):
            raise ConfigurationError(
                f"outbox serve binds {self.host!r}, reachable from other machines, without "
                "tokens: give --tokens-file (or OUTBOX_SERVE_TOKENS_FILE), or bind 127.0.0.1"
            )

    @classmethod
    def of(cls, *, tokens_file: str | None = None, **fields: object) -> ServeConfig:
        """The config with the tokens of `tokens_file` (None: no tokens; an empty path is
        refused, never read as none: `--tokens-file "$UNSET"` must not open the server)."""
        tokens = read_tokens(tokens_file) if tokens_file is not None else ()
        return cls(tokens=tokens, **fields)  # type: ignore[arg-type]


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
