"""What the HTTP resources of `outbox serve` do, without HTTP: publish into an outbox, the log's
topics and subscriptions. Every method is synchronous (psycopg) and runs in a worker thread;
its errors are `Refused` with the status the resource answers."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import psycopg

from outbox import transports
from outbox.broker import Broker, Message
from outbox.core.codecs import PayloadInvalid, decoder
from outbox.core.databases import Database
from outbox.core.errors import (
    DuplicateMessageId,
    OutboxError,
    SchemaNotMigrated,
    SchemaTooNew,
)
from outbox.core.handlers import DEFAULT_BACKOFF
from outbox.core.headers import CONTENT_TYPE, MESSAGE_ID, TENANT_HEADER, from_json
from outbox.core.retry import Backoff
from outbox.core.text import first_line, storable
from outbox.core.topics import Topic, validate_topic
from outbox.http.config import ServeConfig
from outbox.http.pool import Busy, Pool
from outbox.pglog.log import TopicExists, UnknownTopic, decode_headers
from outbox.pglog.log import check_schema as check_log_schema
from outbox.pglog.subscriptions import (
    Lag,
    LogRecord,
    SubscriptionExists,
    Subscriptions,
    UnknownSubscription,
    Wakeups,
)
from outbox.pglog.transport import LogOptions
from outbox.postgres.connection import Connection, unavailable
from outbox.postgres.inbox_leases import InboxLeases, InboxWakeups, LeasedRow
from outbox.postgres.migrate import check_schema
from outbox.postgres.published import Published
from outbox.runtime.settings import Settings

log = logging.getLogger("outbox.serve")

#: Runs of one unit of work on the log that PostgreSQL ended to break a deadlock.
LOG_ATTEMPTS = 3

#: Attempts of an inbox row whose topic no handler of the registry takes (as `Handlers`).
DEFAULT_ATTEMPTS = 5

T = TypeVar("T")

#: What the topics and subscriptions answer on a transport other than the log.
NOT_ON_THIS_TRANSPORT = (
    "topics and subscriptions are served over the log kept in PostgreSQL: run `outbox serve "
    "--transport postgres --log-url URL`; on {label}, publish here and read with a consumer "
    "group (docs/http.md)"
)


class Refused(Exception):
    """A request answered with `status` and the one-line `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Outgoing:
    """One message of a publish, as the request gave it (checked by `Broker`)."""

    payload: Any
    key: str | None = None
    headers: Mapping[str, str] | None = None
    message_id: UUID | None = None
    tenant: str | None = None
    #: When it is due (aware), or `delay` after the database's now: see `Broker.send`.
    deliver_at: datetime | None = None
    delay: timedelta | None = None


class Service:
    """The databases, the log and the typed topics `outbox serve` serves (docs/http.md)."""

    def __init__(self, settings: Settings, config: ServeConfig) -> None:
        self.settings = settings
        self.config = config
        self.databases: dict[str, Database] = {d.name: d for d in settings.databases.listed()}
        self._pools = {
            name: Pool(d.url, config.pool_size, "outbox-serve")
            for name, d in self.databases.items()
        }
        header = settings.databases.route_header
        self._brokers = {
            d.schema: Broker(schema=d.schema, tenant_header=header or TENANT_HEADER)
            for d in self.databases.values()
        }
        self._published = {d.schema: Published(d.schema) for d in self.databases.values()}
        self._inbox = {d.schema: InboxLeases(d.schema) for d in self.databases.values()}
        self.transport = transports.get(settings.transport.name)
        self.log_pool: Pool | None = None
        self.subscriptions: Subscriptions | None = None
        #: Where the log is, on the log transport (topics and subscriptions are the log's).
        self.log = LogOptions()
        if isinstance(settings.transport.options, LogOptions):
            self.log = settings.transport.options
            self.log_pool = Pool(self.log.url, config.pool_size, "outbox-serve")
            self.subscriptions = Subscriptions(self.log.schema)
        self.typed: dict[str, Topic[Any]] = typed_topics(config.registry)
        self.retries: dict[str, tuple[int, Backoff]] = retry_policies(config.registry)

    # -- health ---------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise (an OutboxError, or psycopg's) unless every database and the log answer and
        are migrated to the revision this code expects."""
        for name, database in self.databases.items():
            try:
                with self._pools[name].connection() as conn:
                    check_schema(conn, database.schema)
            except psycopg.OperationalError as exc:
                raise unavailable(exc, f"database {name}") from None
        if self.log_pool is not None:
            try:
                with self.log_pool.connection() as conn:
                    check_log_schema(conn, self.log.schema)
            except psycopg.OperationalError as exc:
                raise unavailable(exc, "the log database") from None

    def ready(self) -> dict[str, str]:
        """What each database and the log answer to `check`, one line each ("ok" when well)."""
        found: dict[str, str] = {}
        targets: list[tuple[str, Pool, Callable[[Connection], None]]] = [
            (name, self._pools[name], _checker(check_schema, d.schema))
            for name, d in self.databases.items()
        ]
        if self.log_pool is not None:
            targets.append(
                (
                    "log",
                    self.log_pool,
                    _checker(check_log_schema, self.log.schema),
                )
            )
        for name, pool, check in targets:
            try:
                with pool.connection(wait=2.0) as conn:
                    check(conn)
                found[name] = "ok"
            except (OutboxError, psycopg.Error) as exc:
                found[name] = first_line(exc)
        return found

    def wakeups(self) -> Wakeups | None:
        """A session listening for the log's appends (None on another transport)."""
        if self.log_pool is None:
            return None
        return Wakeups(self.log.url, self.log.schema)

    def inbox_wakeups(self, name: str) -> InboxWakeups:
        """A session listening for rows stored in the inbox of database `name`."""
        target = self.databases[name]
        return InboxWakeups(target.url, target.schema)

    def close(self) -> None:
        """Close every idle connection."""
        for pool in self._pools.values():
            pool.close()
        if self.log_pool is not None:
            self.log_pool.close()

    def forget_old_ids(self) -> int:
        """Forget, in every database, the message ids older than the idempotency window."""
        forgotten = 0
        batch = 10_000
        for name, database in self.databases.items():
            published = self._published[database.schema]
            while True:  # in bounded statements, until a pass finds fewer than a batch
                with self._pools[name].connection() as conn:
                    n = published.forget(conn, self.config.idempotency_window, batch)
                forgotten += n
                if n < batch:
                    break
        return forgotten

    # -- publish --------------------------------------------------------------------------------

    def database(self, name: str | None) -> Database:
        """The database `?database=NAME` picks; the only one when not given."""
        if name is None:
            if len(self.databases) == 1:
                return next(iter(self.databases.values()))
            raise Refused(
                400,
                "this server serves several databases: give ?database=NAME, one of "
                + ", ".join(sorted(self.databases)),
            )
        found = self.databases.get(name)
        if found is None:
            raise Refused(
                404,
                f"no database {name!r}: this server serves " + ", ".join(sorted(self.databases)),
            )
        return found

    def publish(
        self, topic: str, items: Sequence[Outgoing], database: str | None = None
    ) -> tuple[bool, list[str]]:
        """Write `items` to `topic` in one transaction of the outbox `database` picks: whether
        any was written (False: every id was published before, nothing written) and the ids,
        in the order given. An id given that was published before is not written again."""
        target = self.database(database)
        messages = self._messages(topic, items)
        given = [item.message_id for item in items if item.message_id is not None]
        if len(set(given)) != len(given):
            raise Refused(422, "the same message_id twice in one request; nothing was stored")
        broker = self._brokers[target.schema]
        published = self._published[target.schema]
        with _answers(), self._pools[target.name].connection() as conn, conn.transaction():
            new = published.claim(conn, given)
            fresh = [m for m in messages if m.message_id is None or m.message_id in new]
            written = iter(broker.send_many(conn, fresh) if fresh else [])
        ids = [
            str(m.message_id)
            if m.message_id is not None and m.message_id not in new
            else str(next(written))
            for m in messages
        ]
        return bool(fresh), ids

    def _messages(self, topic: str, items: Sequence[Outgoing]) -> list[Message]:
        typed = self.typed.get(topic)
        messages = []
        for index, item in enumerate(items):
            payload = item.payload
            if typed is not None and typed.payload is not None:
                try:
                    payload = decoder(typed.payload)(payload)
                except PayloadInvalid as exc:
                    raise Refused(
                        422, f"message {index}: payload of topic {topic!r}: {first_line(exc)}"
                    ) from None
            messages.append(
                Message(
                    typed if typed is not None else topic,
                    payload,
                    key=item.key,
                    headers=item.headers,
                    message_id=item.message_id,
                    tenant=item.tenant,
                    deliver_at=item.deliver_at,
                    delay=item.delay,
                )
            )
        return messages

    # -- inbox work ------------------------------------------------------------------------------

    def lease(
        self, topics: Sequence[str], limit: int, lease: float, database: str | None = None
    ) -> list[dict[str, Any]]:
        """Lease up to `limit` pending rows of `topics` in the inbox `database` picks."""
        with _answers():
            for topic in topics:
                validate_topic(topic)
        target = self.database(database)
        inbox = self._inbox[target.schema]
        with _answers(), self._pools[target.name].connection() as conn, conn.transaction():
            rows = inbox.lease(conn, topics, limit, lease)
        return [inbox_json(row) for row in rows]

    def ack_inbox(self, ids: Sequence[int], database: str | None = None) -> list[int]:
        """Mark `ids` handled; the ids that were not (unknown, handled already, or dead)."""
        target = self.database(database)
        inbox = self._inbox[target.schema]
        with _answers(), self._pools[target.name].connection() as conn, conn.transaction():
            return inbox.ack(conn, ids)

    def nack_inbox(
        self, row_id: int, error: str, retry_after: float | None, database: str | None = None
    ) -> dict[str, Any]:
        """Fail the attempt of `row_id` under its topic's retry policy (the registry's handler
        of the topic, else the Handler's defaults): retried later, or dead."""
        target = self.database(database)
        inbox = self._inbox[target.schema]
        with _answers(), self._pools[target.name].connection() as conn, conn.transaction():
            found = inbox.attempts(conn, row_id)
            if found is None:
                raise Refused(404, f"no pending row {row_id} in the inbox of {target.name}")
            max_attempts, backoff = self.retries.get(found[0], (DEFAULT_ATTEMPTS, DEFAULT_BACKOFF))
            done = inbox.nack(
                conn,
                row_id,
                storable(error),
                max_attempts=max_attempts,
                backoff=backoff,
                retry_after=retry_after,
            )
        if done is None:
            raise Refused(404, f"no pending row {row_id} in the inbox of {target.name}")
        dead, delay = done
        return {"id": row_id, "dead": dead, "retry_after_ms": None if dead else round(delay * 1000)}

    # -- topics and subscriptions ---------------------------------------------------------------

    def _log(self, work: Callable[[Subscriptions, Connection], T]) -> T:
        """Run `work` in one transaction of the log; 501 on another transport."""
        if self.log_pool is None or self.subscriptions is None:
            raise Refused(501, NOT_ON_THIS_TRANSPORT.format(label=self.transport.label))
        subscriptions = self.subscriptions
        for attempt in range(1, LOG_ATTEMPTS + 1):
            try:
                with _answers(), self.log_pool.connection() as conn, conn.transaction():
                    return work(subscriptions, conn)
            except (Refused, psycopg.errors.ForeignKeyViolation) as exc:
                # An unsubscribe while clients take and acknowledge the subscription's leases
                # deadlocks with them, or deletes the group a `next` is writing a lease row of:
                # the unit of work was rolled back whole; run it again (it answers as if alone,
                # 404 once the subscription is gone) rather than 503 or 500.
                cause = exc.__cause__ if isinstance(exc, Refused) else exc
                transient = psycopg.errors.DeadlockDetected | psycopg.errors.ForeignKeyViolation
                if not isinstance(cause, transient) or attempt == LOG_ATTEMPTS:
                    raise
                log.debug("the log changed under a request, trying again: %s", first_line(exc))
        raise AssertionError("unreachable")  # pragma: no cover

    def topics(self) -> list[dict[str, Any]]:
        """Every topic of the log with its partitions' count and records."""
        return [
            {"name": t.name, "partitions": len(t.partitions), "records": t.records}
            for t in self._log(lambda s, conn: s.topics(conn))
        ]

    def create_topic(self, name: str, partitions: int | None) -> dict[str, Any]:
        """Create topic `name` (409 if it exists)."""
        count = self.log.partitions if partitions is None else partitions
        self._log(lambda s, conn: s.create_topic(conn, name, count))
        return {"name": name, "partitions": count}

    def topic(self, name: str) -> dict[str, Any]:
        """Topic `name`: its partitions with their ends, its subscriptions with their lag."""

        def read(s: Subscriptions, conn: Connection) -> dict[str, Any]:
            found = s.topics(conn, [name])
            if not found:
                raise UnknownTopic(f"no topic {name!r}")
            return {
                "name": name,
                "partitions": [
                    {"partition": p.partition, "end": p.end, "earliest": p.earliest}
                    for p in found[0].partitions
                ],
                "subscriptions": [
                    {"name": sub, "lag": lag} for sub, lag in s.subscriptions_of(conn, name)
                ],
            }

        return self._log(read)

    def subscribe(self, topic: str, name: str, start: str) -> bool:
        """Make subscription `name` (False: it existed)."""
        earliest = start == "earliest"
        return self._log(lambda s, conn: s.subscribe(conn, topic, name, earliest=earliest))

    def unsubscribe(self, topic: str, name: str) -> None:
        """Forget subscription `name` and its place."""
        self._log(lambda s, conn: s.unsubscribe(conn, topic, name))

    def lag(self, topic: str, name: str) -> dict[str, Any]:
        """Subscription `name`'s position per partition and its lag."""
        lags: list[Lag] = self._log(lambda s, conn: s.lag(conn, topic, name))
        return {
            "topic": topic,
            "name": name,
            "partitions": [
                {
                    "partition": p.partition,
                    "position": p.position,
                    "end": p.end,
                    "lag": p.lag,
                    "leased": p.leased,
                }
                for p in lags
            ],
            "lag": sum(p.lag for p in lags),
        }

    def next(
        self, topic: str, name: str, limit: int, lease: float, auto_ack: bool
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Up to `limit` records of subscription `name`, and the cursor acknowledging them."""
        leased = self._log(
            lambda s, conn: s.next(conn, topic, name, limit=limit, lease=lease, auto_ack=auto_ack)
        )
        return [record_json(r) for r in leased.records], leased.cursor

    def ack(self, topic: str, name: str, cursor: str) -> None:
        """Acknowledge the records of `cursor` (409 when its lease is gone)."""
        if not self._log(lambda s, conn: s.ack(conn, topic, name, cursor)):
            raise Refused(
                409,
                f"cursor {cursor} holds no lease of subscription {name!r}: it was acknowledged "
                "already, or its lease ran out and its records are handed out again",
            )


class _answers:
    """Turns the errors of a unit of work into the `Refused` a resource answers."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if exc is None or isinstance(exc, Refused):
            return
        status = _status(exc)
        if status is not None:
            # `send_many item N` is the Python caller's word; over HTTP it is message N.
            said = first_line(exc).replace("send_many item ", "message ")
            raise Refused(status, said) from exc


def _status(exc: BaseException) -> int | None:
    """The status of an error a unit of work raised; None: not foreseen (a 500)."""
    if isinstance(exc, UnknownTopic | UnknownSubscription):
        return 404
    if isinstance(exc, TopicExists | SubscriptionExists | DuplicateMessageId):
        return 409
    if isinstance(exc, Busy | SchemaNotMigrated | SchemaTooNew | psycopg.OperationalError):
        return 503
    if isinstance(exc, OutboxError | psycopg.DataError):
        return 422
    return None


def _checker(check: Callable[[Connection, str], None], schema: str) -> Callable[[Connection], None]:
    return lambda conn: check(conn, schema)


def typed_topics(registry: str | None) -> dict[str, Topic[Any]]:
    """The Topics of `--registry MODULE[:ATTRIBUTE]` by name: those it sends and those its
    handlers receive."""
    if registry is None:
        return {}
    from outbox.asyncapi import load_service

    service = load_service(registry)
    found: dict[str, Topic[Any]] = {}
    for spec in service.receivers:
        if spec.declared is not None:
            found[spec.declared.name] = spec.declared
    for topic in service.sent:
        found[topic.name] = topic
    return found


def retry_policies(registry: str | None) -> dict[str, tuple[int, Backoff]]:
    """The retry policy (max attempts, backoff) of each topic the registry's handlers take."""
    if registry is None:
        return {}
    from outbox.asyncapi import load_service

    return {
        spec.topic: (spec.max_attempts, spec.backoff) for spec in load_service(registry).receivers
    }


def inbox_json(row: LeasedRow) -> dict[str, Any]:
    """A leased inbox row as `/v1/inbox/lease` answers it."""
    headers = {
        name: value if isinstance(value, str) else value.decode("utf-8", "replace")
        for name, value in from_json(row.headers or {}).items()
    }
    found: dict[str, Any] = {
        "id": row.id,
        "message_id": str(row.message_id),
        "topic": row.topic,
        "attempt": row.attempt,
        "created_at": row.created_at.isoformat(),
        "headers": headers,
    }
    found.update(_value("key", row.key, "text"))
    found.update(_value("payload", row.payload, row.content_type.lower()))
    return found


def record_json(record: LogRecord) -> dict[str, Any]:
    """A record as `next` answers it: the payload as JSON when its content type is JSON, text
    when it is text, else base64 in `payload_base64`; the key as text, else `key_base64`."""
    headers = {
        name: (value.decode("utf-8", "replace") if value is not None else None)
        for name, value in _headers(record.headers)
    }
    content_type = (headers.get(CONTENT_TYPE) or "").lower()
    found: dict[str, Any] = {
        "partition": record.partition,
        "offset": record.offset,
        "message_id": headers.get(MESSAGE_ID),
        "headers": headers,
    }
    found.update(_value("key", record.key, "text"))
    found.update(_value("payload", record.value, content_type))
    return found


def _headers(data: bytes | None) -> list[tuple[str, bytes | None]]:
    try:
        return decode_headers(data)
    except ValueError:
        return []


def _value(name: str, raw: bytes | None, content_type: str) -> dict[str, Any]:
    if raw is None:
        return {name: None}
    if "json" in content_type:
        try:
            return {name: json.loads(raw)}
        except ValueError:
            pass
    if "json" in content_type or content_type.startswith("text"):
        try:
            return {name: raw.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {name: None, f"{name}_base64": base64.b64encode(raw).decode()}
