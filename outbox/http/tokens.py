"""The bearer tokens of `outbox serve`: read from a file, `SCOPE[,SCOPE] TOKEN` a line, and
found in constant time. A token is never printed: errors name the file and the line number."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from outbox.core.errors import ConfigurationError

#: The scopes a token may have: publish messages; read subscriptions and inbox work; manage
#: topics (admin also has the other two).
SCOPES = ("publish", "consume", "admin")
#: Shortest token accepted: a guessable one is refused at start.
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class Token:
    """One accepted token and its scopes (the secret is left out of the repr)."""

    scopes: frozenset[str]
    secret: bytes = field(repr=False)

    def allows(self, scope: str) -> bool:
        """Whether this token may do what `scope` names."""
        return scope in self.scopes or "admin" in self.scopes


def parse_tokens(text: str, where: str) -> tuple[Token, ...]:
    """The tokens of a tokens file's `text` (`where` names it in errors): one `SCOPE[,SCOPE]
    TOKEN` a line, `#` comments and blank lines skipped. A bad line raises ConfigurationError
    naming its number, never its token."""
    tokens: list[Token] = []
    seen: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split()
        at = f"{where} line {number}"
        if len(parts) != 2:
            raise ConfigurationError(
                f"{at}: expected `SCOPE[,SCOPE] TOKEN` (two fields separated by spaces), got "
                f"{len(parts)} field(s)"
            )
        scopes = [s.strip() for s in parts[0].split(",")]
        unknown = [s for s in scopes if s not in SCOPES]
        if unknown or not scopes:
            raise ConfigurationError(
                f"{at}: unknown scope {unknown[0] if unknown else ''!r}: the scopes are "
                f"{', '.join(SCOPES)}"
            )
        if not (parts[1].isascii() and parts[1].isprintable()):
            raise ConfigurationError(
                f"{at}: the token has a character other than printable ASCII, which no "
                "`Authorization: Bearer` header sends as written: use a random one (e.g. "
                "`openssl rand -hex 32`)"
            )
        secret = parts[1].encode()
        if len(secret) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"{at}: the token is shorter than {MIN_TOKEN_LENGTH} characters: use a random "
                "one (e.g. `openssl rand -hex 32`)"
            )
        if secret in seen:
            raise ConfigurationError(f"{at}: the token of an earlier line again")
        seen.add(secret)
        tokens.append(Token(frozenset(scopes), secret))
    if not tokens:
        raise ConfigurationError(f"{where} holds no token")
    return tuple(tokens)


def read_tokens(path: str) -> tuple[Token, ...]:
    """The tokens of the file at `path` (`parse_tokens`); ConfigurationError if unreadable."""
    if not path:
        raise ConfigurationError("the tokens file is an empty path: give the file's path")
    try:
        # utf-8-sig: a byte order mark (an editor's on Windows) is not part of the first scope.
        with open(path, encoding="utf-8-sig") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(
            f"cannot read the tokens file {path!r}: {type(exc).__name__}"
        ) from None
    return parse_tokens(text, f"tokens file {path!r}")


def find(tokens: tuple[Token, ...], presented: str) -> Token | None:
    """The token `presented` is, compared with every token in constant time (no early exit,
    so the time does not say how many tokens come before the match)."""
    given = presented.encode()
    found: Token | None = None
    for token in tokens:
        if hmac.compare_digest(token.secret, given):
            found = token
    return found
