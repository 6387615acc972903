"""The FastAPI application of `outbox serve`: the resources of docs/http.md over a `Service`.

Every error is a JSON object `{"error": "..."}` with its status: 400 malformed JSON or a
missing choice, 401/403 tokens, 404, 408 a body sent too slowly, 409, 413 a body too large
(refused from its Content-Length before it is read, or as soon as it grows past the bound),
415 a body not sent as JSON, 422 a value refused, 501 topics on a transport other than the
log, 503 a database down.
"""

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, Protocol, TypeVar
from uuid import UUID

import anyio.to_thread
from fastapi import Depends, FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from outbox import __version__
from outbox.core.redact import redact_text
from outbox.core.schedule import MAX_DELAY
from outbox.core.text import first_line
from outbox.http.service import Outgoing, Refused, Service
from outbox.http.tokens import find

log = logging.getLogger("outbox.serve")

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Seconds an inbox's listener keeps listening after its last long poll (then its session is
#: closed; the next long poll of that inbox opens one again).
INBOX_LISTEN_IDLE = 120.0
#: Seconds between two attempts to listen again after a failure, at most.
LISTEN_RETRY_MAX = 30.0
#: Longest wait of a subscription's long poll between two looks: a wake-up from the log's
#: appends (LISTEN/NOTIFY) normally ends it first; this covers one missed while reconnecting.
WAKE_FALLBACK = 0.5
#: Seconds between two passes forgetting message ids older than the idempotency window.
FORGET_INTERVAL = 300.0


# -- request and answer bodies ----------------------------------------------------------------


class MessageIn(BaseModel):
    """One message to publish: the fields of `Broker.send`."""

    model_config = ConfigDict(extra="forbid")

    payload: Any = Field(description="the message's JSON value (a typed topic's, validated)")
    key: str | None = Field(None, description="the key: the partition, and the order kept")
    headers: dict[str, str] | None = Field(None, description="headers (names not `outbox-*`)")
    message_id: UUID | None = Field(
        None, description="the idempotency key: a message id published before writes nothing"
    )
    tenant: str | None = Field(None, description="the tenant (database NAME) whose inbox gets it")
    deliver_at: datetime | None = Field(
        None,
        description="when the message is due, an ISO 8601 time with its offset (one already past "
        "means now); it leaves the outbox then, not before",
    )
    delay_ms: int | None = Field(
        None,
        ge=0,
        le=MAX_DELAY // timedelta(milliseconds=1),
        description="or: due this many milliseconds after the database's now (not with deliver_at)",
    )


class Published(BaseModel):
    """The ids of the messages of a publish, in the order given."""

    message_ids: list[str]


class TopicIn(BaseModel):
    """A topic to create in the log."""

    model_config = ConfigDict(extra="forbid")

    name: str
    partitions: int | None = Field(None, description="default: the server's --log-partitions")


class SubscribeIn(BaseModel):
    """Where a new subscription starts."""

    model_config = ConfigDict(extra="forbid")

    start: Literal["latest", "earliest"] = "latest"


class AckIn(BaseModel):
    """The cursor of the records to acknowledge."""

    model_config = ConfigDict(extra="forbid")

    cursor: UUID


class LeaseIn(BaseModel):
    """Inbox rows to lease."""

    model_config = ConfigDict(extra="forbid")

    topics: list[str] = Field(min_length=1)
    max: int = Field(10, ge=1, le=1000)
    wait_ms: int = Field(0, ge=0)
    lease_ms: int = Field(30_000, ge=1, le=3_600_000)


class InboxAckIn(BaseModel):
    """Inbox rows handled."""

    model_config = ConfigDict(extra="forbid")

    ids: list[int] = Field(min_length=1, max_length=10_000)


class NackIn(BaseModel):
    """An inbox row whose handling failed."""

    model_config = ConfigDict(extra="forbid")

    id: int
    error: str = Field(min_length=1)
    retry_after_ms: int | None = Field(None, ge=0, le=86_400_000)


class Problem(BaseModel):
    """An error: its one-line message."""

    error: str


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem} for status in (400, 401, 403, 404, 409, 413, 415, 422, 501, 503)
}


# -- the application --------------------------------------------------------------------------


