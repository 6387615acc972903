"""The inbox leg against real PostgreSQL and a real broker: Consumer, Handler, dead letters."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer as KafkaProducer
from psycopg.types.json import Jsonb
from sqlalchemy import text

from outbox import Backoff, Broker, Handlers, InboxMessage, Message
from outbox.core.batches import InboxBatch
from outbox.core.headers import to_json
from outbox.core.lanes import lane_for
from outbox.kafka.subscriber import InboxRow, foreign_id
from outbox.postgres.inbox import insert_params
from outbox.postgres.queries import channel, queries

from . import inbox_app
from .relay_helpers import (
    RelayTransport,
    consumer_thread,
    count,
    handler_thread,
    running,
    spawn_consumer,
    spawn_handler,
    wait_for,
)

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0)


def _prepare(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)


def _effects(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT message_id, attempt, body FROM effects").fetchall()


def put(
    url: str, topic: str, bodies: list[dict[str, Any]], keys: list[str | None]
) -> list[uuid.UUID]:
    """Store messages in the inbox with the Consumer's own statement."""
    from datetime import UTC, datetime

    rows = []
    for offset, (body, key) in enumerate(zip(bodies, keys, strict=True)):
        mid = uuid.uuid4()
        raw_key = key.encode() if key is not None else None
        rows.append(
            InboxRow(
                message_id=mid,
                topic=topic,
                key=raw_key,
                payload=json.dumps(body).encode(),
                headers={},
                content_type="application/json",
                lane=lane_for(raw_key, mid),
                created_at=datetime.now(UTC),
                partition=0,
                offset=offset,
            )
        )
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute(
            queries("outbox")["inbox_insert"],
            insert_params(InboxBatch.of(rows), channel("outbox", "consumer_queue")),
        )
    return [r.message_id for r in rows]


def processed(url: str) -> int:
    return count(url, "consumer_processed")


def dead(url: str) -> int:
    return count(url, "consumer_queue", "dead_at IS NOT NULL")


def _produce_raw(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, list[Any]]]
) -> None:
    producer = KafkaProducer({"bootstrap.servers": bootstrap})
    for key, value, headers in records:
        producer.produce(topic, value=value, key=key, headers=headers)
    assert producer.flush(10) == 0


