"""Masking of secrets in what outbox prints: URLs, librdkafka settings, log lines, errors.

Contract: a password given in `--database-url` (URL or key=value form) or a secret
`--kafka-config` setting never reaches a log line, the startup configuration line, an HTTP
answer or a one-line error. Which settings are secret is decided by a rule on their names
(`is_secret_key`) and on their values (PEM blocks), never by a list of known settings. Three
layers keep it so: `redact_url` and `redact_settings` mask what outbox formats itself (a URL
libpq cannot parse: from `scheme://user:` to its last "@"); `redact_text` masks URL passwords,
`key=value` secrets and the pieces libpq's parse errors quote in any text (psycopg and
librdkafka messages echo connection strings); and every secret value outbox was configured with
is remembered (`remember_secrets`) and replaced wherever it appears, even inside a message that
quotes a URL too broken for the patterns."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote

#: What a secret is replaced with.
MASK = "***"
#: Parts of a setting's name that say it holds a secret (case-insensitive, anywhere in the name):
#: a rule, not a list of settings, so that a setting librdkafka or libpq adds later
#: (`sasl.oauthbearer.assertion.private.key.passphrase`, `ssl.keystore.password`, `sslkey`) is
#: masked without a change here. Over-masking a path (`ssl.key.location`) is the price.
SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "credential",
    "token",
    "private",
    "key",  # key material: ssl.key.pem, ssl.keystore.*, sasl.kerberos.keytab, *.private.key.*
    "pem",
    "jaas",
    "cookie",
)
#: Settings that carry secrets inside a larger value without a secret word in their name:
#: SASL configuration strings (`sasl.oauthbearer.config`, `sasl.jaas.config`: principals,
#: client secrets, JAAS passwords) and OAuth extensions (`key=value` pairs sent to the broker).
_SECRET_NAME = re.compile(r"^sasl\.(?:.*\.)?config$|(?:^|\.)extensions$")
#: Values that are key material whatever setting holds them (PEM blocks: private keys, and
#: certificates, which are masked with them rather than told apart).
_KEY_MATERIAL = re.compile(r"-----BEGIN [A-Z0-9 ]+-----")
#: Remembered secrets shorter than this are masked only by the patterns, not wherever the
#: characters appear (a 2-letter password would otherwise mask every such pair in the logs).
MIN_REMEMBERED = 4

#: What `redact_url` prints for a connection string libpq cannot parse when it is not a URL
#: (a keyword string): never the string itself. A URL libpq cannot parse is shown with
#: everything from `scheme://user:` to its last "@" masked, and any secret query parameter
#: masked to the end, then `UNPARSEABLE_NOTE`.
UNPARSEABLE = "<unparseable connection string>"
UNPARSEABLE_NOTE = "(libpq cannot parse it)"

# The patterns use ASCII whitespace only (re.ASCII), as libpq does: a no-break space is part of
# a password.
# scheme://user:PASSWORD@host -- the password runs to the last "@" before a "/" or a space.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s?#\"']*:)(?P<secret>[^\s/]*)(?=@)",
    re.ASCII,
)
# In free text a key=value pair is masked when the key reads as a secret setting. A bare "key"
# (a message key, `key=order-1`) is not one there: only a key that says what kind of key it is.
_TEXT_SECRET_WORDS = (
    *(word for word in SECRET_WORDS if word != "key"),
    r"(?:ssl|private|api|access|signing|encryption|secret)[._-]?key",
    "keystore",
    "keytab",
    r"sasl[\w.-]*\.config",
    r"sasl[\w.-]*\.extensions",
)
_SECRET_KEY = r"[\w.-]*(?:" + "|".join(_TEXT_SECRET_WORDS) + r")[\w.-]*"
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
    """True when a setting called `key` holds a secret: its name says so (a word of
    `SECRET_WORDS`: password, passphrase, secret, credential, token, private key, key material,
    PEM, JAAS) or it is a SASL configuration string or OAuth extensions."""
    lowered = key.strip().lower()
    return any(word in lowered for word in SECRET_WORDS) or bool(_SECRET_NAME.search(lowered))


def is_secret_setting(key: str, value: Any) -> bool:
    """True when the setting `key=value` holds a secret: by its name, or because its value is
    key material (a PEM block) whatever the name."""
    return is_secret_key(key) or (isinstance(value, str) and bool(_KEY_MATERIAL.search(value)))


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
        return _redact_unparseable(url)
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
        if is_secret_setting(key, value)
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
    else:
        # libpq cannot parse it: its user info may run past a space or "/" to the last "@".
        found |= _unparseable_secrets(url)
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
        if is_secret_setting(key, value):
            found |= _written_forms(value)
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
    if _CONNINFO_ERROR.search(text):
        text = _mask_conninfo_errors(text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _QUERY_SECRET.sub(lambda m: m.group("head") + MASK, text)
    return _SECRET_ASSIGNMENT.sub(lambda m: m.group("head") + MASK, text)


# A URL's start up to its password: scheme://user: (the user as libpq reads it: to ":" or "@").
_URL_USER = re.compile(r"^\s*[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@?#]*:", re.ASCII)
# A secret query parameter's start, in a URL libpq cannot parse: its value runs to the end.
_QUERY_SECRET_START = re.compile(r"[?&]" + _SECRET_KEY + r"=", re.IGNORECASE | re.ASCII)
_KEYWORD_SECRET_START = re.compile(
    r"(?<![\w.?&-])" + _SECRET_KEY + r"\s*=\s*", re.IGNORECASE | re.ASCII
)


def _redact_unparseable(url: str) -> str:
    """A connection string libpq cannot parse: a URL with its user info masked from
    `scheme://user:` to the last "@" and a secret query parameter masked to the end; any other
    string not at all (`UNPARSEABLE`)."""
    if not re.match(r"^\s*[a-zA-Z][a-zA-Z0-9+.-]*://", url):
        return UNPARSEABLE
    head = _URL_USER.match(url)
    at = url.rfind("@")
    if head is not None and at >= head.end():
        url = url[: head.end()] + MASK + url[at:]
    query = _QUERY_SECRET_START.search(url)
    if query is not None:
        url = url[: query.end()] + MASK
    return f"{_mask_patterns(url.strip())} {UNPARSEABLE_NOTE}"


def _unparseable_secrets(url: str) -> set[str]:
    """What may be a password in a connection string libpq cannot parse: everything from
    `scheme://user:` to the last "@", a secret parameter's value to the end of the string, and
    each of their space-separated pieces (libpq's errors quote pieces)."""
    spans = []
    head = _URL_USER.match(url)
    at = url.rfind("@")
    if head is not None and at >= head.end():
        spans.append(url[head.end() : at])
    # A secret parameter's value (query or keyword form) may run to the end of the string.
    for start in (_QUERY_SECRET_START, _KEYWORD_SECRET_START):
        spans.extend(url[match.end() :] for match in start.finditer(url))
    return {piece for span in spans for piece in (span, *span.split())}


# libpq's (and psycopg's) errors for a connection string they cannot parse quote the piece they
# stumbled on, which may be any part of a password: "missing "=" after "PIECE" in connection
# info string", "unexpected spaces found in "PIECE", use percent-encoded spaces (%20) instead",
# "invalid URI query parameter: "PIECE"", "invalid integer value "PIECE" for connection option
# "port"", "invalid sslmode value: "PIECE"", ... (fe-connect.c). In such a line everything from
# the first quote that is not part of the fixed wording to the last quote is masked.
_CONNINFO_ERROR = re.compile(
    r"connection info string|percent-encoded|in URI\b|URI query parameter|connection option|"
    r"invalid \"?[\w.-]+\"? value: \"",
    re.ASCII,
)
_CONNINFO_WORDING = re.compile(
    r'missing "=" after |matching "\]" |\(expected ":" or "/"\)|separator "=" '
)


def _mask_conninfo_errors(text: str) -> str:
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if not _CONNINFO_ERROR.search(line):
            continue
        # Quotes of the fixed wording are skipped over; the first other quote starts the mask.
        start = 0
        for wording in _CONNINFO_WORDING.finditer(line):
            if '"' in line[start : wording.start()]:
                break
            start = wording.end()
        first = line.find('"', start)
        last = line.rfind('"')
        if first != -1 and last > first:
            lines[index] = f"{line[: first + 1]}{MASK}{line[last:]}"
    return "\n".join(lines)
