"""The console: what it shows and what each request may do, apart from HTTP's transport. It
is served by uvicorn through the Starlette application of `outbox.console.web` (the stack of
`outbox serve`; see docs/decisions/0014-console-server.md).

Bounded:

- at most `workers + queued` connections are open at once; any further connection is
  answered 503 (with Retry-After) as soon as it is accepted, and closed;
- the answers, which read the databases, run in at most `workers` threads, off the event loop;
- a connection that sends no whole request head, no announced body or reads nothing of its
  answer for `socket_timeout` seconds is closed (a body that does not come: 408);
- a request body is read only with a valid Content-Length of at most MAX_BODY_BYTES (400 for
  a malformed or differing repeated one, 413 above, 411 for a chunked one);
- no answer is larger than MAX_RESPONSE_BYTES: what is read from the databases is cut in
  PostgreSQL and paged (`outbox.console.reads`), tables are cut (`outbox.console.render`),
  and an answer that would still be larger is refused with 500 and logged.

Safe by default:

- it binds 127.0.0.1; any other address is refused unless an auth token is configured, and
  then every request must carry it (HTTP basic auth with the token as password, or
  `Authorization: Bearer <token>`);
- without a token, a request whose Host header is not a loopback name is refused (a DNS
  rebinding page cannot read the console);
- a state-changing request is a POST with the CSRF token of its session (an HMAC of the
  session cookie) in `X-CSRF-Token`, an `Origin` of the console's own host, and a
  `Sec-Fetch-Site` of same-origin or none;
- `read_only` refuses requeue and purge (and the page shows no such buttons);
- database URLs are shown only through `redact_url`, errors through `redact_text`;
- every answer has a Content-Security-Policy that allows no inline script, nosniff, frame
  DENY, no referrer and no-store.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import ipaddress
import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg

from outbox import transports
from outbox.console import assets, reads, render
from outbox.console.throughput import Throughput
from outbox.core.databases import Database as CoreDatabase
from outbox.core.databases import check_distinct, parse_entry, read_file
from outbox.core.errors import ConfigurationError, OutboxError
from outbox.core.lag import GroupLag, lag_json
from outbox.core.redact import redact_text, redact_url
from outbox.core.text import first_line
from outbox.formatting import cut, status_json
from outbox.ports import LagReader
from outbox.postgres import operations as ops
from outbox.postgres.migrate import check_schema
from outbox.postgres.queries import validate_schema

log = logging.getLogger("outbox.console")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
COOKIE = "outbox_console_session"
#: No answer of the console is larger (bytes); see the module's docstring.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: The largest request body accepted (a requeue or purge form is a few dozen bytes).
MAX_BODY_BYTES = 65536
#: Partitions of the lag in `/api/status` at most (the totals count them all).
MAX_LAG_PARTITIONS = 1000
_CONTENT_LENGTH_RE = re.compile(r"[0-9]{1,18}")
_SESSION_RE = re.compile(r"^[A-Za-z0-9_-]{32,64}$")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
#: What a missing extra says.
MISSING_EXTRA = "outbox console needs the console extra: pip install 'pg-kafka-outbox[console]'"


def require_extra() -> None:
    """ConfigurationError naming the `console` extra unless Starlette and uvicorn are
    installed (this module imports neither: `outbox.console.web` does)."""
    for module in ("starlette", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            raise ConfigurationError(f"{MISSING_EXTRA} ({module} is not installed)")


@dataclass(frozen=True, slots=True)
class Database:
    """A service database the console shows: its name in the page, URL and schema."""

    name: str
    url: str
    schema: str = "outbox"


@dataclass(frozen=True)
class ConsoleConfig:
    """Settings of `outbox console`; validated at construction."""

    #: The databases given as flags; more may come from `databases_file`.
    databases: tuple[Database, ...]
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    auth_token: str | None = None
    read_only: bool = False
    #: Seconds between two refreshes of the page.
    refresh: float = 3.0
    #: Seconds between two throughput and lag samples.
    sample_interval: float = 5.0
    #: Consumer groups whose lag is shown; empty: every group of the cluster (or log).
    groups: tuple[str, ...] = ()
    #: Where the lag is read: a registered transport and its options
    #: (`outbox.transports.settings_of("kafka", kafka_bootstrap=...)`); the console passes them
    #: to the transport's entry, never reading them.
    transport: transports.TransportSettings = field(default_factory=transports.TransportSettings)
    #: Threads answering requests (they read the databases), and connections that may be open
    #: besides: at most `workers + queued` at once, one more is answered 503.
    workers: int = 8
    queued: int = 16
    #: Seconds a client may take to send a request head or its body, or to read some of its
    #: answer, and a kept-alive connection may stay idle, before its connection is closed.
    socket_timeout: float = 10.0
    #: A file of more databases (`outbox.core.databases.read_file`), read again every sample.
    databases_file: str | None = None
    #: The schema of a database in `databases_file` that names none.
    schema: str = "outbox"
    #: MODULE[:ATTRIBUTE] of the service whose AsyncAPI document the console serves (as
    #: `outbox asyncapi` takes it), or None for no AsyncAPI page.
    asyncapi: str | None = None

    def __post_init__(self) -> None:
        if not self.databases and not self.databases_file:
            raise ConfigurationError(
                "the console needs at least one --database-url (or --databases-file)"
            )
        names = [d.name for d in self.databases]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"database names must differ, got {names}")
        for d in self.databases:
            validate_schema(d.schema)
        validate_schema(self.schema)
        if not is_loopback(self.host) and not self.auth_token:
            raise ConfigurationError(
                f"refusing to serve the console on {self.host}: it binds 127.0.0.1 unless an "
                "auth token is configured (--auth-token or OUTBOX_CONSOLE_TOKEN)"
            )
        if self.refresh <= 0 or self.sample_interval <= 0:
            raise ConfigurationError("refresh and sample interval must be > 0 seconds")
        transports.get(self.transport.name)  # one error naming the registered transports
        if self.workers < 1 or self.queued < 0 or self.socket_timeout <= 0:
            raise ConfigurationError(
                "the console needs at least one worker, a queue of 0 or more connections and "
                "a socket timeout > 0 seconds"
            )

    @property
    def transport_entry(self) -> transports.Transport[Any]:
        """The registry's entry of the console's transport."""
        return transports.get(self.transport.name)

    @property
    def transport_options(self) -> Any:
        """The transport's options, for its entry's `LagReader` and AsyncAPI servers."""
        return transports.options(self.transport)

    @property
    def lag_source(self) -> str | None:
        """Where the lag is read from (redacted), or None when it is not read."""
        transport = self.transport_entry
        endpoint = transport.endpoint(self.transport_options)
        return transport.shown(endpoint) if endpoint else None


def is_loopback(host: str) -> bool:
    """True for a loopback address or the name localhost."""
    if host.strip("[]").lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_database(text: str, index: int = 0) -> tuple[str, str]:
    """(name, url) of a `--database-url`: `NAME=URL`, `NAME/SCHEMA=URL`, or a URL named after
    its database (`outbox.core.databases.parse_entry`)."""
    found = parse_entry(text, "outbox", index=index)
    return found.name, found.url


def current_databases(config: ConsoleConfig) -> tuple[Database, ...]:
    """The databases of `config`'s flags and then of its databases file, read now; a
    ConfigurationError when the file cannot be read, has a bad line, or repeats a name or a
    database, or when no database is left."""
    listed = list(config.databases)
    if config.databases_file:
        listed += [
            Database(d.name, d.url, d.schema)
            for d in read_file(config.databases_file, config.schema)
        ]
    check_distinct(CoreDatabase(d.name, d.url, d.schema) for d in listed)
    if not listed:
        raise ConfigurationError(f"the databases file {config.databases_file!r} lists no database")
    return tuple(listed)


class Console:
    """The console: its sampler thread and its HTTP server."""

    def __init__(self, config: ConsoleConfig) -> None:
        require_extra()
        self.config = config
        self._databases: tuple[Database, ...] = ()
        self._by_name: dict[str, Database] = {}
        self._described: dict[str, str] = {}
        self._throughput: dict[str, Throughput] = {}
        self._databases_lock = threading.Lock()
        self._file_error: str | None = None
        self._use(current_databases(config))
        self._secret = secrets.token_bytes(32)
        self._lag: list[GroupLag] | None = None
        self._lag_note: str | None = None
        self._lag_lock = threading.Lock()
        self._sample_errors: dict[str, str] = {}
        self._sampled: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.asyncapi = _asyncapi(config)
        #: Connections answered 503 at once: beyond `workers + queued` open at a time.
        self.busy_answers = 0
        self._socket = _listen(config)
        self._server: Any = None
        address = self._socket.getsockname()
        host, port = str(address[0]), int(address[1])
        shown = f"[{host}]" if ":" in host else host
        self._url = f"http://{shown}:{port}/"

    @property
    def url(self) -> str:
        """The console's address, e.g. http://127.0.0.1:8470/ (also once closed)."""
        return self._url

    def start(self) -> None:
        """Serve (uvicorn, in a thread of its own) and sample in background threads."""
        from outbox.console import web

        self._server = web.server(
            self,
            workers=self.config.workers,
            queued=self.config.queued,
            socket_timeout=self.config.socket_timeout,
            max_body_bytes=MAX_BODY_BYTES,
            busy=self.busy,
        )
        for name, target in (
            ("outbox-console-sampler", self._sample_forever),
            ("outbox-console-server", lambda: self._server.run(sockets=[self._socket])),
        ):
            thread = threading.Thread(target=target, daemon=True, name=name)
            thread.start()
            self._threads.append(thread)
        # Serving before this returns (connections wait in the socket's backlog meanwhile).
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise OutboxError("the console's HTTP server did not start (see the log)")
            time.sleep(0.01)

    def exchange(self, method: str, target: str, headers: Sequence[tuple[str, str]]) -> _Exchange:
        """The console's side of one request: `check` it, then `answer` it with its body."""
        return _Exchange(self, method, target, _Headers(headers))

    def busy(self) -> bytes:
        """The whole answer to a connection beyond the bound (counted in `busy_answers`)."""
        self.busy_answers += 1
        body = b'{"error": "the console is busy: try again in a moment"}'
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        return head.encode("ascii") + body

    def run(self) -> None:
        """Serve until `stop` (from a signal handler)."""
        self.start()
        log.info(
            "outbox console on %s (%s; %s)",
            self.url,
            "read-only" if self.config.read_only else "requeue and purge allowed",
            "auth token required" if self.config.auth_token else "no auth token: loopback only",
        )
        self._stop.wait()
        self.close()

    def stop(self) -> None:
        """Ask `run` to return."""
        self._stop.set()

    def close(self) -> None:
        """Stop serving and sampling."""
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        for thread in self._threads:
            thread.join(15)
        self._threads.clear()
        self._socket.close()

    # -- the databases ----------------------------------------------------------------------

    @property
    def databases(self) -> tuple[Database, ...]:
        """The databases shown now: the flags', then the databases file's as last read."""
        return self._databases

    def _use(self, databases: tuple[Database, ...]) -> None:
        """Show `databases` from now on (a database that stays keeps its throughput)."""
        with self._databases_lock:
            throughput = {d.name: self._throughput.get(d.name) or Throughput() for d in databases}
            self._by_name = {d.name: d for d in databases}
            self._described = {d.name: redact_url(d.url) for d in databases}
            self._throughput = throughput
            self._databases = databases

    def _reread(self) -> None:
        """Read the databases file again; a file that cannot be used keeps the last list (its
        error is logged when it starts or changes, and the recovery once)."""
        if not self.config.databases_file:
            return
        try:
            databases = current_databases(self.config)
        except ConfigurationError as exc:
            message = redact_text(str(exc))
            if message != self._file_error:
                log.warning("databases file: %s (keeping the databases shown)", message)
            self._file_error = message
            return
        if self._file_error is not None:
            log.info("databases file read again")
            self._file_error = None
        if databases != self._databases:
            before, after = {d.name for d in self._databases}, {d.name for d in databases}
            log.info(
                "databases file: %d databases (added: %s; removed: %s)",
                len(databases),
                ", ".join(sorted(after - before)) or "none",
                ", ".join(sorted(before - after)) or "none",
            )
            self._use(databases)

    def database_states(self, current: str | None = None) -> dict[str, Any]:
        """Each database shown, with whether the last sample could read it (and why not), and
        the page's database selector with `current` marked."""
        with self._databases_lock:
            databases, described = self._databases, self._described
        errors = dict(self._sample_errors)
        read = set(self._sampled)
        return {
            "databases": [
                {
                    "name": d.name,
                    "url": described[d.name],
                    "schema": d.schema,
                    # None until the sampler first tried it.
                    "ok": False if d.name in errors else True if d.name in read else None,
                    "error": errors.get(d.name),
                }
                for d in databases
            ],
            "databases_file_error": self._file_error,
            "html": render.databases([d.name for d in databases], current or "", described, errors),
        }

    # -- sampling ---------------------------------------------------------------------------

    def _sample_forever(self) -> None:
        lag_reader: _LagSource | None = None
        connections: dict[str, psycopg.Connection[Any]] = {}
        try:
            while not self._stop.is_set():
                self._reread()
                shown = self.databases
                for name in set(connections) - {d.name for d in shown}:
                    connections.pop(name).close()
                for name in set(self._sample_errors) - {d.name for d in shown}:
                    self._sample_errors.pop(name, None)
                self._sampled &= {d.name for d in shown}
                for d in shown:
                    if self._stop.is_set():
                        break
                    self._sample(d, connections)
                if self.config.lag_source:
                    lag_reader = self._sample_lag(lag_reader)
                self._stop.wait(self.config.sample_interval)
        finally:
            for conn in connections.values():
                conn.close()
            if lag_reader is not None:
                lag_reader.close()

    def _sample(self, d: Database, connections: dict[str, psycopg.Connection[Any]]) -> None:
        """One throughput sample of `d`. A database it cannot read is tried again at the next
        sample; its error is logged when it starts or changes, and its recovery once."""
        throughput = self._throughput.get(d.name)
        if throughput is None:  # removed from the databases file meanwhile
            return
        try:
            conn = connections.get(d.name)
            if conn is None or conn.closed:
                conn = connections[d.name] = _connect(d.url)
            throughput.add(reads.counters(conn, d.schema, throughput.since))
        except psycopg.Error as exc:
            message = redact_text(first_line(exc))
            if self._sample_errors.get(d.name) != message:
                log.warning("sampling %s: %s (trying again every sample)", d.name, message)
            self._sample_errors[d.name] = message
            broken = connections.pop(d.name, None)
            if broken is not None:
                broken.close()
            return
        self._sampled.add(d.name)
        if self._sample_errors.pop(d.name, None) is not None:
            log.info("sampling %s again", d.name)

    def _sample_lag(self, reader: _LagSource | None) -> _LagSource | None:
        try:
            if reader is None:
                reader = _lag_source(self.config)
            groups = reader.lag(self.config.groups or None)
            note = None
        except Exception as exc:  # the broker's errors have many types; the page says why
            groups, note = None, f"cannot read lag: {redact_text(first_line(exc))}"
            if reader is not None:
                reader.close()
                reader = None  # a new reader (a new connection) next time
        with self._lag_lock:
            if groups is not None:
                self._lag = groups
            self._lag_note = note
        return reader

    def lag(self) -> tuple[list[GroupLag] | None, str | None]:
        """The last lag read (None before the first, or when not configured) and a note."""
        if not self.config.lag_source:
            return None, self.config.transport_entry.lag_note
        with self._lag_lock:
            if self._lag is None and self._lag_note is None:
                return [], "Reading the lag…"
            return self._lag, self._lag_note

    # -- requests ---------------------------------------------------------------------------

    def database(self, name: str | None) -> Database:
        """The database called `name` (the first when None)."""
        if name is None:
            return self.databases[0]
        try:
            return self._by_name[name]
        except KeyError:
            raise _Refused(HTTPStatus.NOT_FOUND, "no such database") from None

    def csrf_token(self, session: str) -> str:
        """The CSRF token of a session: an HMAC of its id with the console's secret."""
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def page(self, d: Database, session: str) -> str:
        """The page shell of database `d`."""
        return assets.PAGE.format(
            db=render.esc(d.name),
            csrf=render.esc(self.csrf_token(session)),
            refresh=render.esc(self.config.refresh),
            databases=self.database_states(d.name)["html"],
            described=render.esc(redact_url(d.url)),
            schema=render.esc(d.schema),
            read_only='<span class="ro">read-only</span>' if self.config.read_only else "",
            asyncapi=' <a class="db doc" href="/asyncapi">AsyncAPI</a>' if self.asyncapi else "",
        )

    def view(self, d: Database, query: Mapping[str, str]) -> dict[str, Any]:
        """The fragments of the page: queues, processes, lag, chart, dead letters."""
        queue = _queue(query.get("queue"))
        topic = query.get("topic", "").strip() or None
        text = query.get("text", "").strip() or None
        after = _after(query.get("after"))
        with _connection(d) as conn:
            status = ops.status(conn, d.schema)
            page = reads.dead_page(conn, d.schema, queue, topic=topic, text=text, after=after)
        groups, note = self.lag()
        return {
            "db": d.name,
            "dead_total": page.total,
            "dead_rows": len(page.rows),
            "more": page.more,
            "next_after": page.next_after,
            "taken_at": render.esc(status.taken_at.strftime("%H:%M:%S")),
            "queues": render.queues(status),
            "processes": render.processes(status),
            "lag": render.lag(groups, note),
            "chart": render.chart(self._rates(d), transport=self.config.transport_entry.label),
            "dead": render.dead_letters(page, read_only=self.config.read_only),
            "error": None,
        }

    def status_document(self, d: Database) -> dict[str, Any]:
        """`outbox status --json`'s document, with the lag and the sampled rates."""
        with _connection(d) as conn:
            status = ops.status(conn, d.schema)
        groups, note = self.lag()
        return {
            **status_json(status),
            "database": d.name,
            "lag": None if groups is None else _bounded_lag_json(groups),
            "lag_note": note,
            "throughput": [
                {
                    "at": r.at,
                    "written": r.written,
                    "relayed": r.relayed,
                    "received": r.received,
                    "handled": r.handled,
                }
                for r in self._rates(d)
            ],
        }

    def _rates(self, d: Database) -> list[Any]:
        throughput = self._throughput.get(d.name)
        return [] if throughput is None else list(throughput.rates())

    def row(self, d: Database, query: Mapping[str, str]) -> dict[str, Any]:
        """One row's detail fragment."""
        queue = _queue(query.get("queue"))
        row_id = _row_id(query.get("id"))
        with _connection(d) as conn:
            row = reads.show_row(conn, d.schema, queue, row_id)
        return {
            "html": render.row_detail(row, read_only=self.config.read_only),
            "payload_size": row.payload_size,
            "payload_preview_bytes": len(row.payload_head),
            "error_size": row.error_size,
        }

    def change(self, d: Database, action: str, form: Mapping[str, str]) -> dict[str, Any]:
        """Requeue or purge one dead row."""
        if self.config.read_only:
            raise _Refused(HTTPStatus.FORBIDDEN, "the console is read-only")
        queue = _queue(form.get("queue"))
        row_id = _row_id(form.get("id"))
        selection = ops.Selection(ids=(row_id,))
        with _connection(d) as conn:
            if action == "requeue":
                count = ops.requeue(conn, d.schema, queue, selection)
            else:
                count = ops.purge(conn, d.schema, queue, selection)
        log.info("console: %sd row %s of %s in %s", action, row_id, ops.TABLES[queue], d.name)
        rows = "row" if count == 1 else "rows"
        return {"changed": count, "message": f"{action}d {count} {rows} of {ops.TABLES[queue]}"}


