"""`outbox serve` as a client in another language sees it: a real uvicorn server in a
subprocess over a migrated outbox and the log kept in PostgreSQL (docs/http.md)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox.core.batches import OutgoingRecord
from outbox.pglog import PgLog, PgLogPublisher

from .relay_helpers import count
from .serve_support import Server, serving


@pytest.fixture
def server(outbox_database_url: str, outbox_log_url: str) -> Iterator[Server]:
    with serving(outbox_database_url, outbox_log_url) as running:
        yield running


def test_topics_are_created_listed_and_described(server: Server) -> None:
    assert server.call("GET", "/v1/topics") == (200, {"topics": []})
    assert server.call("POST", "/v1/topics", {"name": "orders", "partitions": 3}) == (
        201,
        {"name": "orders", "partitions": 3},
    )
    status, found = server.call("POST", "/v1/topics", {"name": "orders", "partitions": 3})
    assert status == 409 and "exists" in found["error"]
    status, found = server.call("POST", "/v1/topics", {"name": "bad name!", "partitions": 1})
    assert status == 422 and "bad name!" in found["error"]
    status, found = server.call("POST", "/v1/topics", {"name": "x", "partitions": 0})
    assert status == 422 and "partitions" in found["error"]
    assert server.call("GET", "/v1/topics") == (
        200,
        {"topics": [{"name": "orders", "partitions": 3, "records": 0}]},
    )
    status, found = server.call("GET", "/v1/topics/orders")
    assert status == 200
    assert [p["partition"] for p in found["partitions"]] == [0, 1, 2]
    assert all(p["end"] == 0 for p in found["partitions"]) and found["subscriptions"] == []
    status, found = server.call("GET", "/v1/topics/nothing")
    assert status == 404 and "nothing" in found["error"]


def test_a_publish_is_committed_in_the_outbox_once_per_message_id(
    server: Server, outbox_database_url: str
) -> None:
    url = outbox_database_url
    one = str(uuid.uuid4())
    status, found = server.call(
        "POST",
        "/v1/topics/orders/messages",
        {"payload": {"n": 1}, "key": "a", "headers": {"h": "v"}, "message_id": one},
    )
    assert (status, found) == (201, {"message_ids": [one]})
    batch = [{"payload": {"n": n}, "key": "b"} for n in range(100)]
    status, found = server.call("POST", "/v1/topics/orders/messages", batch)
    assert status == 201 and len(set(found["message_ids"])) == 100
    assert count(url) == 101
    # The same id again, while the message waits and after it is relayed: 200, nothing written.
    assert server.call(
        "POST", "/v1/topics/orders/messages", {"payload": {"n": 1}, "message_id": one}
    ) == (200, {"message_ids": [one]})
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM outbox.producer_queue")  # as the relay does once sent
    assert server.call(
        "POST", "/v1/topics/orders/messages", [{"payload": {"n": 1}, "message_id": one}]
    ) == (200, {"message_ids": [one]})
    assert count(url) == 0
    # A batch of an old id and a new one writes the new one only.
    two = str(uuid.uuid4())
    status, found = server.call(
        "POST",
        "/v1/topics/orders/messages",
        [{"payload": 1, "message_id": one}, {"payload": 2, "message_id": two}],
    )
    assert (status, found) == (201, {"message_ids": [one, two]})
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT message_id FROM outbox.producer_queue").fetchall()
    assert [str(r[0]) for r in rows] == [two]


#: Each bad publish, its status and words of its message.
BAD_PUBLISHES: list[tuple[object, int, str]] = [
    ({"key": "a"}, 422, "payload"),
    ({"payload": 1, "headers": {"outbox-message-id": "x"}}, 422, "outbox-"),
    ({"payload": 1, "message_id": "not-a-uuid"}, 422, "message_id"),
    ({"payload": 1, "tenant": "no way"}, 422, "tenant"),
    ({"payload": 1, "extra": 1}, 422, "extra"),
    # The error of the shape sent only: not "Input should be a valid list" beside it.
    ({"payload": 1, "headers": {"a": 1}}, 422, "headers.a: Input should be a valid string;"),
    ([{"payload": 1}, {"key": "k"}], 422, "message 1: payload: Field required;"),
    ({"payload": "x" * 1_100_000}, 422, "message 0: "),
    ([], 422, "no message"),
    (
        [{"payload": 1, "message_id": str(uuid.UUID(int=7))}] * 2,
        422,
        "twice",
    ),
    ([{"payload": 1}, {"payload": 2, "headers": {"outbox-x": "y"}}], 422, "outbox-"),
    ({"payload": 1, "deliver_at": "2030-01-01T10:00:00"}, 422, "naive"),
    ({"payload": 1, "deliver_at": "soon"}, 422, "deliver_at"),
    ({"payload": 1, "delay_ms": -1}, 422, "delay_ms"),
    # Past the longest delay, or a timedelta's range: refused, not a 500 (OverflowError).
    ({"payload": 1, "delay_ms": 2**63 - 1}, 422, "delay_ms: Input should be less than"),
    ({"payload": 1, "delay_ms": 10**400}, 422, "delay_ms"),
    ({"payload": 1, "delay_ms": 5, "deliver_at": "2030-01-01T10:00:00Z"}, 422, "both"),
]


def test_a_publish_due_later_waits_in_producer_scheduled_until_due(
    server: Server, outbox_database_url: str
) -> None:
    url = outbox_database_url
    status, later = server.call(
        "POST",
        "/v1/topics/orders/messages",
        [
            {"payload": {"n": 1}, "key": "a", "delay_ms": 3_600_000},
            {"payload": {"n": 2}, "key": "a", "deliver_at": "2999-01-01T00:00:00+02:00"},
            {"payload": {"n": 3}, "key": "a", "deliver_at": "2000-01-01T00:00:00Z"},
        ],
    )
    assert status == 201, later
    with psycopg.connect(url) as conn:
        scheduled = dict(
            conn.execute(
                "SELECT message_id::text, deliver_at - now() FROM outbox.producer_scheduled"
            ).fetchall()
        )
        queued = [r[0] for r in conn.execute("SELECT message_id::text FROM outbox.producer_queue")]
    first, second, third = later["message_ids"]
    assert set(scheduled) == {first, second} and queued == [third]  # one already past: now
    assert 3590 < scheduled[first].total_seconds() <= 3600  # the database's now + the delay


def test_each_bad_publish_is_answered_and_stores_nothing(
    server: Server, outbox_database_url: str
) -> None:
    for body, status, said in BAD_PUBLISHES:
        answer, found = server.call("POST", "/v1/topics/orders/messages", body)
        assert answer == status, (body, found)
        assert said in found["error"], (body, found)
        assert "valid list" not in found["error"] and "MessageIn" not in found["error"]
    assert count(outbox_database_url) == 0
    with psycopg.connect(outbox_database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.http_published").fetchone() == (0,)


def test_a_message_id_sent_by_python_or_sql_and_waiting_is_a_conflict(
    server: Server, outbox_database_url: str
) -> None:
    """The server answers 200 only for ids it accepted itself (http_published); an id that a
    message sent another way has, still waiting due now or later, is 409 and nothing is
    written, not even the id's record (a retry after the message left is then accepted)."""
    url = outbox_database_url
    now, later = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("SELECT outbox.send('orders', '1', message_id => %s)", (now,))
        conn.execute(
            "SELECT outbox.send('orders', '1', message_id => %s, "
            "deliver_at => now() + interval '1 hour')",
            (later,),
        )
    for taken in (now, later):
        status, found = server.call(
            "POST", "/v1/topics/orders/messages", {"payload": 2, "message_id": str(taken)}
        )
        assert status == 409 and str(taken) in found["error"], found
    assert count(url) == 1
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.http_published").fetchone() == (0,)


