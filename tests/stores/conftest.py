"""The stores under test: every contract test runs against each (watermill's pattern, as the
transports' suite in tests/transport/).

`memory` is `outbox.testing.stores` (MemoryOutbox, MemoryInbox); `postgres` is PostgreSQL's
adapters (outbox/postgres/: relay_stores, inbox) in a fresh migrated database of the
session's server, made as the daemons get them; `postgres-63` is the same in a schema whose name
is PostgreSQL's longest (63 bytes: its wake-up channel and lock class are derived), for the
tests that name it. PostgreSQL is the reference: where the two differ, the double is wrong
unless PostgreSQL is.

What a store cannot offer is a `Features` flag, as watermill's tests.Features: a test that needs
it says so with `requires(stores, "flag")`, which skips it on that store with the flag's name in
the reason (shown by `-ra`), never silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
import pytest

from outbox import Broker
from outbox.core.batches import InboxBatch
from outbox.core.envelope import InboxRow
from outbox.core.lanes import lane_for
from outbox.ports import (
    InboxDatabase,
    InboxWriter,
    OutboxSession,
    QueueDatabase,
    RelaySession,
    RelayTarget,
)
from outbox.postgres import migrate
from outbox.postgres.inbox import PostgresInbox, PostgresInboxWriter
from outbox.postgres.queries import compose
from outbox.postgres.relay_stores import PostgresOutbox
from outbox.testing.servers import create_database, drop_database
from outbox.testing.stores import MemoryInbox, MemoryOutbox
from outbox.testing.stores.relays import MemoryRelaySession

#: PostgreSQL's longest identifier: 63 bytes.
LONG_SCHEMA = "outbox_" + "s" * 56


@dataclass(frozen=True, slots=True)
class Features:
    """What a store offers beyond the contract every store keeps."""

    #: Lane locks, row locks and wake-ups hold between processes (PostgreSQL's are the
    #: server's; an in-memory store lives in one process).
    cross_process: bool
    #: `check` can find a database unreachable or its schema not migrated.
    schema_check: bool


class DeadRow(NamedTuple):
    """A dead row, as an operator reads it (producer_dead, or a dead row of consumer_queue)."""

    message_id: uuid.UUID
    topic: str
    key: bytes | None
    payload: bytes
    attempts: int
    error: str
    content_type: str
    raw_headers: Any


class StoresUnderTest:
    """One backend's outbox and inbox, as the daemons reach them, and what a test reads back
    beside the ports (dead rows, handled ids) as an operator would."""

    name: str
    features: Features

    # -- the outbox ----------------------------------------------------------------------------

    def outbox(self, relay_id: str | None = None) -> QueueDatabase[OutboxSession]:
        raise NotImplementedError

    def send(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Send one message as `Broker.send` does, committed."""
        raise NotImplementedError

    def outbox_dead(self) -> list[DeadRow]:
        raise NotImplementedError

    def outbox_error(self, message_id: uuid.UUID) -> tuple[int, str | None]:
        """The attempts and last error of a row still waiting."""
        raise NotImplementedError

    # -- the inbox -----------------------------------------------------------------------------

    def inbox_writer(self) -> InboxWriter:
        raise NotImplementedError

    def inbox(self, relay_id: str | None = None) -> InboxDatabase:
        raise NotImplementedError

    def inbox_dead(self) -> list[DeadRow]:
        raise NotImplementedError

    def processed(self) -> dict[uuid.UUID, int]:
        """The handled message ids remembered, with how often each was handled."""
        raise NotImplementedError

    # -- faults --------------------------------------------------------------------------------

    def lose(self, session: RelaySession) -> None:
        """Lose a session's connection as a killed backend is lost."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def requires(stores: StoresUnderTest, flag: str) -> None:
    """Skip the test on a store without the feature `flag`, saying so."""
    if not getattr(stores.features, flag):
        pytest.skip(f"{stores.name} does not offer Features.{flag}")


class Memory(StoresUnderTest):
    name = "memory"
    features = Features(cross_process=False, schema_check=False)

    def __init__(self) -> None:
        self.queue = MemoryOutbox()
        self.inbox_store = MemoryInbox()

    def outbox(self, relay_id: str | None = None) -> QueueDatabase[OutboxSession]:
        return self.queue.database(relay_id)

    def send(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        return self.queue.send(topic, payload, key=key, headers=headers, message_id=message_id)

    def outbox_dead(self) -> list[DeadRow]:
        return [
            DeadRow(
                uuid.UUID(row.record.message_id),
                row.record.topic,
                row.record.key,
                row.record.payload,
                row.record.attempts,
                row.error or "",
                row.record.content_type,
                None,
            )
            for _, row in sorted(self.queue.dead.items())
        ]

    def outbox_error(self, message_id: uuid.UUID) -> tuple[int, str | None]:
        row = self.queue.find(message_id)
        assert row is not None and row.record.id in self.queue.rows
        return row.record.attempts, row.error

    def inbox_writer(self) -> InboxWriter:
        return self.inbox_store.writer()

    def inbox(self, relay_id: str | None = None) -> InboxDatabase:
        return self.inbox_store.database(relay_id)

    def inbox_dead(self) -> list[DeadRow]:
        return [
            DeadRow(
                e.claimed.message_id,
                e.claimed.topic,
                e.claimed.key,
                e.claimed.payload,
                e.attempts,
                e.error or "",
                e.claimed.content_type,
                e.raw_headers,
            )
            for e in self.inbox_store.dead()
        ]

    def processed(self) -> dict[uuid.UUID, int]:
        return {m: p.handled_count for m, p in self.inbox_store.processed.items()}

    def lose(self, session: RelaySession) -> None:
        assert isinstance(session, MemoryRelaySession)
        session.lose()


class Postgres(StoresUnderTest):
    name = "postgres"
    features = Features(cross_process=True, schema_check=True)

    def __init__(self, url: str, schema: str = "outbox") -> None:
        self.url = url
        self.schema = schema
        self.broker = Broker(schema=schema)
        self.admin = psycopg.connect(url, autocommit=True)

    def target(self, kind: str, relay_id: str | None) -> RelayTarget:
        return RelayTarget(
            database_url=self.url,
            schema=self.schema,
            kind=kind,
            relay_id=relay_id or uuid.uuid4().hex,
            connect_timeout=5.0,
            application_name=f"outbox-store-test-{kind}",
        )

    def outbox(self, relay_id: str | None = None) -> QueueDatabase[OutboxSession]:
        return PostgresOutbox(self.target("producer", relay_id))

    def send(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
        message_id: uuid.UUID | None = None,
    ) -> uuid.UUID:
        with psycopg.connect(self.url) as conn, conn.transaction():
            return self.broker.send(
                conn, topic, payload, key=key, headers=headers, message_id=message_id
            )

    def _dead(self, table: str, where: str) -> list[DeadRow]:
        raw = "raw_headers" if table == "consumer_queue" else "NULL"
        rows = self.admin.execute(
            f"SELECT message_id, topic, key, payload, attempts, last_error, content_type, {raw} "
            f'FROM "{self.schema}".{table} WHERE {where} ORDER BY id'
        ).fetchall()
        return [DeadRow(*row) for row in rows]

    def outbox_dead(self) -> list[DeadRow]:
        return self._dead("producer_dead", "true")

    def outbox_error(self, message_id: uuid.UUID) -> tuple[int, str | None]:
        row = self.admin.execute(
            f'SELECT attempts, last_error FROM "{self.schema}".producer_queue '
            "WHERE message_id = %s",
            (message_id,),
        ).fetchone()
        assert row is not None
        return int(row[0]), row[1]

    def inbox_writer(self) -> InboxWriter:
        return PostgresInboxWriter(self.url, self.schema, connect_timeout=5.0)

    def inbox(self, relay_id: str | None = None) -> InboxDatabase:
        return PostgresInbox(self.target("handler", relay_id))

    def inbox_dead(self) -> list[DeadRow]:
        return self._dead("consumer_queue", "dead_at IS NOT NULL")

    def processed(self) -> dict[uuid.UUID, int]:
        rows = self.admin.execute(
            f'SELECT message_id, handled_count FROM "{self.schema}".consumer_processed'
        ).fetchall()
        return {row[0]: int(row[1]) for row in rows}

    def lose(self, session: RelaySession) -> None:
        pid = session.conn.info.backend_pid  # type: ignore[attr-defined]
        self.admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def close(self) -> None:
        self.admin.close()


@pytest.fixture(scope="session")
def long_schema_template(outbox_postgres: Any, outbox_admin_url: str) -> Iterator[str]:
    """A database migrated into a schema of 63 bytes, the template of `postgres-63`'s."""
    name = f"outbox_long_{os.getpid()}"
    drop_database(outbox_admin_url, name)
    create_database(outbox_admin_url, name)
    try:
        migrate.upgrade(outbox_postgres.url_for(name), schema=LONG_SCHEMA)
        with psycopg.connect(outbox_admin_url, autocommit=True) as conn:
            conn.execute(compose("admin_forbid_connections", database=name))
            conn.execute(compose("admin_end_sessions"), {"database": name})
        yield name
    finally:
        drop_database(outbox_admin_url, name)