@dataclass(frozen=True, slots=True)
class AsyncApi:
    """The AsyncAPI document the console serves, and its page (built once, at start-up)."""

    document: dict[str, Any]
    html: str


def _asyncapi(config: ConsoleConfig) -> AsyncApi | None:
    """The document of `config.asyncapi`, as `outbox asyncapi` writes it (the servers of the
    console's transport), and its page; a ConfigurationError when it cannot be built."""
    if not config.asyncapi:
        return None
    from outbox.asyncapi import build_document, load_service
    from outbox.console import asyncapi_page

    servers, schemes = config.transport_entry.asyncapi_servers(config.transport_options)
    document = build_document(
        load_service(config.asyncapi),
        title=config.asyncapi,
        servers=servers,
        security_schemes=schemes,
        source=config.asyncapi,
    )
    return AsyncApi(document, asyncapi_page.page(document, source=config.asyncapi))


#: Reads consumer-group lag as `outbox.core.lag.GroupLag`: the `LagReader` of the transport
#: (Kafka's, or the PostgreSQL log's).
_LagSource = LagReader


def _lag_source(config: ConsoleConfig) -> LagReader:
    return config.transport_entry.lag_reader(config.transport_options, 5.0)


def _bounded_lag_json(groups: Sequence[GroupLag]) -> list[dict[str, Any]]:
    """`lag_json` of `groups`, with at most MAX_LAG_PARTITIONS partitions in all (a group's
    `partitions_shown` says how many of its partitions are listed; totals count them all)."""
    docs = lag_json(groups)
    budget = MAX_LAG_PARTITIONS
    for doc in docs:
        partitions = doc["partitions"]
        doc["partitions"] = partitions[: max(0, budget)]
        doc["partitions_shown"] = len(doc["partitions"])
        doc["partitions_total"] = len(partitions)
        if len(doc["topics"]) > MAX_LAG_PARTITIONS:
            doc["topics"] = dict(list(doc["topics"].items())[:MAX_LAG_PARTITIONS])
        budget -= len(doc["partitions"])
    return docs


