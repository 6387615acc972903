"""Masking of secrets in what outbox prints: URLs, librdkafka settings, log lines, errors.

Contract: a password given in `--database-url` (URL or key=value form) or a secret
`--kafka-config` setting never reaches a log line, the startup configuration line or a one-line
error. Three layers keep it so: `redact_url` and `redact_settings` mask what outbox formats
itself; `redact_text` masks URL passwords and `key=value` secrets in any text (psycopg and
librdkafka messages echo connection strings); and every secret value outbox was configured with is
remembered (`remember_secrets`) and replaced wherever it appears, even inside a message that
quotes a URL too broken for the patterns.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

#: What a secret is replaced with.
MASK = "***"
#: Words that make a setting's key secret (case-insensitive), e.g. `sasl.password`,
#: `sasl.oauthbearer.client.secret`, `ssl.key.password`, `ssl.keystore.password`.
SECRET_WORDS = ("password", "passwd", "secret", "credential")
#: Settings that hold secrets without saying so in their name.
SECRET_KEYS = frozenset({"ssl.key.pem", "sasl.oauthbearer.config", "sasl.jaas.config"})
#: Remembered secrets shorter than this are masked only by the patterns, not wherever the
#: characters appear (a 2-letter password would otherwise mask every such pair in the logs).
MIN_REMEMBERED = 4

# scheme://user:PASSWORD@host -- the password runs to the last "@" before a "/" or a space.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s?#\"']*:)(?P<secret>[^\s/\"']*)(?=@)"
)
# key=value (libpq keyword form, URL query strings, librdkafka settings) whose key is secret.
_SECRET_ASSIGNMENT = re.compile(
    r"(?P<head>(?<![\w.-])(?P<key>[\w.-]*(?:"
    + "|".join(SECRET_WORDS)
    + r")[\w.-]*)\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&,;\"']+)",
    re.IGNORECASE,
)

_remembered: set[str] = set()
_remembered_lock = threading.Lock()


def is_secret_key(key: str) -> bool:
    """True when a setting called `key` holds a secret (password, secret, key material)."""
    lowered = key.strip().lower()
    return lowered in SECRET_KEYS or any(word in lowered for word in SECRET_WORDS)


def redact_url(url: str) -> str:
    """`url` with its password masked: `postgresql://user:***@host/db`, `password=***`."""
    return _mask_patterns(url)


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of librdkafka-style settings with secret values masked and URLs redacted."""
    return {
        key: MASK
        if is_secret_key(key)
        else (redact_text(value) if isinstance(value, str) else value)
        for key, value in settings.items()
    }


def redact_text(text: str) -> str:
    """`text` with URL passwords, secret `key=value` pairs and remembered secrets masked."""
    text = _mask_patterns(text)
    with _remembered_lock:
        secrets = sorted(_remembered, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def secrets_of_url(url: str) -> set[str]:
    """The passwords written in a database URL or key=value connection string."""
    found: set[str] = set()
    for match in _URL_PASSWORD.finditer(url):
        found.add(match.group("secret"))
    for match in _SECRET_ASSIGNMENT.finditer(url):
        found.add(match.group("secret").strip("'\""))
    # The decoded form too: libpq quotes what it parsed, percent-decoded, in some errors.
    found |= {unquote(secret) for secret in found}
    return {secret for secret in found if secret and secret != MASK}


def secrets_of_settings(settings: Mapping[str, Any]) -> set[str]:
    """The values of the secret settings in `settings`, and passwords in URL values."""
    found: set[str] = set()
    for key, value in settings.items():
        if not isinstance(value, str):
            continue
        if is_secret_key(key):
            found.add(value)
        else:
            found |= secrets_of_url(value)
    return {secret for secret in found if secret}


def remember_secrets(secrets: Iterable[str]) -> None:
    """Mask these values wherever `redact_text` meets them, for the rest of the process."""
    with _remembered_lock:
        _remembered.update(s for s in secrets if len(s) >= MIN_REMEMBERED)


def forget_secrets() -> None:
    """Forget every remembered secret (for tests)."""
    with _remembered_lock:
        _remembered.clear()


def _mask_patterns(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _SECRET_ASSIGNMENT.sub(lambda m: m.group("head") + MASK, text)