def test_malformed_and_oversized_bodies_and_unknown_databases(
    server: Server, outbox_database_url: str
) -> None:
    status, found = server.call("POST", "/v1/topics/orders/messages", raw=b'{"payload": ')
    assert status == 400 and "malformed JSON" in found["error"]
    # JSON whose bytes are not UTF-8, or a number too long to read: which, not "There was an
    # error parsing the body".
    status, found = server.call("POST", "/v1/topics/orders/messages", raw=b'{"payload": "\xff"}')
    assert status == 400
    assert found["error"].startswith("malformed JSON: 'utf-8' codec can't decode byte 0xff")
    status, found = server.call("POST", "/v1/topics/orders/messages", raw=b"[" + b"1" * 5000 + b"]")
    assert status == 400 and found["error"].startswith("malformed JSON: Exceeds the limit")
    # A body not sent as JSON (fetch sends a string as text/plain, curl -d as a form) is not
    # read as JSON, and is told so (it was 422 "Input should be a valid dictionary ...").
    for kind in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded"):
        status, found = server.call(
            "POST", "/v1/topics/orders/messages", {"payload": 1}, headers={"Content-Type": kind}
        )
        assert status == 415, found
        assert "`Content-Type: application/json`" in found["error"] and kind in found["error"]
    status, found = server.call(
        "PUT", "/v1/topics/orders/subscriptions/s", {}, headers={"Content-Type": "text/plain"}
    )
    assert status == 415, found
    # Refused by its Content-Length, before a byte of the body is read.
    status, said = raw_request(server.port, "Content-Length: 5000000\r\n", b"[")
    assert status == 413 and b"larger than" in said
    # Chunked, no length: refused once the bytes read pass the bound.
    chunk = b'{"payload": 1},' * 1000
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(300))
    status, said = raw_request(server.port, "Transfer-Encoding: chunked\r\n", chunked)
    assert status == 413 and b"larger than" in said
    status, found = server.call("POST", "/v1/topics/orders/messages?database=other", {"payload": 1})
    assert status == 404 and "other" in found["error"]
    status, found = server.call("POST", "/v1/topics/bad%20topic/messages", {"payload": 1})
    assert status == 422 and "bad topic" in found["error"]
    assert count(outbox_database_url) == 0