def _after(text: str | None) -> int | None:
    """The `after` cursor of a page of dead rows: empty, or a row id."""
    if not text:
        return None
    if not _CONTENT_LENGTH_RE.fullmatch(text):
        raise _Refused(HTTPStatus.BAD_REQUEST, "after must be a row id")
    return int(text)


def _without_nul(params: dict[str, str]) -> dict[str, str]:
    """`params`, refused with 400 if a name or value holds NUL (no PostgreSQL text does)."""
    for name, value in params.items():
        if "\x00" in name or "\x00" in value:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"parameter {name[:40]!r} holds a NUL character")
    return params


class _Refused(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _queue(text: str | None) -> ops.Queue:
    if text in (None, "", "consumer"):
        return "consumer"
    if text == "producer":
        return "producer"
    raise _Refused(HTTPStatus.BAD_REQUEST, "queue must be consumer or producer")


def _row_id(text: str | None) -> ops.RowId:
    try:
        return ops.parse_row_id(text or "")
    except ValueError as exc:
        raise _Refused(HTTPStatus.BAD_REQUEST, str(exc)) from None


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        url, autocommit=True, connect_timeout=5, application_name="outbox-console"
    )


@contextmanager
def _connection(d: Database) -> Iterator[psycopg.Connection[Any]]:
    try:
        conn = _connect(d.url)
    except psycopg.Error as exc:
        raise _Refused(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"cannot connect to PostgreSQL ({d.name}): {first_line(exc)}",
        ) from None
    with conn:
        try:
            ops.limit_lock_wait(conn, d.schema)
            check_schema(conn, d.schema)
            yield conn
        except psycopg.errors.LockNotAvailable:
            raise _Refused(
                HTTPStatus.CONFLICT,
                "the row is locked by a running daemon; nothing was changed, try again",
            ) from None
        except psycopg.Error as exc:
            raise _Refused(
                HTTPStatus.SERVICE_UNAVAILABLE, f"PostgreSQL ({d.name}): {first_line(exc)}"
            ) from None