def test_same_kafka_message_twice_is_stored_and_handled_once(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    _prepare(url)
    mid = uuid.uuid4()
    record = (
        b"k",
        b'{"n": 1}',
        [("outbox-message-id", str(mid).encode()), ("content-type", b"application/json")],
    )
    _produce_raw(outbox_kafka_bootstrap, outbox_topic, [record, record])

    handlers = Handlers()
    calls: list[uuid.UUID] = []

    @handlers.handler(outbox_topic)
    def on_message(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        calls.append(message.id)
        conn.execute("INSERT INTO effects VALUES (%s, %s, %s)", (message.id, message.attempt, ""))

    with consumer_thread(url, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.received == 2, 30, "both deliveries")
    assert count(url, "consumer_queue") == 1
    with handler_thread(url, handlers):
        wait_for(lambda: processed(url) == 1, 30, "the message to be handled")

    # A third delivery after it was handled: the processed row is still remembered.
    _produce_raw(outbox_kafka_bootstrap, outbox_topic, [record])
    with consumer_thread(url, outbox_kafka_bootstrap, [outbox_topic]) as consumer:
        wait_for(lambda: consumer.received == 1, 30, "the third delivery")
        assert consumer.stored == 0
    with handler_thread(url, handlers) as runner:
        wait_for(lambda: runner.lanes, 10, "the handler to start")
    assert calls == [mid]
    assert [r[0] for r in _effects(url)] == [mid]


def test_handler_failing_twice_runs_three_times_and_its_effect_exists_once(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    _prepare(url)
    handlers = Handlers()
    attempts: list[int] = []

    @handlers.handler("flaky", max_attempts=5, backoff=FAST)
    def flaky(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        attempts.append(message.attempt)
        conn.execute("INSERT INTO effects VALUES (%s, %s, %s)", (message.id, message.attempt, ""))
        if message.attempt < 3:
            raise RuntimeError("not yet")

    [mid] = put(url, "flaky", [{"n": 1}], ["k"])
    with handler_thread(url, handlers):
        wait_for(lambda: processed(url) == 1, 30, "the third attempt to succeed")
    assert attempts == [1, 2, 3]
    assert _effects(url) == [(mid, 3, "")]  # the two failed attempts' writes rolled back
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT attempts FROM outbox.consumer_processed").fetchone()
        assert conn.execute("SELECT count(*) FROM outbox.consumer_queue").fetchone() == (0,)
    assert row == (3,)


def test_poison_message_goes_dead_others_flow_then_requeue_handles_it_once(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    _prepare(url)
    handlers = Handlers()
    handlers.include(inbox_app.handlers)  # the registry of a "service module"
    topic = inbox_app.TOPIC
    bodies = [{"poison": True}] + [{"n": i} for i in range(20)]
    keys = ["bad"] + [f"good-{i % 4}" for i in range(20)]
    ids = put(url, topic, bodies, keys)
    with handler_thread(url, handlers, concurrency=2):
        wait_for(lambda: processed(url) == 20 and dead(url) == 1, 60, "20 handled and 1 dead")
    with psycopg.connect(url) as conn:
        attempts, error = conn.execute(
            "SELECT attempts, last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
        ).fetchone()
        assert attempts == 3  # max_attempts of the handler
        assert "ValueError: poison message" in error
        assert "Traceback" in error
        conn.execute("INSERT INTO cured VALUES (1)")
        conn.commit()
    effects_before = Counter(r[0] for r in _effects(url))
    assert ids[0] not in effects_before

    with handler_thread(url, handlers):
        requeue = subprocess_cli("dead-letters", "requeue", str(ids[0]), "--database-url", url)
        assert requeue.returncode == 0, requeue.stderr
        wait_for(lambda: processed(url) == 21, 30, "the requeued message")
    effects = Counter(r[0] for r in _effects(url))
    assert effects[ids[0]] == 1
    assert all(n == 1 for n in effects.values())


def subprocess_cli(*args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "outbox.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_unknown_topic_is_dead_lettered_with_the_reason(outbox_database_url: str) -> None:
    handlers = Handlers()
    handlers.handler("known")(lambda message, conn: None)
    put(outbox_database_url, "unknown.topic", [{"x": 1}], [None])
    with handler_thread(outbox_database_url, handlers):
        wait_for(lambda: dead(outbox_database_url) == 1, 30, "the dead letter")
    with psycopg.connect(outbox_database_url) as conn:
        error = conn.execute("SELECT last_error FROM outbox.consumer_queue").fetchone()[0]
    assert "no handler registered for topic 'unknown.topic'" in error
    assert "known" in error


@pytest.mark.parametrize("transaction", ["psycopg", "sqlalchemy"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_handler_writes_commit_with_processed_or_not_at_all(
    outbox_database_url: str, transaction: str, flavour: str
) -> None:
    url = outbox_database_url
    _prepare(url)
    handlers = Handlers(transaction=transaction)  # type: ignore[arg-type]
    statement = "INSERT INTO effects VALUES (:id, :attempt, :body)"

    def write(message: InboxMessage) -> dict[str, Any]:
        return {"id": message.id, "attempt": message.attempt, "body": message.payload["body"]}

    if transaction == "psycopg":
        sql = "INSERT INTO effects VALUES (%(id)s, %(attempt)s, %(body)s)"
        if flavour == "sync":

            def handle(message: InboxMessage, conn: Any) -> None:
                conn.execute(sql, write(message))
                if message.payload["body"] == "bad":
                    raise RuntimeError("after writing")
        else:

            async def handle(message: InboxMessage, conn: Any) -> None:  # type: ignore[misc]
                assert isinstance(conn, psycopg.AsyncConnection)
                await conn.execute(sql, write(message))
                if message.payload["body"] == "bad":
                    raise RuntimeError("after writing")
    elif flavour == "sync":

        def handle(message: InboxMessage, session: Any) -> None:  # type: ignore[misc]
            from sqlalchemy.orm import Session

            assert isinstance(session, Session)
            session.execute(text(statement), write(message))
            if message.payload["body"] == "bad":
                raise RuntimeError("after writing")
    else:

        async def handle(message: InboxMessage, session: Any) -> None:  # type: ignore[misc]
            from sqlalchemy.ext.asyncio import AsyncSession

            assert isinstance(session, AsyncSession)
            await session.execute(text(statement), write(message))
            if message.payload["body"] == "bad":
                raise RuntimeError("after writing")

    handlers.handler("effects", max_attempts=1)(handle)
    good, bad = put(url, "effects", [{"body": "good"}, {"body": "bad"}], ["a", "b"])
    with handler_thread(url, handlers):
        wait_for(lambda: processed(url) == 1 and dead(url) == 1, 30, "one handled, one dead")
    assert _effects(url) == [(good, 1, "good")]
    with psycopg.connect(url) as conn:
        state = dict(
            conn.execute(
                "SELECT message_id, true FROM outbox.consumer_processed UNION ALL"
                " SELECT message_id, false FROM outbox.consumer_queue"
            ).fetchall()
        )
    assert state == {good: True, bad: False}


def test_per_key_order_in_the_handler(outbox_database_url: str) -> None:
    url = outbox_database_url
    _prepare(url)
    handlers = Handlers()

    @handlers.handler("ordered", backoff=FAST)
    def ordered(message: InboxMessage, conn: Any) -> None:
        body = message.payload
        if body["seq"] == 3 and message.attempt == 1:
            raise RuntimeError("first try of seq 3 fails; 4.. must wait behind it")
        # Only database writes are exactly-once (a callback can run again when its batch is
        # rolled back), so the order is read from what committed.
        conn.execute(
            "INSERT INTO effects VALUES (%s, %s, %s)",
            (message.id, message.attempt, json.dumps(body)),
        )

    keys = [f"k{i % 5}" for i in range(200)]
    bodies = [{"key": k, "seq": i // 5} for i, k in enumerate(keys)]
    put(url, "ordered", bodies, keys)
    with handler_thread(url, handlers, concurrency=3, batch_size=50):
        wait_for(lambda: processed(url) == 200, 60, "all 200")
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT body FROM effects ORDER BY seq").fetchall()
    seen: dict[str, list[int]] = {}
    for (body,) in rows:
        data = json.loads(body)
        seen.setdefault(data["key"], []).append(data["seq"])
    assert seen == {f"k{i}": list(range(40)) for i in range(5)}


def test_foreign_records_get_a_deterministic_id_and_raw_payload(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    _produce_raw(outbox_kafka_bootstrap, outbox_topic, [(None, b"\x00not json", [("h", b"v")])])
    with consumer_thread(outbox_database_url, outbox_kafka_bootstrap, [outbox_topic]) as c:
        wait_for(lambda: c.stored == 1, 30, "the foreign record")
    with psycopg.connect(outbox_database_url) as conn:
        row = conn.execute(
            "SELECT message_id, source_partition, source_offset, content_type, payload, headers "
            "FROM outbox.consumer_queue"
        ).fetchone()
    mid, partition, offset, content_type, payload, headers = row
    millis = round(row_created_at(outbox_database_url).timestamp() * 1000)  # the record's
    headers_sent = [("h", b"v")]
    assert mid == foreign_id(
        outbox_topic, partition, offset, millis, None, b"\x00not json", headers_sent
    )
    assert content_type == "application/octet-stream"
    assert bytes(payload) == b"\x00not json"
    assert headers == {"h": "v"}


def row_created_at(url: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT created_at FROM outbox.consumer_queue").fetchone()
    assert row is not None
    return row[0]


def test_foreign_records_are_not_lost_when_the_topic_is_re_created(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    # defect 4: the id was uuid5(topic/partition/offset), so the first record of a re-created
    # topic met the id of the old topic's first record and was dropped as a duplicate
    from confluent_kafka.admin import AdminClient, NewTopic

    url, bootstrap = outbox_database_url, outbox_kafka_bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(timeout=5).topics[outbox_topic].partitions)
    _produce_raw(bootstrap, outbox_topic, [(b"k", b"before", [])])
    with consumer_thread(url, bootstrap, [outbox_topic], group="g-before") as c:
        wait_for(lambda: c.stored == 1, 30, "the first record")
    admin.delete_topics([outbox_topic], operation_timeout=10)[outbox_topic].result(10)
    wait_for(lambda: outbox_topic not in admin.list_topics(timeout=5).topics, 10, "deletion")
    admin.create_topics([NewTopic(outbox_topic, partitions)])[outbox_topic].result(10)
    _produce_raw(bootstrap, outbox_topic, [(b"k", b"after", [])])
    with consumer_thread(url, bootstrap, [outbox_topic], group="g-after") as c:
        wait_for(lambda: c.received == 1, 30, "the record of the re-created topic")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT source_offset, payload FROM outbox.consumer_queue ORDER BY id"
        ).fetchall()
    # Same key, so the same partition: the same offset, and both stored.
    assert [(offset, bytes(payload)) for offset, payload in rows] == [(0, b"before"), (0, b"after")]


def test_dedup_window_retention_forgets_processed_rows(outbox_database_url: str) -> None:
    handlers = Handlers()
    handlers.handler("gone")(lambda message, conn: None)
    put(outbox_database_url, "gone", [{"n": i} for i in range(30)], [None] * 30)
    with handler_thread(
        outbox_database_url, handlers, dedup_window=0, retention_interval=0, retention_batch=7
    ):
        wait_for(lambda: count(outbox_database_url, "consumer_queue") == 0, 30, "retention")


def test_end_to_end_with_daemons_killed_and_restarted(
    outbox_database_url: str,
    relay_transport: RelayTransport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Producer -> transport -> Consumer (SIGKILLed once: its batch is delivered again) ->
    Handler (SIGKILLed once): each once, on Kafka and on the log kept in PostgreSQL."""
    url = outbox_database_url
    outbox_topic = relay_transport.topic()
    outbox_kafka_bootstrap = relay_transport.endpoint
    _prepare(url)
    monkeypatch.setenv("INBOX_APP_TOPIC", outbox_topic)
    total = 400
    with psycopg.connect(url) as conn, conn.transaction():
        ids = Broker().send_many(
            conn,
            [
                Message(outbox_topic, {"n": i, "sleep": 0.002}, key=f"k{i % 7}")
                for i in range(total)
            ],
        )
    with running(relay_transport.producer(url)):
        wait_for(lambda: count(url) == 0, 60, "the relay")

    group = f"g-{outbox_topic}"
    with spawn_consumer(
        url, outbox_kafka_bootstrap, outbox_topic, group, "--batch-size", "50"
    ) as c:
        wait_for(lambda: count(url, "consumer_queue") > 0, 60, "the consumer to store")
        c.signal(signal.SIGKILL)
        c.wait(10)
    with spawn_handler(url, "tests.integration.inbox_app:handlers", "--batch-size", "20") as h:
        wait_for(lambda: processed(url) > 0, 60, "the handler to start handling")
        h.signal(signal.SIGKILL)
        h.wait(10)
    assert processed(url) > 0 and count(url, "consumer_queue") > 0, "the kill should land mid-way"
    with (
        spawn_consumer(url, outbox_kafka_bootstrap, outbox_topic, group) as c,
        spawn_handler(url, "tests.integration.inbox_app:handlers") as h,
    ):
        wait_for(lambda: processed(url) == total, 120, "every message handled")
        for daemon in (h, c):
            daemon.terminate()
            assert daemon.wait(30) == 0, daemon.output()
    assert count(url, "consumer_queue") == 0  # every handled row left it
    effects = Counter(r[0] for r in _effects(url))
    assert set(effects) == set(ids)
    assert max(effects.values()) == 1, "a handler effect was applied twice"


def test_unordered_handler_lets_later_messages_of_a_key_pass_a_failing_one(
    outbox_database_url: str,
) -> None:
    handlers = Handlers()
    order: list[int] = []

    @handlers.handler("loose", ordered=False, backoff=Backoff(initial=2.0, maximum=2.0, jitter=0))
    def loose(message: InboxMessage, conn: Any) -> None:
        if message.payload["seq"] == 0 and message.attempt == 1:
            raise RuntimeError("retry me later")
        order.append(message.payload["seq"])

    put(outbox_database_url, "loose", [{"seq": i} for i in range(5)], ["same"] * 5)
    with handler_thread(outbox_database_url, handlers):
        wait_for(lambda: processed(outbox_database_url) == 5, 30, "all five")
    # 1..4 did not wait for 0's retry (ordered handlers would give [0, 1, 2, 3, 4]).
    assert order == [1, 2, 3, 4, 0]


@pytest.mark.parametrize("transaction", ["psycopg", "sqlalchemy"])
def test_a_failure_inside_a_batch_rolls_back_only_its_own_writes(
    outbox_database_url: str, transaction: str
) -> None:
    url = outbox_database_url
    _prepare(url)
    handlers = Handlers(transaction=transaction)  # type: ignore[arg-type]

    @handlers.handler("batch", max_attempts=1, ordered=False)
    def write_then_maybe_fail(message: InboxMessage, tx: Any) -> None:
        params = {"id": message.id, "n": message.payload["n"]}
        if transaction == "psycopg":
            tx.execute("INSERT INTO effects VALUES (%(id)s, 1, %(n)s::text)", params)
        else:
            tx.execute(text("INSERT INTO effects VALUES (:id, 1, CAST(:n AS text))"), params)
        if message.payload["n"] == 3:
            raise RuntimeError("the fourth message fails after writing")

    ids = put(url, "batch", [{"n": i} for i in range(10)], ["one key"] * 10)
    with handler_thread(url, handlers, concurrency=1, transaction_size=100):
        wait_for(lambda: processed(url) == 9 and dead(url) == 1, 30, "nine handled, one dead")
    assert sorted(int(r[2]) for r in _effects(url)) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert {r[0] for r in _effects(url)} == set(ids) - {ids[3]}


def test_retention_keeps_up_while_a_backlog_keeps_the_handler_busy(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    _prepare(url)
    handlers = Handlers()

    @handlers.handler("busy", ordered=False)
    def slow(message: InboxMessage, conn: Any) -> None:
        conn.execute("INSERT INTO effects VALUES (%s, 1, '')", (message.id,))
        time.sleep(0.002)

    put(url, "busy", [{"n": i} for i in range(400)], [None] * 400)
    forgotten_while_busy = False
    with handler_thread(
        url,
        handlers,
        concurrency=1,
        batch_size=20,
        transaction_size=20,
        dedup_window=0,
        retention_interval=0,
        retention_batch=50,
    ):

        def progressed() -> bool:
            nonlocal forgotten_while_busy
            handled = len(_effects(url))
            left = count(url, "consumer_queue")
            kept = count(url, "consumer_processed")
            if left > 0 and handled >= 100 and kept < handled:
                forgotten_while_busy = True
            return left == 0

        wait_for(progressed, 60, "the backlog to be handled")
    assert forgotten_while_busy, "processed rows were only forgotten once the handler was idle"


def test_a_callback_gets_each_messages_headers_and_no_headers_as_an_empty_dict(
    outbox_database_url: str,
) -> None:
    """The claims return empty headers as NULL (nothing to parse): a callback still gets `{}`
    for them, and every header of the others, text and bytes, whichever claim took the row."""
    url = outbox_database_url
    handlers = Handlers()
    seen: dict[str, dict[str, Any]] = {}

    @handlers.handler("headers.one")
    def one(message: InboxMessage, conn: Any) -> None:
        seen[message.payload["n"]] = dict(message.headers)

    @handlers.batch_handler("headers.many")
    def many(messages: list[InboxMessage], conn: Any) -> None:
        for message in messages:
            seen[message.payload["n"]] = dict(message.headers)

    @handlers.handler("headers.async")
    async def later(message: InboxMessage, conn: Any) -> None:
        seen[message.payload["n"]] = dict(message.headers)

    sent = {"text": "v", "raw": b"\x00\xff"}
    with psycopg.connect(url, autocommit=True) as conn:
        for topic in ("headers.one", "headers.many", "headers.async"):
            for n, headers in ((f"{topic}-none", {}), (f"{topic}-some", sent)):
                conn.execute(
                    "INSERT INTO outbox.consumer_queue (message_id, topic, key, payload, headers,"
                    " content_type, lane) VALUES (gen_random_uuid(), %s, NULL, %s, %s,"
                    " 'application/json', 0)",
                    (topic, json.dumps({"n": n}).encode(), Jsonb(to_json(headers))),
                )
    with handler_thread(url, handlers):
        wait_for(lambda: len(seen) == 6, 30, "every message handled")
    for topic in ("headers.one", "headers.many", "headers.async"):
        assert seen[f"{topic}-none"] == {}
        assert seen[f"{topic}-some"] == sent