def create_app(service: Service) -> FastAPI:
    """The application serving `service`."""
    config = service.config
    counts: Counter[tuple[str, str, int]] = Counter()
    handed: Counter[str] = Counter()

    bell = Bell()
    inbox_bells = InboxBells(service)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        task = asyncio.create_task(_forget_old_ids(service))
        loop = asyncio.get_running_loop()
        bell.start(loop)
        inbox_bells.start(loop)
        stop = threading.Event()
        listener = threading.Thread(
            target=_listen,
            args=(service.wakeups, bell, stop, "the log's appends", lambda: True),
            name="outbox-serve-wakeups",
            daemon=True,
        )
        listener.start()
        try:
            yield
        finally:
            task.cancel()
            stop.set()
            inbox_bells.stop()
            await anyio.to_thread.run_sync(lambda: listener.join(5))
            await anyio.to_thread.run_sync(lambda: inbox_bells.join(5))
            await anyio.to_thread.run_sync(service.close)

    app = FastAPI(
        title="outbox serve",
        version=__version__,
        description="Topics, publish and subscriptions over HTTP (docs/http.md).",
        lifespan=lifespan,
        responses=ERRORS,
    )
    bearer = HTTPBearer(auto_error=False, description="a token of --tokens-file")

    def allowed(scope: str) -> Callable[..., None]:
        def check(
            credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
        ) -> None:
            if not config.tokens:
                return
            if credentials is None:
                raise Refused(401, "this server needs `Authorization: Bearer TOKEN`")
            token = find(config.tokens, credentials.credentials)
            if token is None:
                raise Refused(401, "the token is not one of this server's")
            if not token.allows(scope):
                raise Refused(403, f"the token has no {scope} scope")

        return check

    publish = [Depends(allowed("publish"))]
    consume = [Depends(allowed("consume"))]
    admin = [Depends(allowed("admin"))]

    async def run(work: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(work)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(Exception)
    async def unforeseen(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        said = redact_text(f"unexpected {type(exc).__name__}: {first_line(exc)}")
        return JSONResponse({"error": said}, status_code=500)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI's "There was an error parsing the body": JSON whose bytes are not UTF-8,
            # or a number too long to read; say which.
            said = redact_text(first_line(exc.__cause__))
            return JSONResponse(
                {"error": f"malformed JSON: {said}; nothing was stored"}, status_code=400
            )
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        given = request.headers.get("content-type")
        if not _is_json(given) and any(tuple(e.get("loc", ()))[:1] == ("body",) for e in errors):
            # The body was not read as JSON at all (fetch sends a string as text/plain, curl -d
            # as a form): say so, rather than that the JSON sent is not an object. Read as JSON
            # only when it says so, so that a web page cannot post here without a preflight.
            return JSONResponse(
                {
                    "error": "send the body as JSON with `Content-Type: application/json` (got "
                    f"{'none' if not given else repr(given[:100])}); nothing was stored"
                },
                status_code=415,
            )
        for error in errors:
            if error.get("type") == "json_invalid":
                reason = error.get("ctx", {}).get("error", "not JSON")
                return JSONResponse(
                    {"error": f"malformed JSON: {reason}; nothing was stored"}, status_code=400
                )
        said = "; ".join(_said(e) for e in _shaped(errors)[:5])
        return JSONResponse({"error": f"{said}; nothing was stored"}, status_code=422)

    # The last added is the outermost: every answer is counted, the bounds' own too.
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, timeout=config.body_timeout)
    app.add_middleware(Counted, counts=counts)

    # -- health ---------------------------------------------------------------------------------

    @app.get("/livez", include_in_schema=False)
    async def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        found = await run(service.ready)
        ok = all(v == "ok" for v in found.values())
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", "checks": found},
            status_code=200 if ok else 503,
        )

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> PlainTextResponse:
        lines = [
            "# HELP outbox_serve_requests_total Requests answered, by method, route and status.",
            "# TYPE outbox_serve_requests_total counter",
        ]
        for (method, path, status), n in sorted(counts.items()):
            lines.append(
                f'outbox_serve_requests_total{{method="{method}",route="{path}",'
                f'status="{status}"}} {n}'
            )
        lines += [
            "# HELP outbox_serve_messages_total Messages published and records handed out.",
            "# TYPE outbox_serve_messages_total counter",
        ]
        for what, n in sorted(handed.items()):
            lines.append(f'outbox_serve_messages_total{{what="{what}"}} {n}')
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    # -- topics ---------------------------------------------------------------------------------

    @app.get("/v1/topics", dependencies=consume, tags=["topics"])
    async def list_topics() -> dict[str, Any]:
        """The topics of the log."""
        return {"topics": await run(service.topics)}

    @app.post("/v1/topics", status_code=201, dependencies=admin, tags=["topics"])
    async def create_topic(body: TopicIn) -> dict[str, Any]:
        """Create a topic (409 if it exists)."""
        return await run(lambda: service.create_topic(body.name, body.partitions))

    @app.get("/v1/topics/{topic}", dependencies=consume, tags=["topics"])
    async def topic(topic: str) -> dict[str, Any]:
        """A topic's partitions with their end offsets, and its subscriptions with their lag."""
        return await run(lambda: service.topic(topic))

    @app.post(
        "/v1/topics/{topic}/messages",
        status_code=201,
        dependencies=publish,
        tags=["publish"],
        responses={200: {"model": Published, "description": "every id was published before"}},
    )
    async def publish_messages(
        topic: str,
        body: MessageIn | list[MessageIn],
        response: Response,
        database: Annotated[str | None, Query(description="the outbox's NAME")] = None,
    ) -> Published:
        """Write messages to the outbox in one transaction (201 once committed)."""
        items = body if isinstance(body, list) else [body]
        if not items:
            raise Refused(422, "no message to publish: give an object or a non-empty array")
        outgoing = [
            Outgoing(
                m.payload,
                m.key,
                m.headers,
                m.message_id,
                m.tenant,
                m.deliver_at,
                None if m.delay_ms is None else timedelta(milliseconds=m.delay_ms),
            )
            for m in items
        ]
        written, ids = await run(lambda: service.publish(topic, outgoing, database))
        if written:
            handed["published"] += len(ids)
        else:
            response.status_code = 200
        return Published(message_ids=ids)

    # -- subscriptions --------------------------------------------------------------------------

    base = "/v1/topics/{topic}/subscriptions/{name}"

    @app.put(base, dependencies=consume, tags=["subscriptions"])
    async def subscribe(
        topic: str, name: str, response: Response, body: SubscribeIn | None = None
    ) -> dict[str, Any]:
        """Subscribe from now (`latest`) or from the earliest record kept; 201 when made."""
        start = body.start if body is not None else "latest"
        made = await run(lambda: service.subscribe(topic, name, start))
        response.status_code = 201 if made else 200
        return {"topic": topic, "name": name, "created": made}

    @app.get(base, dependencies=consume, tags=["subscriptions"])
    async def subscription(topic: str, name: str) -> dict[str, Any]:
        """The subscription's position and lag per partition, and in all."""
        return await run(lambda: service.lag(topic, name))

    @app.delete(base, status_code=204, dependencies=consume, tags=["subscriptions"])
    async def unsubscribe(topic: str, name: str) -> Response:
        """Forget the subscription: its place is lost."""
        await run(lambda: service.unsubscribe(topic, name))
        return Response(status_code=204)

    @app.get(
        base + "/next",
        dependencies=consume,
        tags=["subscriptions"],
        responses={204: {"description": "no record within wait_ms"}},
    )
    async def next_records(
        request: Request,
        topic: str,
        name: str,
        max: Annotated[int, Query(ge=1, le=1000)] = 100,
        wait_ms: Annotated[int, Query(ge=0)] = 0,
        lease_ms: Annotated[int | None, Query(ge=1, le=3_600_000)] = None,
        ack: Literal["manual", "auto"] = "manual",
    ) -> Response:
        """The next records at the subscription's position, leased to this client until
        acknowledged (or `ack=auto`: acknowledged at once); 204 when none came in wait_ms."""
        lease = config.lease if lease_ms is None else lease_ms / 1000
        deadline = time.monotonic() + _wait(wait_ms, config.max_wait)
        while True:
            rung = bell.current()  # taken before the look: an append meanwhile rings it
            records, cursor = await run(
                lambda: service.next(topic, name, max, lease, ack == "auto")
            )
            if records:
                handed["handed_out"] += len(records)
                return JSONResponse({"records": records, "cursor": cursor})
            left = deadline - time.monotonic()
            if left <= 0 or await request.is_disconnected():
                return Response(status_code=204)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rung.wait(), min(WAKE_FALLBACK, left))

    @app.post(base + "/ack", dependencies=consume, tags=["subscriptions"])
    async def ack_records(topic: str, name: str, body: AckIn) -> dict[str, Any]:
        """Acknowledge the records of a cursor: the subscription's position moves past them."""
        await run(lambda: service.ack(topic, name, str(body.cursor)))
        return {"acked": True}

    # -- inbox work for handlers in other languages ----------------------------------------------

    @app.post("/v1/inbox/lease", dependencies=consume, tags=["inbox"])
    async def lease_inbox(
        request: Request,
        body: LeaseIn,
        database: Annotated[str | None, Query(description="the inbox's NAME")] = None,
    ) -> Response:
        """Lease the next rows of the topics, one per key at a time; 204 when none came."""
        deadline = time.monotonic() + _wait(body.wait_ms, config.max_wait)
        rung: asyncio.Event | None = None
        while True:
            rows = await run(
                lambda: service.lease(body.topics, body.max, body.lease_ms / 1000, database)
            )
            if rows:
                handed["inbox_leased"] += len(rows)
                return JSONResponse({"messages": rows})
            left = deadline - time.monotonic()
            if left <= 0 or await request.is_disconnected():
                return Response(status_code=204)
            if rung is None:  # the first empty look: listen, and look once more before waiting
                rung = inbox_bells.current(service.database(database).name)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rung.wait(), min(WAKE_FALLBACK, left))
            rung = inbox_bells.current(service.database(database).name)

    @app.post("/v1/inbox/ack", dependencies=consume, tags=["inbox"])
    async def ack_inbox(
        body: InboxAckIn,
        database: Annotated[str | None, Query(description="the inbox's NAME")] = None,
    ) -> dict[str, Any]:
        """Mark rows handled; `unknown`: ids that were not pending (handled, dead or none)."""
        unknown = await run(lambda: service.ack_inbox(body.ids, database))
        return {"acked": len(body.ids) - len(unknown), "unknown": unknown}

    @app.post("/v1/inbox/nack", dependencies=consume, tags=["inbox"])
    async def nack_inbox(
        body: NackIn,
        database: Annotated[str | None, Query(description="the inbox's NAME")] = None,
    ) -> dict[str, Any]:
        """A failed attempt: retried after retry_after_ms (else the topic's backoff), or dead
        once the topic's max attempts are spent."""
        retry_after = None if body.retry_after_ms is None else body.retry_after_ms / 1000
        return await run(lambda: service.nack_inbox(body.id, body.error, retry_after, database))

    return app


