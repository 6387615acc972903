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

import json
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote

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

#: What `redact_url` prints for a connection string libpq cannot parse: never the string itself.
UNPARSEABLE = "<unparseable connection string>"

# The patterns use ASCII whitespace only (re.ASCII), as libpq does: a no-break space is part of
# a password.
# scheme://user:PASSWORD@host -- the password runs to the last "@" before a "/" or a space.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s?#\"']*:)(?P<secret>[^\s/]*)(?=@)",
    re.ASCII,
)
_SECRET_KEY = r"[\w.-]*(?:" + "|".join(SECRET_WORDS) + r")[\w.-]*"
# ?password=VALUE or &password=VALUE in a URL's query string: the value runs to "&" or "#".
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&]" + _SECRET_KEY + r"=)(?P<secret>[^&#\s]*)", re.IGNORECASE | re.ASCII
)
# key=value (libpq keyword form, librdkafka settings) whose key is secret: a quoted value, or
# an unquoted one running to the next unescaped space (libpq's own rule). Whatever follows a
# closing quote up to a space is masked too: in a message that escaped the string again (a
# repr), a quote inside the password may look like the closing one.
_UNQUOTED = r"(?:[^\s\\]|\\.)"
_SECRET_ASSIGNMENT = re.compile(
    r"(?P<head>(?<![\w.?&-])(?P<key>"
    + _SECRET_KEY
    + r")\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'?"
    + _UNQUOTED
    + r"*|\"(?:[^\"\\]|\\.)*\"?"
    + _UNQUOTED
    + "*|"
    + _UNQUOTED
    + "+)",
    re.IGNORECASE | re.ASCII,
)
# A SQLAlchemy-style scheme (postgresql+psycopg://), which libpq does not know.
_DRIVER_SCHEME = re.compile(r"^\s*postgres(?:ql)?\+[\w.-]*://", re.IGNORECASE)
#: The order of the well-known keywords in a masked connection string; the others follow.
_FIRST_KEYWORDS = ("host", "hostaddr", "port", "user", "password", "dbname")

_remembered: set[str] = set()
_remembered_lock = threading.Lock()


def is_secret_key(key: str) -> bool:
    """True when a setting called `key` holds a secret (password, secret, key material)."""
    lowered = key.strip().lower()
    return lowered in SECRET_KEYS or any(word in lowered for word in SECRET_WORDS)


def parse_conninfo(conninfo: str) -> dict[str, str] | None:
    """The parameters of a libpq connection string (URL or keyword form), parsed by libpq
    itself; None when libpq cannot parse it. A `postgresql+driver://` scheme is accepted."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    text = _DRIVER_SCHEME.sub("postgresql://", conninfo, count=1)
    try:
        params = conninfo_to_dict(text)
    except (Error, UnicodeError, ValueError, TypeError):
        return None
    return {key: str(value) for key, value in params.items() if value is not None}


def redact_url(url: str) -> str:
    """A database URL or connection string as libpq parses it, in keyword form, with every
    secret parameter (password, sslpassword) masked: `host=db user=app password=*** ...`.

    The string is parsed by libpq's own parser, so no quoting or percent-encoding can hide a
    password from the mask; a string libpq cannot parse is never shown (`UNPARSEABLE`).
    """
    from psycopg.conninfo import make_conninfo

    params = parse_conninfo(url)
    if params is None:
        return UNPARSEABLE
    ordered = {key: params[key] for key in _FIRST_KEYWORDS if key in params}
    ordered.update((key, value) for key, value in params.items() if key not in ordered)
    masked = {key: MASK if is_secret_key(key) else value for key, value in ordered.items()}
    try:
        return make_conninfo("", **masked)
    except Exception:  # a value libpq parsed but cannot write back: show no value at all
        return " ".join(f"{key}={MASK}" for key in masked)


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of librdkafka-style settings with secret values masked and URLs redacted."""
    return {
        key: MASK
        if is_secret_key(key)
        else (redact_text(value) if isinstance(value, str) else value)
        for key, value in settings.items()
    }


def redact_text(text: str) -> str:
    """`text` with every password found masked: remembered secrets (in any of the forms they
    are written in), URL passwords (`scheme://user:***@host`), secret query parameters
    (`?password=***`) and secret `key=value` pairs, quoted or not (`password=***`)."""
    with _remembered_lock:
        secrets = sorted(_remembered, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return _mask_patterns(text)


def secrets_of_url(url: str) -> set[str]:
    """The passwords of a database URL or key=value connection string, in every form they may
    be printed in: as libpq parsed them, as written, percent-encoded, quoted and escaped."""
    found: set[str] = set()
    params = parse_conninfo(url)
    if params is not None:
        found |= {value for key, value in params.items() if is_secret_key(key)}
    # As written (also when libpq cannot parse the string, whose errors may quote it).
    for match in _URL_PASSWORD.finditer(url):
        found.add(match.group("secret"))
    for match in _QUERY_SECRET.finditer(url):
        found.add(match.group("secret"))
    for match in _SECRET_ASSIGNMENT.finditer(url):
        written = match.group("secret")
        found.add(written)
        found.add(written.strip("'\""))
    return {form for secret in found for form in _written_forms(secret) if form and form != MASK}


def _written_forms(secret: str) -> set[str]:
    """`secret` and the forms a message may show it in: percent-decoded and -encoded, libpq
    keyword-quoted, Python repr and JSON escaped."""
    forms = {secret, unquote(secret)}
    for plain in list(forms):
        forms.add(quote(plain, safe=""))
        forms.add(quote(plain))
        escaped = plain.replace("\\", "\\\\").replace("'", "\\'")
        forms.add(escaped)
        forms.add(f"'{escaped}'")
        forms.add(repr(plain)[1:-1])
        forms.add(json.dumps(plain)[1:-1])
        forms.add(json.dumps(plain, ensure_ascii=False)[1:-1])
    return forms


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
    text = _QUERY_SECRET.sub(lambda m: m.group("head") + MASK, text)
    return _SECRET_ASSIGNMENT.sub(lambda m: m.group("head") + MASK, text)
