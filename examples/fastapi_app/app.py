"""A FastAPI service that sends and handles its own messages, all in the web process.

`POST /notes {"text": ...}` inserts a note and sends `notes.created` in ONE transaction: the
message exists if and only if the note does. `count_note`, the handler of that topic, records
the note in `note_events` in the handler runner's transaction (once per message, whatever the
redeliveries). `GET /notes/{id}` shows the note and how often it was handled (1, once relayed,
stored and handled). The relay, the consumer and the handler run in the app's lifespan
(`OutboxRuntime`, as `outbox run` would run them); `GET /readyz` answers for the three.

Configured by the environment, as the daemons are::

    OUTBOX_DATABASE_URL=postgresql://app@db/notes   # the service's database (outbox migrate)
    OUTBOX_KAFKA_BOOTSTRAP=kafka:9092               # or OUTBOX_TRANSPORT=postgres and
    OUTBOX_GROUP=notes                              #    OUTBOX_LOG_URL=postgresql://...
    NOTES_TOPIC=notes.created                       # (the default)

    uvicorn examples.fastapi_app.app:app --host 127.0.0.1 --port 8000

Librdkafka settings (SASL and the like) go in `kafka_config` of `runtime_from_environment`:
read them from the environment or a secrets file there, never from a command line.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from outbox import Broker, Handlers, InboxMessage
from outbox.observability.logs import configure_logging
from outbox.observability.runtime import ObservabilityConfig
from outbox.runtime import OutboxRuntime

TOPIC = os.environ.get("NOTES_TOPIC", "notes.created")

SCHEMA = """
CREATE TABLE IF NOT EXISTS notes (id bigserial PRIMARY KEY, text text NOT NULL);
CREATE TABLE IF NOT EXISTS note_events (note_id bigint NOT NULL, message_id uuid NOT NULL);
"""

broker = Broker()
handlers = Handlers()


@handlers.handler(TOPIC)
def count_note(message: InboxMessage[Any], conn: psycopg.Connection[Any]) -> None:
    """Record that the note was seen; commits with "message processed", or not at all."""
    conn.execute(
        "INSERT INTO note_events (note_id, message_id) VALUES (%s, %s)",
        (message.payload["note_id"], message.id),
    )


def database_url() -> str:
    return os.environ["OUTBOX_DATABASE_URL"]


def runtime_from_environment() -> OutboxRuntime:
    """The relay, consumer and handler of this service, configured as `outbox run` is."""
    transport = os.environ.get("OUTBOX_TRANSPORT", "kafka")
    return OutboxRuntime(
        handlers,
        database_url=database_url(),
        group=os.environ.get("OUTBOX_GROUP", "notes"),
        transport=transport,
        kafka_bootstrap=os.environ.get("OUTBOX_KAFKA_BOOTSTRAP", ""),
        kafka_config={},  # e.g. {"security.protocol": "SASL_SSL", "sasl.password": secret}
        log_url=os.environ.get("OUTBOX_LOG_URL"),
        producer={"poll_interval": 0.2},
        handler={"poll_interval": 0.2, "concurrency": 2},
        # The checks behind /readyz, served also on a loopback port of their own (any free one).
        observability=ObservabilityConfig(health_port=0, health_host="127.0.0.1"),
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # outbox's log lines (secrets masked) on stderr, as the daemons write them; uvicorn's own
    # loggers keep their handlers.
    configure_logging(os.environ.get("OUTBOX_LOG_LEVEL", "INFO"), "text")
    with psycopg.connect(database_url()) as conn:
        conn.execute(SCHEMA)
    runtime = runtime_from_environment()
    async with runtime:  # started (checks passed) before the first request; drained at exit
        app.state.outbox = runtime
        yield


app = FastAPI(lifespan=lifespan)


class NewNote(BaseModel):
    text: str


@app.post("/notes", status_code=201)
def create_note(note: NewNote) -> dict[str, Any]:
    with psycopg.connect(database_url()) as conn, conn.transaction():
        row = conn.execute(
            "INSERT INTO notes (text) VALUES (%s) RETURNING id", (note.text,)
        ).fetchone()
        assert row is not None
        message_id = broker.send(conn, TOPIC, {"note_id": row[0]}, key=str(row[0]))
    return {"id": row[0], "message_id": str(message_id)}


@app.get("/notes/{note_id}")
def read_note(note_id: int) -> dict[str, Any]:
    with psycopg.connect(database_url()) as conn:
        row = conn.execute(
            "SELECT text, (SELECT count(*) FROM note_events WHERE note_id = notes.id) "
            "FROM notes WHERE id = %s",
            (note_id,),
        ).fetchone()
    if row is None:
        raise HTTPException(404, f"no note {note_id}")
    return {"id": note_id, "text": row[0], "handled": row[1]}


@app.get("/readyz", response_class=PlainTextResponse)
def readyz() -> PlainTextResponse:
    ok, reason = app.state.outbox.ready()
    return PlainTextResponse(reason + "\n", status_code=200 if ok else 503)