def test_a_subscription_reads_from_its_own_position_and_loses_it_when_deleted(
    server: Server, outbox_log_url: str
) -> None:
    log = PgLog(outbox_log_url)
    log.create_topic("posts", partitions=2)
    publish_to_log(outbox_log_url, "posts", ["before"])
    assert server.call("PUT", "/v1/topics/posts/subscriptions/late", {})[0] == 201
    assert server.call("PUT", "/v1/topics/posts/subscriptions/all", {"start": "earliest"})[0] == 201
    assert server.call("PUT", "/v1/topics/posts/subscriptions/all", {})[0] == 200
    publish_to_log(outbox_log_url, "posts", ["p1", "p2", "p3"])

    status, found = server.call("GET", "/v1/topics/posts/subscriptions/late")
    assert status == 200 and found["lag"] == 3
    status, found = server.call("GET", "/v1/topics/posts/subscriptions/all")
    assert found["lag"] == 4

    status, got = server.call("GET", "/v1/topics/posts/subscriptions/late/next?max=10")
    assert status == 200
    assert sorted(r["payload"] for r in got["records"]) == ["p1", "p2", "p3"]
    assert all(r["message_id"] for r in got["records"])
    # Leased: nothing more for another client until acked.
    assert server.call("GET", "/v1/topics/posts/subscriptions/late/next")[0] == 204
    assert server.call(
        "POST", "/v1/topics/posts/subscriptions/late/ack", {"cursor": got["cursor"]}
    ) == (200, {"acked": True})
    assert server.call("GET", "/v1/topics/posts/subscriptions/late")[1]["lag"] == 0
    status, found = server.call(
        "POST", "/v1/topics/posts/subscriptions/late/ack", {"cursor": got["cursor"]}
    )
    assert status == 409

    # The other subscription still holds every record back from retention.
    assert log.apply_retention(0.001) == 0
    status, got = server.call("GET", "/v1/topics/posts/subscriptions/all/next?ack=auto")
    assert sorted(r["payload"] for r in got["records"]) == ["before", "p1", "p2", "p3"]
    assert got["cursor"] is None
    assert log.apply_retention(0.001) == 4  # read by every subscription: deleted

    status, found = server.call("GET", "/v1/topics/posts")
    assert found["subscriptions"] == [{"name": "all", "lag": 0}, {"name": "late", "lag": 0}]
    assert server.call("DELETE", "/v1/topics/posts/subscriptions/late")[0] == 204
    assert server.call("DELETE", "/v1/topics/posts/subscriptions/late")[0] == 404
    assert server.call("GET", "/v1/topics/posts/subscriptions/late/next")[0] == 404
    publish_to_log(outbox_log_url, "posts", ["p4"])
    assert server.call("PUT", "/v1/topics/posts/subscriptions/late", {})[0] == 201
    assert server.call("GET", "/v1/topics/posts/subscriptions/late")[1]["lag"] == 0


