"""Push delivery: the callback that POSTs each message of a topic to an HTTP endpoint.

Contract: one message, one POST of a CloudEvent in binary mode (`ce-specversion: 1.0`, `ce-id`
the message id, `ce-type` the topic, `ce-subject` the key, `ce-time` its created-at, `ce-source`
`outbox://<database>`; the message's content type and payload bytes as the request's). A 2xx
answer handles the message; 408, 429, 5xx, a timeout, a refused or broken connection fail the
attempt, retried with the handler's backoff (`RetryLater`: not sooner than a `Retry-After`,
up to the backoff's maximum); any other answer (3xx: redirects are not followed; 4xx) is
`PermanentFailure`, dead at once, with the status and the first `ERROR_BODY_BYTES` of the body.

The delivery is an async callback, so each message is handled in a transaction of its own: a
failure never makes the runner POST the messages before it again. It is at least once: a
message whose POST was answered 2xx but whose transaction then did not commit (a crash, a lost
database) is POSTed again, with the same `ce-id`, which a receiver uses to drop the second.
Only the standard library: http.client on a worker thread, a connection per request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

from outbox.core.envelope import InboxMessage
from outbox.core.errors import ConfigurationError, PermanentFailure, RetryLater
from outbox.core.headers import TRACEPARENT, TRACESTATE
from outbox.core.numbers import check
from outbox.core.redact import remember_secrets

#: Seconds a request may wait on each socket operation (connect, send, each read).
DEFAULT_TIMEOUT = 10.0
#: Requests one delivery has in flight at once, whatever the number of workers.
DEFAULT_CONCURRENCY = 8
#: How much of a failed answer's body the recorded error keeps.
ERROR_BODY_BYTES = 512
#: Statuses a later attempt may get past (besides 5xx).
RETRIED = frozenset({408, 429})
USER_AGENT = "outbox-push/1"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A push endpoint: where to connect, what to ask for, and how to show it."""

    scheme: str
    host: str
    port: int | None
    target: str
    #: The `Authorization` header for credentials given in the URL (Basic), or None.
    authorization: str | None
    #: The URL with its password masked, for logs and errors.
    shown: str


