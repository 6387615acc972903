"""The console's HTTP face: a Starlette application served by uvicorn, the stack of
`outbox serve` (docs/decisions/0014-console-server.md).

What each request may do is decided by `outbox.console.server` (`Console.exchange`: the Host,
the token, the origin and CSRF token, then the answer); this module carries requests to it and
answers back, and holds the bounds of the connections:

- at most `workers + queued` connections are open at once; one more is answered 503 with
  `Retry-After` as soon as it is accepted, before anything is read, and closed;
- a connection that has not sent a whole request head within `socket_timeout` seconds (a new
  one, or one kept alive after an answer) is closed, and so is one that reads nothing of its
  answer for `socket_timeout` seconds;
- a body is read only for a POST that passed the checks, with one decimal Content-Length of
  at most `max_body_bytes` (400 otherwise, 413 above, 411 for a chunked one), and must arrive
  within `socket_timeout` seconds (408);
- the answers, which read the databases, run in at most `workers` threads at once, never on
  the event loop.

This module imports Starlette and uvicorn (the `console` extra); `outbox.console.server`
imports it only when a console starts, after `require_extra`.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio
import anyio.to_thread
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

_CONTENT_LENGTH_RE = re.compile(r"[0-9]{1,18}")
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class Answered(Protocol):
    """An answer of the console (`outbox.console.server.Answer`)."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def body(self) -> bytes: ...


class Exchange(Protocol):
    """The console's side of one request (`outbox.console.server._Exchange`)."""

    def check(self) -> Answered | None: ...
    def answer(self, body: bytes) -> Answered: ...
    def refuse(self, status: int, message: str) -> Answered: ...


class Served(Protocol):
    """What this module serves (`outbox.console.server.Console`)."""

    def exchange(self, method: str, target: str, headers: Sequence[tuple[str, str]]) -> Any: ...


def create_app(
    console: Served, *, workers: int, body_timeout: float, max_body_bytes: int
) -> Starlette:
    """The ASGI application of `console`: every path and method goes to its `exchange`."""
    limiters: list[anyio.CapacityLimiter] = []

    async def endpoint(request: Request) -> Response:
        scope = request.scope
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        exchange: Exchange = console.exchange(request.method, target, headers)
        refused = exchange.check()
        if refused is not None:
            # The body (if any) was not read: the connection cannot carry another request.
            return _response(refused, close=request.method == "POST")
        body = b""
        if request.method == "POST":
            body, refused = await _body(request, exchange, max_body_bytes, body_timeout)
            if refused is not None:
                return _response(refused, close=True)
        if not limiters:  # made on the event loop, as anyio wants
            limiters.append(anyio.CapacityLimiter(workers))
        answer = await anyio.to_thread.run_sync(exchange.answer, body, limiter=limiters[0])
        return _response(answer)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=_METHODS)])


async def _body(
    request: Request, exchange: Exchange, max_bytes: int, timeout: float
) -> tuple[bytes, Answered | None]:
    """The body of a POST, or the refusal of it."""
    headers = request.headers
    if "transfer-encoding" in headers:
        return b"", exchange.refuse(411, "send the body with a Content-Length")
    given = headers.getlist("content-length")
    if not given:
        return b"", None
    # uvicorn's parser (h11) already refused a malformed Content-Length, and differing
    # repeated ones, with 400; it passes identical repeated ones as one (RFC 9110, 8.6).
    if len(given) > 1 or not _CONTENT_LENGTH_RE.fullmatch(given[0].strip()):
        return b"", exchange.refuse(400, "Content-Length must be one number of bytes (0 or more)")
    if int(given[0]) > max_bytes:
        return b"", exchange.refuse(413, f"request body too large: at most {max_bytes} bytes")
    chunks: list[bytes] = []
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                chunks.append(chunk)
    except TimeoutError:
        return b"", exchange.refuse(408, "the request body did not come")
    except ClientDisconnect:
        return b"", exchange.refuse(400, "the request body is shorter than announced")
    return b"".join(chunks), None


def _response(answer: Answered, *, close: bool = False) -> Response:
    response = Response(status_code=answer.status)
    # The console's headers as they are (a HEAD's Content-Length is its GET's).
    response.raw_headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers
    ]
    if close:
        response.raw_headers.append((b"connection", b"close"))
    response.body = answer.body
    return response


def _protocol(limit: int, timeout: float, busy: Callable[[], bytes]) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11), with the console's bounds on connections: more than
    `limit` open at once are answered `busy()` at once, and one without a whole request head
    `timeout` seconds after it opened or after its last answer is closed (uvicorn bounds the
    time between requests only, not a head that never ends), and so is one that reads nothing
    of its answer for `timeout` seconds."""

    class Bounded(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limit:
                transport.write(busy())
                transport.close()
                return
            self._expect_request()

        def pause_writing(self) -> None:
            super().pause_writing()
            # The client reads nothing of the answer: cut it off after `timeout`.
            self._stalled = self.loop.call_later(timeout, self._cut_off)

        def resume_writing(self) -> None:
            super().resume_writing()
            stalled = getattr(self, "_stalled", None)
            if stalled is not None:
                stalled.cancel()

        def _cut_off(self) -> None:
            if self.flow.write_paused:
                self.transport.abort()  # close() would wait for the unread answer

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._expect_request()

        def _expect_request(self) -> None:
            self.loop.call_later(timeout, self._expired, self.cycle)

        def _expired(self, cycle: Any) -> None:
            # No request came since (its cycle is the one seen then), and none is in flight.
            if self.transport.is_closing() or self.cycle is not cycle:
                return
            if cycle is None or cycle.response_complete:
                self.transport.close()

    return Bounded


def server(
    console: Served,
    *,
    workers: int,
    queued: int,
    socket_timeout: float,
    max_body_bytes: int,
    busy: Callable[[], bytes],
) -> uvicorn.Server:
    """The uvicorn server of `console` (run it with `run(sockets=[...])`, stop it with
    `should_exit = True`); it installs no signal handler outside the main thread."""
    app = create_app(
        console, workers=workers, body_timeout=socket_timeout, max_body_bytes=max_body_bytes
    )
    return uvicorn.Server(
        uvicorn.Config(
            app,
            http=_protocol(workers + queued, socket_timeout, busy),
            ws="none",
            lifespan="off",
            timeout_keep_alive=max(1, math.ceil(socket_timeout)),
            timeout_graceful_shutdown=5,
            # The process's logging is the application's (or the CLI's): uvicorn's is not set.
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
        )
    )