def test_records_not_acked_within_the_lease_come_back(server: Server, outbox_log_url: str) -> None:
    PgLog(outbox_log_url).create_topic("jobs", partitions=1)
    assert server.call("PUT", "/v1/topics/jobs/subscriptions/w", {"start": "earliest"})[0] == 201
    publish_to_log(outbox_log_url, "jobs", ["j1", "j2"])
    status, first = server.call("GET", "/v1/topics/jobs/subscriptions/w/next?lease_ms=300&max=1")
    assert [r["payload"] for r in first["records"]] == ["j1"]
    status, _ = server.call("GET", "/v1/topics/jobs/subscriptions/w/next?wait_ms=100")
    assert status == 204  # the partition is leased: order per partition
    status, again = server.call("GET", "/v1/topics/jobs/subscriptions/w/next?wait_ms=3000")
    assert [r["payload"] for r in again["records"]] == ["j1", "j2"]
    assert again["cursor"] != first["cursor"]
    assert (
        server.call("POST", "/v1/topics/jobs/subscriptions/w/ack", {"cursor": first["cursor"]})[0]
        == 409
    )
    assert (
        server.call("POST", "/v1/topics/jobs/subscriptions/w/ack", {"cursor": again["cursor"]})[0]
        == 200
    )


def publish_to_log(log_url: str, topic: str, texts: list[str], key: str = "k") -> None:
    """Records appended to the log as the Producer relays them: JSON text payloads."""
    records = [
        OutgoingRecord(
            n,
            topic,
            key.encode(),
            json.dumps(text).encode(),
            str(uuid.uuid4()),
            "2026-12-02T00:00:00+00:00",
            "application/json",
            None,
            0,
        )
        for n, text in enumerate(texts)
    ]
    publisher = PgLogPublisher(log_url, partitions=2)
    try:
        assert publisher.publish(records) == [None] * len(records)
    finally:
        publisher.close()