def parse_endpoint(url: object) -> Endpoint:
    """The `Endpoint` of an http:// or https:// URL with a host, else `ConfigurationError`
    naming the URL with any password in it masked."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a push URL must be a non-empty str, got {url!r}")
    parts = urllib.parse.urlsplit(url.strip())
    shown = mask_url(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ConfigurationError(
            f"push URL {shown!r} is not http:// or https:// (scheme {parts.scheme!r})"
        )
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"push URL {shown!r} has an invalid port") from None
    if not parts.hostname:
        raise ConfigurationError(f"push URL {shown!r} names no host")
    if parts.fragment:
        raise ConfigurationError(f"push URL {shown!r} has a #fragment, which HTTP never sends")
    authorization = None
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        # Masked in every log line and error from now on, as written and as sent.
        remember_secrets({s for s in (parts.password, password) if s})
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        authorization = f"Basic {token}"
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return Endpoint(parts.scheme, parts.hostname, port, target, authorization, shown)


def mask_url(url: str) -> str:
    """`url` with the password of its user part (`user:***@host`) masked."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    netloc = f"{user}:***@{hostport}" if ":" in userinfo else f"{user}@{hostport}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def ce_value(value: str | bytes) -> str:
    """A CloudEvents attribute as an HTTP header value: space, `"`, `%` and every byte outside
    printable ASCII percent-encoded (of the UTF-8), as the HTTP binding requires."""
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return "".join(
        chr(b) if 0x21 <= b <= 0x7E and b not in (0x22, 0x25) else f"%{b:02X}" for b in raw
    )


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks to wait (delay-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit also takes '²' (a header's byte 0xB2, read as Latin-1),
    # which float() refuses, and the ValueError made a 503 a dead letter.
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


#: Most header lines of an interim (1xx) answer skipped, as http.client bounds a final one's.
MAX_INTERIM_HEADERS = 100


class _FinalResponse(http.client.HTTPResponse):
    """The final answer past any interim one: http.client skips `100 Continue` only, and read
    a `103 Early Hints` or `102 Processing` before the 2xx as the answer (dead at once)."""

    def _read_status(self) -> tuple[str, int, str]:
        while True:
            # (http.client's own, left out of typeshed: the status line, read once per answer)
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 102 <= status < 200:  # 100 http.client skips; 101 ends HTTP on the socket
                return version, status, reason
            for _ in range(MAX_INTERIM_HEADERS + 1):  # the interim answer's headers
                line = self.fp.readline(65537)
                if line in (b"\r\n", b"\n", b""):
                    break
            else:
                raise http.client.HTTPException(f"an interim {status} answer has too many headers")


class HttpDelivery:
    """The callback of `Handlers.deliver`: POSTs each message to `url` as a CloudEvent."""

    def __init__(
        self,
        topic: str,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        concurrency: int = DEFAULT_CONCURRENCY,
        source: str | None = None,
    ) -> None:
        self.endpoint = parse_endpoint(url)
        check("timeout", timeout, "seconds")
        check("concurrency", concurrency, "threads")
        if source is not None and (not isinstance(source, str) or not source):
            raise ConfigurationError(f"source must be a non-empty str, got {source!r}")
        self.topic = topic
        self.timeout = float(timeout)
        self.source = source
        self._slots = threading.BoundedSemaphore(concurrency)
        #: How the registry and the logs name this callback (never the password).
        self.__qualname__ = f"deliver({topic!r} to {self.endpoint.shown!r})"
        self.__module__ = "outbox"

    async def __call__(self, message: InboxMessage[Any], conn: Any) -> None:
        """POST `message`; return once answered 2xx, else raise what the answer means."""
        source = self.source or _source_of(conn)
        await asyncio.to_thread(self.post, message, source)

    def headers(self, message: InboxMessage[Any], source: str) -> dict[str, str]:
        """The request's headers for `message`: the CloudEvent's attributes and its type."""
        created = message.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        headers = {
            "ce-specversion": "1.0",
            "ce-id": str(message.id),
            "ce-type": ce_value(message.topic),
            "ce-source": ce_value(source),
            "ce-time": created,
            "content-type": message.content_type,
            "user-agent": USER_AGENT,
        }
        if message.key is not None:
            headers["ce-subject"] = ce_value(message.key)
        for name in (TRACEPARENT, TRACESTATE):  # W3C trace context, as tracing sends it
            value = message.headers.get(name)
            if isinstance(value, str) and value.isprintable() and value.isascii():
                headers[name] = value
        if self.endpoint.authorization is not None:
            headers["authorization"] = self.endpoint.authorization
        return headers

    def post(self, message: InboxMessage[Any], source: str) -> None:
        """The blocking POST, at most `concurrency` at once: return on 2xx, else raise."""
        endpoint = self.endpoint
        where = f"POST {endpoint.shown}"
        with self._slots:
            kind = (
                http.client.HTTPSConnection
                if endpoint.scheme == "https"
                else http.client.HTTPConnection
            )
            connection = kind(endpoint.host, endpoint.port, timeout=self.timeout)
            connection.response_class = _FinalResponse
            try:
                connection.request(
                    "POST",
                    endpoint.target,
                    body=message.raw_payload,
                    headers=self.headers(message, source),
                )
                response = connection.getresponse()
                try:
                    status, reason = response.status, response.reason
                    wait = retry_after(response.getheader("retry-after"))
                    body = b""
                    if not 200 <= status < 300:
                        # What the error shows, as far as it can be read: a 2xx's body is not
                        # read at all, so that a broken one (a bad chunk, cut short) does not
                        # make the message, accepted, be sent again or dead.
                        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                            body = response.read(ERROR_BODY_BYTES)
                finally:
                    response.close()  # its socket, when the answer said Connection: close
            except TimeoutError:
                raise RetryLater(f"{where}: no answer within {self.timeout:g} s") from None
            except ValueError as exc:  # a header HTTP cannot carry (a content type with a CR)
                raise PermanentFailure(f"{where}: cannot be sent over HTTP: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                raise RetryLater(f"{where}: {type(exc).__name__}: {exc}") from None
            finally:
                connection.close()
        if 200 <= status < 300:
            return
        text = body.decode("utf-8", "replace")
        answer = f"{where}: HTTP {status} {reason}" + (f": {text}" if text else "")
        if status >= 500 or status in RETRIED:
            raise RetryLater(answer, wait)
        raise PermanentFailure(answer)


def _source_of(conn: Any) -> str:
    """`outbox://<database>` of the handler's connection (psycopg's), else of this host."""
    name = getattr(getattr(conn, "info", None), "dbname", None)
    if not isinstance(name, str) or not name:
        name = socket.gethostname()
    return f"outbox://{name}"