def _is_json(content_type: str | None) -> bool:
    """Whether a request's Content-Type is one FastAPI reads as JSON (application/json or
    application/*+json, any parameters)."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _wait(wait_ms: int, most: float) -> float:
    """The seconds a long poll asked to wait `wait_ms` waits: at most `most` (a `wait_ms` of
    any size, even past a float's range, is cut to it)."""
    return min(wait_ms, int(most * 1000)) / 1000


#: The shapes a body may take where one object or an array of them is accepted (pydantic names
#: a union's branches in an error's location).
_BRANCH_SHAPE_ERRORS = frozenset({"list_type", "model_attributes_type", "dict_type", "model_type"})


def _shaped(errors: Sequence[Any]) -> list[Any]:
    """The errors of the branch of a union the body took (one object, or an array): "the body
    is not a list" is noise beside a field's error of the object sent, and the other way round."""
    fields = [e for e in errors if not _branch_mismatch(e)]
    return fields or list(errors)


def _branch_mismatch(error: Any) -> bool:
    loc = tuple(error.get("loc", ()))
    return len(loc) == 2 and loc[0] == "body" and error.get("type") in _BRANCH_SHAPE_ERRORS


def _said(error: Any) -> str:
    """One error as `message N: field.path: what is wrong` (`message N` in an array body)."""
    loc = list(error.get("loc", ()))
    if loc[:1] == ["body"]:
        loc.pop(0)
    prefix = ""
    if loc and isinstance(loc[0], str) and loc[0].startswith("list["):  # the array branch
        loc.pop(0)
        if loc and isinstance(loc[0], int):
            prefix = f"message {loc.pop(0)}: "
    elif loc and loc[0] == "MessageIn":  # the object branch
        loc.pop(0)
    where = ".".join(str(part) for part in loc)
    message = str(error.get("msg", "invalid"))
    return prefix + (f"{where}: {message}" if where else message)


class Bell:
    """Rung from the listener thread on each append to the log; a long poll waits on the event
    it took before its look, so that an append between the look and the wait is not missed."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current(self) -> asyncio.Event:
        return self._event

    def ring_soon(self) -> None:
        """Ring from another thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._ring)

    def _ring(self) -> None:
        rung, self._event = self._event, asyncio.Event()
        rung.set()