def raw_request(port: int, header: str, body: bytes) -> tuple[int, bytes]:
    """(status, body) of a publish whose headers end with `header`, sent as raw bytes (the
    server may answer and close before the body is all sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = (
            "POST /v1/topics/orders/messages HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\n{header}\r\n"
        )
        sock.sendall(head.encode())
        with contextlib.suppress(OSError):
            sock.sendall(body)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_a_long_poll_is_woken_by_an_append_and_a_killed_servers_listener_is_forgotten(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    PgLog(outbox_log_url).create_topic("woken", partitions=2)
    with serving(outbox_database_url, outbox_log_url) as server:
        assert server.call("PUT", "/v1/topics/woken/subscriptions/s", {})[0] == 201
        waited = []
        for n in range(5):
            appended: list[float] = []

            def later(n: int = n, appended: list[float] = appended) -> None:
                time.sleep(0.2)
                publish_to_log(outbox_log_url, "woken", [f"w{n}"])
                appended.append(time.monotonic())

            thread = threading.Thread(target=later)
            thread.start()
            status, found = server.call(
                "GET", "/v1/topics/woken/subscriptions/s/next?ack=auto&wait_ms=5000"
            )
            thread.join()
            assert status == 200 and [r["payload"] for r in found["records"]] == [f"w{n}"]
            waited.append(time.monotonic() - appended[0])
        # Without the wake-up each would wait for the next look, 0.3 s after the append.
        assert sorted(waited)[2] < 0.15, waited
        with psycopg.connect(outbox_log_url) as conn:
            listeners = conn.execute("SELECT count(*) FROM outbox_log.log_listeners").fetchone()
        assert listeners == (1,)
        server.daemon.process.kill()
        server.daemon.process.wait(10)
    with serving(outbox_database_url, outbox_log_url):
        with psycopg.connect(outbox_log_url) as conn:
            rows = conn.execute("SELECT backend_pid FROM outbox_log.log_listeners").fetchall()
        assert len(rows) == 1  # the killed server's row was dropped, this one's is there


def test_each_bad_subscription_request_is_answered_and_changes_nothing(
    server: Server, outbox_log_url: str
) -> None:
    PgLog(outbox_log_url).create_topic("subs", partitions=1)
    base = "/v1/topics/subs/subscriptions"
    cases: list[tuple[str, str, object, int, str]] = [
        ("PUT", f"{base}/bad%20name", {}, 422, "subscription name 'bad name' contains"),
        ("PUT", f"{base}/{'s' * 250}", {}, 422, "subscription name is 250 characters long"),
        ("PUT", f"{base}/s", {"start": "middle"}, 422, "start"),
        ("PUT", f"{base}/s", {"start": "latest", "extra": 1}, 422, "extra"),
        ("PUT", "/v1/topics/none/subscriptions/s", {}, 404, "none"),
        ("GET", f"{base}/s/next?max=0", None, 422, "max"),
        ("GET", f"{base}/s/next?max=1001", None, 422, "max"),
        ("GET", f"{base}/s/next?wait_ms=-1", None, 422, "wait_ms"),
        # A wait past a float's range is cut to the longest wait (it was a 500).
        ("GET", f"{base}/s/next?wait_ms=1{'0' * 400}", None, 404, "no subscription 's'"),
        ("GET", f"{base}/s/next?ack=sometimes", None, 422, "ack"),
        ("GET", f"{base}/s/next", None, 404, "no subscription 's'"),
        ("POST", f"{base}/s/ack", {"cursor": "nope"}, 422, "cursor"),
        ("POST", f"{base}/s/ack", {"cursor": str(uuid.uuid4())}, 404, "no subscription"),
        ("DELETE", f"{base}/s", None, 404, "no subscription"),
        ("GET", f"{base}/s", None, 404, "no subscription"),
    ]
    for method, path, body, status, said in cases:
        answer, found = server.call(method, path, body)
        assert (answer, said in found["error"]) == (status, True), (method, path, found)
    with psycopg.connect(outbox_log_url) as conn:
        groups = conn.execute("SELECT count(*) FROM outbox_log.log_groups").fetchone()
    assert groups == (0,)


def test_a_publish_goes_to_the_outbox_its_database_names(
    outbox_database_factory: Any, outbox_log_url: str
) -> None:
    one, two = outbox_database_factory(), outbox_database_factory()
    with serving(one, outbox_log_url, "--database-url", f"two={two}") as server:
        status, found = server.call("POST", "/v1/topics/t/messages", {"payload": 1})
        assert status == 400 and "?database=NAME" in found["error"]
        for name in ("two", "two", "t_" + one.rsplit("/t_", 1)[1]):
            assert (
                server.call("POST", f"/v1/topics/t/messages?database={name}", {"payload": 1})[0]
                == 201
            )
    assert count(one) == 1 and count(two) == 2


def test_ids_older_than_the_window_are_forgotten_in_batches(outbox_database_url: str) -> None:
    from outbox.postgres.published import Published

    published = Published("outbox")
    ids = [uuid.uuid4() for _ in range(5)]
    with psycopg.connect(outbox_database_url, autocommit=True) as conn:
        with conn.transaction():
            assert published.claim(conn, ids) == set(ids)
            assert published.claim(conn, ids[:2]) == set()
        conn.execute(
            "UPDATE outbox.http_published SET published_at = now() - interval '2 hours' "
            "WHERE message_id = ANY(%s)",
            (ids[:3],),
        )
        assert published.forget(conn, 3600, batch=2) == 2
        assert published.forget(conn, 3600, batch=2) == 1
        assert published.forget(conn, 3600, batch=2) == 0
        assert published.claim(conn, ids) == set(ids[:3])  # forgotten: accepted again
