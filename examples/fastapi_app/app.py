"""A typed FastAPI service that sends and handles its own messages, all in the web process.

`POST /notes {"text": ...}` (a `NewNote`, validated by pydantic) inserts a `Note` and sends a
`NoteCreated` on the `NOTES_CREATED` Topic in ONE transaction of the request's `AsyncSession`:
the message exists if and only if the note does. The `Broker` comes to the endpoint as a FastAPI
dependency, as the session does (one per request). `count_note`, the async handler of that
Topic, gets the message back as a `NoteCreated` and records it in `note_events` in the handler
runner's transaction (once per message, whatever the redeliveries). `GET /notes/{id}` shows the
note and how often it was handled (1, once relayed, stored and handled). The relay, the consumer
and the handler run in the app's lifespan (`OutboxRuntime`, as `outbox run` would run them);
`GET /readyz` answers for the three.

Configured by the environment, as the daemons are::

    OUTBOX_DATABASE_URL=postgresql://app@db/notes   # the service's database (outbox migrate)
    OUTBOX_KAFKA_BOOTSTRAP=kafka:9092               # or OUTBOX_TRANSPORT=postgres and
    OUTBOX_GROUP=notes                              #    OUTBOX_LOG_URL=postgresql://...
    NOTES_TOPIC=notes.created                       # (the default)

    uvicorn examples.fastapi_app.app:app --host 127.0.0.1 --port 8000

`create_app(run_outbox=False)` is the same app without the runtime (a test of the sending side,
or a web tier whose relays run as their own processes: docs/how-to/one-process.md).
Librdkafka settings (SASL and the like) go in `kafka_config` of `runtime_from_environment`:
read them from the environment or a secrets file there, never from a command line.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, DateTime, Text, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Broker, Handlers, InboxMessage, Topic
from outbox.observability.logs import configure_logging
from outbox.observability.runtime import ObservabilityConfig
from outbox.postgres.migrate import sqlalchemy_url
from outbox.runtime import OutboxRuntime

# -- the request, the answers and the message ---------------------------------------------------


class NewNote(BaseModel):
    """The body of `POST /notes`."""

    text: str = Field(min_length=1, max_length=10_000)


class CreatedNote(BaseModel):
    """The answer to `POST /notes`: the note and the id of the message announcing it."""

    id: int
    text: str
    message_id: UUID


class NoteView(BaseModel):
    """The answer to `GET /notes/{id}`."""

    id: int
    text: str
    handled: int


class NoteCreated(BaseModel):
    """The message: a note was created (its transaction committed)."""

    note_id: int
    text: str
    created_at: datetime


#: Declared once; the sender and the handler both use it. The name can be set through
#: NOTES_TOPIC (the tests give each run a topic of its own).
NOTES_CREATED = Topic(
    os.environ.get("NOTES_TOPIC", "notes.created"),
    NoteCreated,
    key="note_id",  # the notes' messages keep their order per note
    description="A note was created.",
)

# -- the tables ---------------------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "notes"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class NoteEvent(Base):
    """A handled `NoteCreated`. No unique constraint on `message_id`: only the inbox keeps a
    message from being handled twice, so a second handling would show as a second row."""

    __tablename__ = "note_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    note_id: Mapped[int] = mapped_column(BigInteger)
    message_id: Mapped[UUID]


# -- the receiving side -------------------------------------------------------------------------

#: Async callbacks get an `AsyncSession` whose transaction also marks the message processed.
handlers = Handlers(transaction="sqlalchemy")
#: This service also sends NOTES_CREATED (`outbox asyncapi examples.fastapi_app.app` says so).
handlers.sends(NOTES_CREATED)


@handlers.handler(NOTES_CREATED)
async def count_note(message: InboxMessage[NoteCreated], session: AsyncSession) -> None:
    """Record that the note was seen; commits with "message processed", or not at all."""
    session.add(NoteEvent(note_id=message.payload.note_id, message_id=message.id))


# -- the dependencies ---------------------------------------------------------------------------

broker = Broker()


def get_broker() -> Broker:
    """The Broker endpoints send with (a test may override this dependency)."""
    return broker


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One session per request; what it did not commit is rolled back when it closes."""
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    async with sessions() as session:
        yield session


BrokerDep = Annotated[Broker, Depends(get_broker)]
SessionDep = Annotated[AsyncSession, Depends(get_session)]

# -- the endpoints ------------------------------------------------------------------------------

router = APIRouter()


@router.post("/notes", status_code=201)
async def create_note(new: NewNote, session: SessionDep, broker: BrokerDep) -> CreatedNote:
    """Insert the note and send its `NoteCreated` in one transaction: both or neither."""
    async with session.begin():  # commits at the end of the block; any exception rolls back
        note = Note(text=new.text, created_at=datetime.now(UTC))
        session.add(note)
        await session.flush()  # the note's id
        message_id = await broker.send_async(
            session,
            NOTES_CREATED,
            NoteCreated(note_id=note.id, text=note.text, created_at=note.created_at),
        )
    return CreatedNote(id=note.id, text=note.text, message_id=message_id)


@router.get("/notes/{note_id}")
async def read_note(note_id: int, session: SessionDep) -> NoteView:
    note = await session.get(Note, note_id)
    if note is None:
        raise HTTPException(404, f"no note {note_id}")
    handled = await session.scalar(
        select(func.count()).select_from(NoteEvent).where(NoteEvent.note_id == note_id)
    )
    return NoteView(id=note.id, text=note.text, handled=handled or 0)


@router.get("/readyz", response_class=PlainTextResponse)
def readyz(request: Request) -> PlainTextResponse:
    runtime: OutboxRuntime | None = request.app.state.outbox
    if runtime is None:
        return PlainTextResponse("the outbox runtime does not run in this process\n", 503)
    ok, reason = runtime.ready()
    return PlainTextResponse(reason + "\n", status_code=200 if ok else 503)


# -- the app ------------------------------------------------------------------------------------


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


def create_app(*, run_outbox: bool = True) -> FastAPI:
    """The app: its tables created and its session factory made at start-up, and, with
    `run_outbox`, the relay, consumer and handler started before the first request and drained
    at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_async_engine(sqlalchemy_url(database_url()))  # postgresql+psycopg://
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
        app.state.outbox = None
        try:
            if not run_outbox:
                yield
                return
            # outbox's log lines (secrets masked) on stderr, as the daemons write them;
            # uvicorn's own loggers keep their handlers.
            configure_logging(os.environ.get("OUTBOX_LOG_LEVEL", "INFO"), "text")
            async with runtime_from_environment() as runtime:  # checks passed, threads started
                app.state.outbox = runtime
                yield
        finally:
            await engine.dispose()

    app = FastAPI(title="notes", lifespan=lifespan)
    app.include_router(router)
    return app


app = create_app()
