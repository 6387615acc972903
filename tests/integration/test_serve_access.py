"""`outbox serve`'s tokens, health, metrics, OpenAPI, typed topics, the Kafka transport's 501,
slow clients, several clients of one subscription, and the whole path: a publish over HTTP
relayed by the Producer into the log and pulled by a subscription."""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict
from pathlib import Path

import psycopg

from outbox.pglog import PgLog

from .relay_helpers import count, spawn_producer, wait_for
from .serve_support import serving

PUBLISH = "publish-token-0123456789"
CONSUME = "consume-token-0123456789"
ADMIN = "admin-token-0123456789ab"


def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(
        f"# tokens of the test\npublish {PUBLISH}\nconsume {CONSUME}\n\nadmin {ADMIN}\n"
    )
    return str(path)


def test_tokens_and_their_scopes_guard_every_resource(
    outbox_database_url: str, outbox_log_url: str, tmp_path: Path
) -> None:
    path = tokens_file(tmp_path)
    with serving(outbox_database_url, outbox_log_url, "--tokens-file", path) as server:
        status, found = server.call("GET", "/v1/topics")
        assert status == 401 and "Bearer" in found["error"]
        status, found = server.call("GET", "/v1/topics", token="wrong-token-0123456789")
        assert status == 401 and "wrong-token" not in found["error"]
        assert server.call("GET", "/v1/topics", token=CONSUME)[0] == 200
        status, found = server.call("POST", "/v1/topics", {"name": "t"}, token=CONSUME)
        assert status == 403 and "admin" in found["error"]
        assert server.call("POST", "/v1/topics", {"name": "t"}, token=ADMIN)[0] == 201
        status, _ = server.call("POST", "/v1/topics/t/messages", {"payload": 1}, token=CONSUME)
        assert status == 403
        assert server.call("POST", "/v1/topics/t/messages", {"payload": 1}, token=PUBLISH)[0] == 201
        assert server.call("PUT", "/v1/topics/t/subscriptions/s", {}, token=PUBLISH)[0] == 403
        assert server.call("PUT", "/v1/topics/t/subscriptions/s", {}, token=CONSUME)[0] == 201
        assert server.call("GET", "/v1/topics/t/subscriptions/s/next", token=ADMIN)[0] == 204
        # Health, metrics and the API's description need no token.
        assert server.call("GET", "/livez", token="") == (200, {"status": "ok"})
        status, found = server.call("GET", "/readyz", token="")
        assert status == 200 and set(found["checks"].values()) == {"ok"}
        assert count(outbox_database_url) == 1
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            metrics = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
        assert 'route="/v1/topics/{topic}/messages",status="201"} 1' in metrics
        assert 'outbox_serve_messages_total{what="published"} 1' in metrics
        assert 'route="/v1/topics",status="401"} 2' in metrics
        server.daemon.terminate()
        assert server.daemon.wait(30) == 0  # SIGTERM: stops cleanly
        output = server.daemon.output()
    assert PUBLISH not in output and CONSUME not in output


def test_the_openapi_document_and_its_page(outbox_database_url: str) -> None:
    import json
    import urllib.request

    with serving(outbox_database_url, None) as server:
        with urllib.request.urlopen(server.url + "/openapi.json") as answer:
            document = json.load(answer)
        with urllib.request.urlopen(server.url + "/docs") as answer:
            page = answer.read().decode()
        # On Kafka: publish works, the log's resources say where they are served.
        assert server.call("POST", "/v1/topics/k/messages", {"payload": 1})[0] == 201
        status, found = server.call("GET", "/v1/topics")
        assert status == 501 and "--transport postgres --log-url" in found["error"]
        status, _ = server.call("PUT", "/v1/topics/k/subscriptions/s", {})
        assert status == 501
    assert "/v1/topics/{topic}/messages" in document["paths"]
    assert "/v1/topics/{topic}/subscriptions/{name}/next" in document["paths"]
    assert "openapi.json" in page