class Wakeups(Protocol):
    """A session listening for notifications (`outbox.pglog.subscriptions.Wakeups`,
    `outbox.postgres.inbox_leases.InboxWakeups`)."""

    def wait(self, timeout: float) -> bool: ...

    def close(self) -> None: ...


def _listen(
    open_wakeups: Callable[[], Wakeups | None],
    bell: Bell,
    stop: threading.Event,
    what: str,
    wanted: Callable[[], bool],
) -> None:
    """A listener thread: ring `bell` on each notification of `what` while `wanted()`,
    listening again after a failure with a growing pause (the long polls look every
    WAKE_FALLBACK seconds meanwhile). A failure is logged when it starts or changes, and the
    recovery once: an outage costs a few lines, not one a second."""
    said: str | None = None
    pause = 1.0
    while not stop.is_set() and wanted():
        try:
            wakeups = open_wakeups()
        except Exception as exc:
            message = redact_text(first_line(exc))
            if message != said:
                log.warning("listening for %s failed: %s (trying again)", what, message)
            said = message
            stop.wait(pause)
            pause = min(pause * 2, LISTEN_RETRY_MAX)
            continue
        if wakeups is None:
            return
        if said is not None:
            log.info("listening for %s again", what)
            said, pause = None, 1.0
        try:
            while not stop.is_set() and wanted():
                if wakeups.wait(0.5):
                    bell.ring_soon()
        except Exception as exc:
            message = redact_text(first_line(exc))
            if message != said:
                log.warning("listening for %s failed: %s (trying again)", what, message)
            said = message
            stop.wait(pause)
        finally:
            with contextlib.suppress(Exception):
                wakeups.close()