def _listen_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The address family and socket address to bind `host` (an IPv4 or IPv6 address, or a
    name) on `port`; ConfigurationError if the host cannot be resolved."""
    bare = host.strip("[]")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        try:
            infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise ConfigurationError(
                f"cannot listen on {host}: the name does not resolve ({exc})"
            ) from None
        family, _, _, _, sockaddr = infos[0]
        return family, sockaddr
    if address.version == 6:
        return socket.AF_INET6, (bare, port, 0, 0)
    return socket.AF_INET, (bare, port)


def _listen(config: ConsoleConfig) -> socket.socket:
    """A socket listening on the console's host and port (an IPv6 address: IPv6 only); a
    ConfigurationError of one line when it cannot be had."""
    family, address = _listen_address(config.host, config.port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # Only the IPv6 address asked for, not IPv4 as well through a mapped address.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(config.workers + config.queued)
    except OSError as exc:
        sock.close()
        shown = f"[{config.host}]" if ":" in config.host else config.host
        raise ConfigurationError(
            f"cannot listen on {shown}:{config.port}: {exc.strerror or exc}"
        ) from None
    return sock


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer of the console: its status, headers and body (empty for HEAD, its
    Content-Length that of the GET's)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


#: The headers of every answer (no inline script, no framing, no referrer, no caching).
_SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
)


class _Exchange:
    """One request to the console and its answer, apart from HTTP's transport (the ASGI
    application of `outbox.console.web` hands it the request line, headers and body)."""

    def __init__(self, console: Console, method: str, target: str, headers: _Headers) -> None:
        self.console = console
        self.method = method
        self.target = target
        self.headers = headers

    # -- plumbing ---------------------------------------------------------------------------

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Answer:
        if len(body) > MAX_RESPONSE_BYTES:
            log.warning(
                "console answer of %d bytes to %s refused: larger than %d",
                len(body),
                cut(redact_text(urlsplit(self.target).path), 100),
                MAX_RESPONSE_BYTES,
            )
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            body = b'{"error": "the answer would be larger than the console sends"}'
            content_type, headers = "application/json", ()
        return Answer(
            int(status),
            (
                ("Content-Type", content_type),
                ("Content-Length", str(len(body))),
                *_SECURITY_HEADERS,
                *headers,
            ),
            b"" if self.method == "HEAD" else body,
        )

    def _json(
        self, status: HTTPStatus, doc: Any, headers: Sequence[tuple[str, str]] = ()
    ) -> Answer:
        # ensure_ascii and "<" escaped: the JSON is inert even if a browser sniffed it as HTML.
        text = json.dumps(doc, ensure_ascii=True, default=str).replace("<", "\\u003c")
        return self._send(status, text.encode("ascii"), "application/json", headers)

    def refuse(self, status: int, message: str) -> Answer:
        """The error answer `{"error": message}` with `status`."""
        return self._json(HTTPStatus(status), {"error": redact_text(message)})

    def _query(self) -> dict[str, str]:
        query = parse_qs(urlsplit(self.target).query, keep_blank_values=True)
        return _without_nul({k: v[-1] for k, v in query.items()})

    def _session(self) -> str | None:
        raw = self.headers.get("Cookie")
        if not raw:
            return None
        try:
            cookie = SimpleCookie(raw)
        except CookieError:
            return None
        morsel = cookie.get(COOKIE)
        if morsel is None or not _SESSION_RE.fullmatch(morsel.value):
            return None
        return morsel.value

    # -- checks -----------------------------------------------------------------------------

    def _check_host(self) -> None:
        """Without a token, only loopback Host names (no DNS rebinding)."""
        if self.console.config.auth_token:
            return
        host = self.headers.get("Host") or ""
        name = urlsplit(f"//{host}").hostname or ""
        if not is_loopback(name):
            raise _Refused(HTTPStatus.FORBIDDEN, "the console answers loopback host names only")

    def _check_auth(self) -> Answer | None:
        token = self.console.config.auth_token
        if not token:
            return None
        given = self.headers.get("Authorization") or ""
        scheme, _, value = given.partition(" ")
        candidate = ""
        if scheme.lower() == "bearer":
            candidate = value.strip()
        elif scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                decoded = ""
            candidate = decoded.partition(":")[2]
        if candidate and hmac.compare_digest(candidate.encode(), token.encode()):
            return None
        body = b"authentication required: the console's token as the password"
        return self._send(
            HTTPStatus.UNAUTHORIZED,
            body,
            "text/plain; charset=utf-8",
            [("WWW-Authenticate", 'Basic realm="outbox console", charset="UTF-8"')],
        )

    def _check_post(self) -> None:
        """Same-origin, with the CSRF token of the session."""
        origin = self.headers.get("Origin")
        host = self.headers.get("Host") or ""
        if not origin or urlsplit(origin).netloc != host:
            raise _Refused(HTTPStatus.FORBIDDEN, "cross-origin request refused")
        if self.headers.get("Sec-Fetch-Site") not in (None, "same-origin"):
            raise _Refused(HTTPStatus.FORBIDDEN, "cross-site request refused")
        session = self._session()
        token = self.headers.get("X-CSRF-Token") or ""
        if session is None or not hmac.compare_digest(
            token.encode(), self.console.csrf_token(session).encode()
        ):
            raise _Refused(HTTPStatus.FORBIDDEN, "missing or wrong CSRF token; reload the page")

    # -- the two steps ----------------------------------------------------------------------

    def check(self) -> Answer | None:
        """The refusal of this request before its body is read (Host, token, method and path,
        and for a POST its origin and CSRF token), or None. Reads no database."""
        try:
            self._check_host()
            refused = self._check_auth()
            if refused is not None:
                return refused
            if self.method == "POST":
                if self._action() is None:
                    raise _Refused(HTTPStatus.NOT_FOUND, "not found")
                self._check_post()
            elif self.method not in ("GET", "HEAD"):
                raise _Refused(HTTPStatus.METHOD_NOT_ALLOWED, "the console takes GET and POST")
        except _Refused as exc:
            return self.refuse(exc.status, exc.message)
        return None

    def answer(self, body: bytes) -> Answer:
        """The answer of a request `check` let through, with its `body` (blocking: it reads
        the databases)."""
        try:
            return self._post(body) if self.method == "POST" else self._get()
        except _Refused as exc:
            return self.refuse(exc.status, exc.message)
        except OutboxError as exc:
            status = (
                HTTPStatus.NOT_FOUND
                if isinstance(exc, ops.NoSuchDeadLetter)
                else HTTPStatus.CONFLICT
                if isinstance(exc, ops.RequeueConflict)
                else HTTPStatus.BAD_REQUEST
            )
            return self.refuse(status, first_line(exc))
        except Exception as exc:
            log.warning("console request failed", exc_info=True)
            return self._json(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": f"unexpected {type(exc).__name__}: {redact_text(first_line(exc))}"},
            )

    def _get(self) -> Answer:
        path = urlsplit(self.target).path
        query = self._query()
        if path == "/static/console.js":
            return self._send(HTTPStatus.OK, assets.JS.encode(), "text/javascript; charset=utf-8")
        if path == "/static/console.css":
            return self._send(HTTPStatus.OK, assets.CSS.encode(), "text/css; charset=utf-8")
        if path == "/":
            d = self.console.database(query.get("db"))
            session = self._session()
            headers = []
            if session is None:
                session = secrets.token_urlsafe(32)
                headers.append(
                    ("Set-Cookie", f"{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict")
                )
            body = self.console.page(d, session).encode()
            return self._send(HTTPStatus.OK, body, "text/html; charset=utf-8", headers)
        if path == "/api/view":
            d = self.console.database(query.get("db"))
            return self._json(HTTPStatus.OK, self.console.view(d, query))
        if path == "/api/status":
            d = self.console.database(query.get("db"))
            return self._json(HTTPStatus.OK, self.console.status_document(d))
        if path == "/api/databases":
            return self._json(HTTPStatus.OK, self.console.database_states(query.get("db")))
        if path == "/api/row":
            d = self.console.database(query.get("db"))
            return self._json(HTTPStatus.OK, self.console.row(d, query))
        if path in ("/asyncapi", "/asyncapi.json"):
            found = self.console.asyncapi
            if found is None:
                raise _Refused(
                    HTTPStatus.NOT_FOUND,
                    "no AsyncAPI document: start the console with --asyncapi MODULE[:ATTRIBUTE]",
                )
            if path == "/asyncapi":
                return self._send(HTTPStatus.OK, found.html.encode(), "text/html; charset=utf-8")
            return self._json(HTTPStatus.OK, found.document)
        if path == "/favicon.ico":
            return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        raise _Refused(HTTPStatus.NOT_FOUND, "not found")

    def _action(self) -> str | None:
        path = urlsplit(self.target).path
        return {"/api/requeue": "requeue", "/api/purge": "purge"}.get(path)

    def _post(self, body: bytes) -> Answer:
        action = self._action()
        if action is None:
            raise _Refused(HTTPStatus.NOT_FOUND, "not found")
        raw = body.decode("utf-8", "replace")
        form = _without_nul({k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()})
        d = self.console.database(form.get("db"))
        return self._json(HTTPStatus.OK, self.console.change(d, action, form))


class _Headers:
    """A request's headers, names compared without case."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._pairs = [(name.lower(), value) for name, value in pairs]

    def get(self, name: str) -> str | None:
        """The first value of header `name`, or None."""
        found = self.get_all(name)
        return found[0] if found else None

    def get_all(self, name: str) -> list[str]:
        """Every value of header `name`, in order."""
        name = name.lower()
        return [value for key, value in self._pairs if key == name]


def serve(config: ConsoleConfig) -> Console:
    """A started console (for tests and embedding); `close()` it when done."""
    console = Console(config)
    console.start()
    return console