@pytest.fixture(params=["memory", "postgres"])
def stores(request: pytest.FixtureRequest) -> Iterator[StoresUnderTest]:
    """Each store in turn (and `postgres-63` where a test parametrizes it: `LONG_SCHEMA_TOO`)."""
    under_test: StoresUnderTest
    created: list[str] = []
    if request.param == "memory":
        under_test = Memory()
    elif request.param == "postgres":
        under_test = Postgres(request.getfixturevalue("outbox_database_url"))
    else:
        assert request.param == "postgres-63", request.param
        admin_url = request.getfixturevalue("outbox_admin_url")
        server = request.getfixturevalue("outbox_postgres")
        template = request.getfixturevalue("long_schema_template")
        name = f"t_{uuid.uuid4().hex[:16]}"
        create_database(admin_url, name, template=template)
        created.append(name)
        under_test = Postgres(server.url_for(name), LONG_SCHEMA)
        under_test.name = "postgres-63"
    try:
        yield under_test
    finally:
        under_test.close()
        for name in created:
            drop_database(request.getfixturevalue("outbox_admin_url"), name)


#: Parametrize a test over the stores and PostgreSQL's in a 63-byte schema too.
LONG_SCHEMA_TOO = pytest.mark.parametrize(
    "stores", ["memory", "postgres", "postgres-63"], indirect=True
)


def inbox_row(
    topic: str = "orders",
    payload: bytes = b"{}",
    *,
    key: bytes | None = b"k",
    headers: Mapping[str, str | bytes] | None = None,
    message_id: uuid.UUID | None = None,
    content_type: str = "application/json",
    partition: int = 0,
    offset: int = 0,
) -> InboxRow:
    """A record as a transport decodes it, for the inbox."""
    from datetime import UTC, datetime

    message_id = message_id or uuid.uuid4()
    return InboxRow(
        message_id,
        topic,
        key,
        payload,
        dict(headers or {}),
        content_type,
        lane_for(key, message_id),
        datetime.now(UTC),
        partition,
        offset,
    )


def store(stores: StoresUnderTest, rows: Sequence[InboxRow]) -> dict[str, int]:
    """Store rows as the Consumer does (one insert); the rows stored per topic."""
    session = stores.inbox_writer().connect()
    try:
        return dict(session.insert(InboxBatch.of(rows)))
    finally:
        session.close()