class InboxBells:
    """A bell per inbox database, rung on each row the Consumer stores there while long polls
    of `/v1/inbox/lease` ask for that database: its listener thread (one session, listed as
    a 'serve' process) starts at the first long poll and ends INBOX_LISTEN_IDLE seconds after
    the last, so a server over hundreds of databases listens only where clients wait."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._bells: dict[str, Bell] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._used: dict[str, float] = {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current(self, name: str) -> asyncio.Event:
        """The event the next store in database `name` sets (on the event loop's thread)."""
        self._used[name] = time.monotonic()
        bell = self._bells.get(name)
        if bell is None:
            bell = self._bells[name] = Bell()
            if self._loop is not None:
                bell.start(self._loop)
        thread = self._threads.get(name)
        if (thread is None or not thread.is_alive()) and not self._stop.is_set():
            target = self.service.database(name)

            def wanted() -> bool:
                return time.monotonic() - self._used.get(name, 0.0) < INBOX_LISTEN_IDLE

            thread = threading.Thread(
                target=_listen,
                args=(
                    lambda: self.service.inbox_wakeups(target.name),
                    bell,
                    self._stop,
                    f"rows stored in the inbox of {target.name}",
                    wanted,
                ),
                name=f"outbox-serve-inbox-{target.name}"[:60],
                daemon=True,
            )
            self._threads[name] = thread
            thread.start()
        return bell.current()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        for thread in list(self._threads.values()):
            thread.join(timeout)


async def _forget_old_ids(service: Service) -> None:
    """Forget the message ids older than the idempotency window, every few minutes."""
    while True:
        try:
            await anyio.to_thread.run_sync(service.forget_old_ids)
        except Exception as exc:  # the next pass tries again
            log.warning("forgetting old message ids failed: %s", exc)
        await asyncio.sleep(FORGET_INTERVAL)


class Counted:
    """Counts the answers by method, route and status (`/metrics`), as plain ASGI middleware
    (Starlette's BaseHTTPMiddleware costs a task and a stream per request)."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        counts: Counter[tuple[str, str, int]],
    ) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            route = scope.get("route")
            self.counts[(scope["method"], getattr(route, "path", "other"), status[0])] += 1


# -- bounds -----------------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


class BodyLimit:
    """Refuses a request body larger than `max_bytes` (413: from its Content-Length before
    reading it, or once the bytes read pass the bound) and one not fully sent within `timeout`
    seconds (408), so that neither a large nor a slow client holds the server."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        max_bytes: int,
        timeout: float,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                await _answer(send, 400, "Content-Length is not a number")
                return
            if size > self.max_bytes:
                await _answer(send, 413, self._too_large())
                return
        state: dict[str, Any] = {"read": 0, "done": False, "refused": None, "started": False}

        async def bounded() -> Message:
            if state["done"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except TimeoutError:
                state["refused"] = (408, f"the request body took over {self.timeout:g} s to send")
                raise _TooSlow from None
            if message["type"] == "http.request":
                state["read"] += len(message.get("body", b""))
                if state["read"] > self.max_bytes:
                    state["refused"] = (413, self._too_large())
                    raise _TooLarge
                state["done"] = not message.get("more_body", False)
            return message

        async def guarded(message: Message) -> None:
            if state["refused"] is not None:
                if message["type"] == "http.response.start" and not state["started"]:
                    state["started"] = True
                    await _answer(send, *state["refused"])
                return
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, bounded, guarded)
        except (_TooLarge, _TooSlow):
            if not state["started"]:
                await _answer(send, *state["refused"])

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes; nothing was stored"


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
