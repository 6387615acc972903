"""`drain()` and the `outbox_drain` fixture: relay, inbox and handlers until queues are empty."""

from __future__ import annotations

import time
from typing import Any, cast

import psycopg
import pytest

from outbox import Backoff, Broker, Handlers, InboxMessage
from outbox.core.errors import ConfigurationError, SchemaNotMigrated
from outbox.memory import InMemoryTransport
from outbox.pglog import PgLog, PgLogPublisher
from outbox.pglog.log import upgrade as upgrade_log
from outbox.runtime import App, Databases, Settings
from outbox.testing import DeadLetter, DrainTimeout, PostgresLog, drain
from outbox.testing.plugin import DatabaseFactory, Drain, TopicFactory

from .relay_helpers import count, running, wait_for

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)
EFFECTS = "CREATE TABLE effects (topic text, body jsonb, message_id uuid)"

broker = Broker()


def recording_handlers(*topics: str, **options: Any) -> Handlers:
    """One handler per topic, each inserting what it handled into `effects`."""
    handlers = Handlers()
    for topic in topics:

        @handlers.handler(topic, **options)
        def record(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
            conn.execute(
                "INSERT INTO effects VALUES (%s, %s, %s)",
                (message.topic, message.raw_payload.decode(), message.id),
            )

    return handlers


def prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(EFFECTS)


def send(url: str, topic: str, *bodies: dict[str, Any]) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        for n, body in enumerate(bodies):
            broker.send(conn, topic, body, key=f"k{n}")


def effects(url: str) -> list[tuple[str, dict[str, Any]]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT topic, body FROM effects ORDER BY body->>'n'").fetchall()
    return [(topic, body) for topic, body in rows]


def test_a_sent_message_is_handled_in_three_lines(
    outbox_database_url: str, outbox_drain: Drain, outbox_memory_transport: InMemoryTransport
) -> None:
    prepare(outbox_database_url)
    send(outbox_database_url, "orders.created", {"n": 1}, {"n": 2}, {"n": 3})
    result = outbox_drain(recording_handlers("orders.created"))
    assert effects(outbox_database_url) == [("orders.created", {"n": n}) for n in (1, 2, 3)]
    assert (result.relayed, result.stored, result.handled, result.failed) == (3, 3, 3, 0)
    assert result.dead == () and result.retrying == 0
    assert len(outbox_memory_transport.records("orders.created")) == 3
    assert count(outbox_database_url) == 0
    # A second drain finds nothing to do and handles nothing twice.
    again = outbox_drain(recording_handlers("orders.created"))
    assert (again.relayed, again.stored, again.handled) == (0, 0, 0)


def test_messages_sent_by_handlers_are_drained_too(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    prepare(outbox_database_url)
    handlers = recording_handlers("orders.shipped")

    @handlers.handler("orders.created")
    def ship(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        hops = message.payload["hops"]
        if hops:
            broker.send(conn, "orders.created", {"n": 0, "hops": hops - 1})
        else:
            broker.send(conn, "orders.shipped", {"n": 1})

    send(outbox_database_url, "orders.created", {"n": 0, "hops": 3})
    result = outbox_drain(handlers)
    assert effects(outbox_database_url) == [("orders.shipped", {"n": 1})]
    assert (result.relayed, result.handled) == (5, 5)


def test_a_failing_handler_ends_up_dead_and_drain_reports_it(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    handlers = Handlers()

    @handlers.handler("payments.due", max_attempts=2, backoff=FAST)
    def charge(message: InboxMessage, conn: Any) -> None:
        raise RuntimeError(f"card declined for {message.payload['n']}")

    send(outbox_database_url, "payments.due", {"n": 7})
    result = outbox_drain(handlers, wait_for_retries=True)
    assert (result.handled, result.failed) == (0, 2)
    (dead,) = result.dead
    assert dead.queue == "consumer_queue" and dead.topic == "payments.due"
    assert dead.error == "RuntimeError: card declined for 7"
    assert count(outbox_database_url, "consumer_queue", "dead_at IS NOT NULL") == 1


def test_without_waiting_a_scheduled_retry_is_left_and_counted(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    handlers = Handlers()

    @handlers.handler("payments.due", max_attempts=3, backoff=Backoff(initial=60, jitter=0))
    def charge(message: InboxMessage, conn: Any) -> None:
        raise RuntimeError("try later")

    with psycopg.connect(outbox_database_url) as conn, conn.transaction():
        for n in (1, 2):  # one key: the second message waits behind the first one's retry
            broker.send(conn, "payments.due", {"n": n}, key="customer-1")
    started = time.monotonic()
    result = outbox_drain(handlers)
    assert (result.handled, result.failed, result.retrying, result.dead) == (0, 1, 2, ())
    assert time.monotonic() - started < 10


def test_a_message_the_transport_refuses_is_reported_dead(outbox_database_url: str) -> None:
    prepare(outbox_database_url)
    send(outbox_database_url, "orders.created", {"n": 1, "pad": "x" * 2000})
    result = drain(
        recording_handlers("orders.created"),
        outbox_database_url,
        InMemoryTransport(max_message_bytes=1000),
    )
    (dead,) = result.dead
    assert dead.queue == "producer_dead"
    assert dead.error.startswith("MSG_SIZE_TOO_LARGE")
    assert (result.relayed, result.handled) == (0, 0)


def test_a_timeout_says_what_remains(outbox_database_url: str, outbox_drain: Drain) -> None:
    handlers = Handlers()

    @handlers.handler("slow.work")
    def slow(message: InboxMessage, conn: Any) -> None:
        time.sleep(1.5)

    send(outbox_database_url, "slow.work", {"n": 1})
    started = time.monotonic()
    with pytest.raises(DrainTimeout) as raised:
        outbox_drain(handlers, timeout=0.5)
    text = str(raised.value)
    assert "did not empty the queues within 0.5s" in text
    assert "consumer_queue: 1 pending rows due" in text
    assert "topic 'slow.work' attempts 0 due" in text
    assert time.monotonic() - started < 10  # the daemons were stopped


def test_sender_and_receiver_in_two_databases(outbox_database_factory: DatabaseFactory) -> None:
    orders, shipping = outbox_database_factory(), outbox_database_factory()
    prepare(shipping)
    send(orders, "orders.created", {"n": 1}, {"n": 2})
    result = drain(
        recording_handlers("orders.created"),
        shipping,
        InMemoryTransport(),
        producer_database_urls=[orders],
    )
    assert effects(shipping) == [("orders.created", {"n": 1}), ("orders.created", {"n": 2})]
    assert result.handled == 2 and count(orders) == 0


def test_drain_through_the_real_broker(
    outbox_database_url: str,
    outbox_drain: Drain,
    outbox_kafka_bootstrap: str,
    outbox_topic_factory: TopicFactory,
) -> None:
    prepare(outbox_database_url)
    created, failing = outbox_topic_factory(), outbox_topic_factory()
    handlers = recording_handlers(created)

    @handlers.handler(failing, max_attempts=1)
    def fail(message: InboxMessage, conn: Any) -> None:
        raise ValueError("poison")

    send(outbox_database_url, created, {"n": 1}, {"n": 2})
    send(outbox_database_url, failing, {"n": 3})
    result = outbox_drain(handlers, transport=outbox_kafka_bootstrap)
    assert effects(outbox_database_url) == [(created, {"n": 1}), (created, {"n": 2})]
    assert (result.relayed, result.stored, result.handled) == (3, 3, 2)
    assert [(d.queue, d.topic, d.error) for d in result.dead] == [
        ("consumer_queue", failing, "ValueError: poison")
    ]
    # The group resumes after what it stored: a second drain stores only the new message.
    send(outbox_database_url, created, {"n": 4})
    again = outbox_drain(handlers, transport=outbox_kafka_bootstrap)
    assert (again.relayed, again.stored, again.handled) == (1, 1, 1)


def test_drain_through_the_postgres_log(
    outbox_database_url: str, outbox_drain: Drain, outbox_log_url: str
) -> None:
    """The same as through the broker, with the log kept in PostgreSQL as a URL string."""
    prepare(outbox_database_url)
    handlers = recording_handlers("orders.created")

    @handlers.handler("orders.failing", max_attempts=1)
    def fail(message: InboxMessage, conn: Any) -> None:
        raise ValueError("poison")

    send(outbox_database_url, "orders.created", {"n": 1}, {"n": 2})
    send(outbox_database_url, "orders.failing", {"n": 3})
    result = outbox_drain(handlers, transport=outbox_log_url)
    assert effects(outbox_database_url) == [
        ("orders.created", {"n": 1}),
        ("orders.created", {"n": 2}),
    ]
    assert (result.relayed, result.stored, result.handled) == (3, 3, 2)
    assert [(d.queue, d.topic, d.error) for d in result.dead] == [
        ("consumer_queue", "orders.failing", "ValueError: poison")
    ]
    # The group resumes after what it committed: a second drain stores only the new message.
    send(outbox_database_url, "orders.created", {"n": 4})
    again = outbox_drain(handlers, transport=PostgresLog(outbox_log_url, partitions=2))
    assert (again.relayed, again.stored, again.handled) == (1, 1, 1)
    with psycopg.connect(outbox_log_url) as conn:
        lag = conn.execute(
            "SELECT sum(p.next_offset - o.next_offset) FROM outbox_log.log_partitions p "
            "JOIN outbox_log.log_group_offsets o ON o.partition_id = p.id"
        ).fetchone()
    assert lag == (0,)


def test_drain_waits_for_log_records_it_did_not_relay(
    outbox_database_factory: DatabaseFactory, outbox_log_url: str
) -> None:
    """Records already in the log (another service's relay wrote them) count as lag: drain
    returns only once its group has stored them, not merely once its own relay is done."""
    other, receiver = outbox_database_factory(), outbox_database_factory()
    prepare(receiver)
    send(other, "orders.created", *({"n": n} for n in range(50)))
    # Relay the other service's outbox into the log by hand, with no drain running.
    producer = App(
        Settings(databases=Databases.of(other)),
        publishers=lambda: PgLogPublisher(outbox_log_url),
    ).producer()
    with running(producer):
        wait_for(lambda: count(other) == 0, 30, "the other service's relay")
    result = drain(recording_handlers("orders.created"), receiver, outbox_log_url)
    assert (result.relayed, result.stored, result.handled) == (0, 50, 50)
    assert len(effects(receiver)) == 50
    # A log database that is not migrated: one clear error, before any daemon starts.
    bare = outbox_database_factory(migrated=False)
    with pytest.raises(SchemaNotMigrated, match="no log schema 'outbox_log'"):
        drain(recording_handlers("t"), receiver, PostgresLog(bare))
    upgrade_log(bare, "other_log")
    send(receiver, "t", {"n": 1})
    result = drain(recording_handlers("t"), receiver, PostgresLog(bare, "other_log"))
    assert result.handled == 1


def test_drain_is_not_fooled_by_a_record_written_past_a_partitions_end(
    outbox_database_factory: DatabaseFactory, outbox_log_url: str
) -> None:
    """A record written by hand far past a partition's counter is never read (the readers stop
    at the counter); counted as where the group starts, it made the lag negative, and drain
    returned before the group had stored the records really there."""
    other, receiver = outbox_database_factory(), outbox_database_factory()
    prepare(receiver)
    send(other, "orders.created", *({"n": n} for n in range(50)))
    producer = App(
        Settings(databases=Databases.of(other)),
        publishers=lambda: PgLogPublisher(outbox_log_url),
    ).producer()
    with running(producer):
        wait_for(lambda: count(other) == 0, 30, "the other service's relay")
    # A partition with no record yet (added by an operator), and junk written far past its end.
    log = PgLog(outbox_log_url)
    log.grow_topic("orders.created", log.partitions("orders.created") + 1)
    with psycopg.connect(outbox_log_url) as conn:
        conn.execute(
            "INSERT INTO outbox_log.log_records (partition_id, log_offset, value) "
            "SELECT p.id, 1000000, 'junk' FROM outbox_log.log_partitions p "
            "JOIN outbox_log.log_topics t ON t.id = p.topic_id "
            "WHERE t.name = 'orders.created' ORDER BY p.partition DESC LIMIT 1"
        )
    result = drain(recording_handlers("orders.created"), receiver, outbox_log_url)
    assert (result.relayed, result.stored, result.handled) == (0, 50, 50)
    assert len(effects(receiver)) == 50


def test_bad_arguments_are_refused(outbox_database_url: str) -> None:
    with pytest.raises(ConfigurationError, match="at least one handler"):
        drain(Handlers(), outbox_database_url, InMemoryTransport())
    with pytest.raises(ConfigurationError, match=r"needs an outbox\.Handlers registry, got func"):
        drain(cast(Any, recording_handlers), outbox_database_url, InMemoryTransport())
    with pytest.raises(ConfigurationError, match="a PostgresLog"):
        drain(recording_handlers("t"), outbox_database_url, cast(Any, 42))


def test_dead_letters_read_well() -> None:
    import uuid

    letter = DeadLetter("consumer_queue", uuid.UUID(int=1), "t", "ValueError: x")
    assert str(letter) == (
        "consumer_queue: message 00000000-0000-0000-0000-000000000001 topic 't': ValueError: x"
    )


def test_messages_to_a_topic_no_handler_reads_are_named(
    outbox_database_url: str, outbox_drain: Drain, caplog: pytest.LogCaptureFixture
) -> None:
    """A misspelt topic relayed and never stored passed silently (handled 0, no error)."""
    prepare(outbox_database_url)
    send(outbox_database_url, "orders.creatd", {"n": 1})
    send(outbox_database_url, "orders.created", {"n": 2})
    result = outbox_drain(recording_handlers("orders.created"))
    assert (result.relayed, result.handled) == (2, 1)
    assert result.unhandled_topics == ("orders.creatd",)
    assert any("'orders.creatd', which no handler" in r.getMessage() for r in caplog.records)


def test_a_dead_letters_error_is_its_exceptions_line(
    outbox_database_url: str, outbox_drain: Drain
) -> None:
    """A message over several lines (PostgreSQL's, SQLAlchemy's) is summed up by the
    exception's line, not by the traceback's last line (a caret, a link)."""
    handlers = Handlers()

    @handlers.handler("t", max_attempts=1)
    def broken(message: InboxMessage, conn: Any) -> None:
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    send(outbox_database_url, "t", {"n": 1})
    (dead,) = outbox_drain(handlers).dead
    assert dead.error.startswith(
        'psycopg.errors.UndefinedTable: relation "no_such_table" does not exist'
    )