def test_a_typed_topics_payload_is_validated_naming_the_field(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    registry = "tests.integration.serve_contracts"
    with serving(outbox_database_url, outbox_log_url, "--registry", registry) as server:
        path = "/v1/topics/typed.orders/messages"
        status, found = server.call("POST", path, {"payload": {"order_id": "o1", "quantity": "x"}})
        assert status == 422 and "quantity" in found["error"], found
        status, found = server.call("POST", path, [{"payload": {"order_id": "o2"}}])
        assert status == 422 and "quantity" in found["error"], found
        assert count(outbox_database_url) == 0
        status, _ = server.call("POST", path, {"payload": {"order_id": "o3", "quantity": 2}})
        assert status == 201
    with psycopg.connect(outbox_database_url) as conn:
        assert conn.execute("SELECT key FROM outbox.producer_queue").fetchone() == (b"o3",)


def test_a_slow_client_is_cut_off_and_does_not_hold_the_server(
    outbox_database_url: str,
) -> None:
    with serving(outbox_database_url, None) as server:
        slow = []
        for _ in range(50):  # more slow clients than the worker threads and connections
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(
                b"POST /v1/topics/s/messages HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            slow.append(sock)
        started = time.monotonic()
        assert server.call("POST", "/v1/topics/s/messages", {"payload": 1})[0] == 201
        assert time.monotonic() - started < 5
        slow[0].settimeout(30)
        answer = b"".join(iter(lambda: slow[0].recv(65536), b""))
        assert b" 408 " in answer.split(b"\r\n")[0] and b"took over" in answer
        for sock in slow:
            sock.close()
    assert count(outbox_database_url) == 1


def test_a_publish_is_relayed_into_the_log_and_pulled_by_a_subscription_once_by_each_client(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    """The whole path, with four clients pulling one subscription at once: every message to
    one client exactly once (no lease runs out), in the order of its key."""
    with serving(outbox_database_url, outbox_log_url) as server:
        assert server.call("POST", "/v1/topics", {"name": "flow", "partitions": 4})[0] == 201
        assert server.call("PUT", "/v1/topics/flow/subscriptions/all", {})[0] == 201
        sent = [{"payload": {"key": f"k{n % 5}", "n": n}, "key": f"k{n % 5}"} for n in range(200)]
        for start in range(0, 200, 50):
            status, _ = server.call("POST", "/v1/topics/flow/messages", sent[start : start + 50])
            assert status == 201
        got: dict[str, list[int]] = defaultdict(list)
        clients: list[list[int]] = [[] for _ in range(4)]
        lock = threading.Lock()
        done = threading.Event()

        def pull(mine: list[int]) -> None:
            while not done.is_set():
                status, found = server.call(
                    "GET", "/v1/topics/flow/subscriptions/all/next?max=7&wait_ms=500"
                )
                if status == 204:
                    continue
                assert status == 200, (status, found)
                with lock:
                    for record in found["records"]:
                        got[record["key"]].append(record["payload"]["n"])
                        mine.append(record["payload"]["n"])
                    # Acknowledged under the lock: the next client to take a partition reads past.
                    assert (
                        server.call(
                            "POST",
                            "/v1/topics/flow/subscriptions/all/ack",
                            {"cursor": found["cursor"]},
                        )[0]
                        == 200
                    )

        threads = [threading.Thread(target=pull, args=(c,)) for c in clients]
        for thread in threads:
            thread.start()
        with spawn_producer(outbox_database_url, outbox_log_url):
            try:
                wait_for(lambda: sum(len(v) for v in got.values()) >= 200, 90, "200 records")
            finally:
                done.set()
                for thread in threads:
                    thread.join(30)
        assert sorted(n for v in got.values() for n in v) == list(range(200))
        for key, numbers in got.items():
            assert numbers == sorted(numbers), key
        assert sum(1 for c in clients if c) >= 2  # the partitions were spread over clients
        assert server.call("GET", "/v1/topics/flow/subscriptions/all")[1]["lag"] == 0
        assert PgLog(outbox_log_url).count("flow") == 200
