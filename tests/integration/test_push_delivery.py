"""Push delivery (`Handlers.deliver`, `outbox handler --deliver TOPIC=URL`) against a real HTTP
receiver in this process (http.server on 127.0.0.1).

The receiver fails (500), answers too late (a timeout), throttles (429 with Retry-After) and is
away (its port closed), then comes back: every message is answered 2xx once, in order per key.
A 4xx other than 408 and 429 is dead at once, with the status and the start of the body.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from outbox import Backoff, Handlers, InboxMessage
from outbox.core.errors import ConfigurationError, PermanentFailure, RetryLater
from outbox.core.push import ERROR_BODY_BYTES, HttpDelivery, ce_value, mask_url, retry_after
from outbox.testing.servers import free_port

from .relay_helpers import Daemon, count, handler_thread, transport_args, wait_for
from .test_inbox import dead, processed, put

#: What the receiver answers: a status with headers and a body, or ("late", seconds) for an
#: answer (503) after the client gave up.
Answer = tuple[int, dict[str, str], bytes] | tuple[str, float]


@dataclass
class Request:
    at: float
    path: str
    headers: dict[str, str]
    body: bytes
    status: int


@dataclass
class Receiver:
    """An HTTP endpoint answering from `plan` first, then with `default(request)`."""

    port: int
    plan: deque[Answer] = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def default(self, headers: dict[str, str], body: bytes) -> Answer:
        return (204, {}, b"")

    @property
    def accepted(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def start(self) -> None:
        receiver = self

        class Handle(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    answer = receiver.plan.popleft() if receiver.plan else None
                if answer is None:
                    answer = receiver.default(headers, body)
                if isinstance(answer[0], str):
                    time.sleep(float(answer[1]))
                    status, extra, text = 503, {}, b"late"
                else:
                    status, extra, text = answer  # type: ignore[misc]
                with receiver.lock:
                    receiver.requests.append(
                        Request(time.monotonic(), self.path, headers, body, status)
                    )
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (the timeout case): nothing to report

        self.server = Server(("127.0.0.1", self.port), Handle)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@contextmanager
def receiving(receiver: Receiver, *, start: bool = True) -> Iterator[Receiver]:
    if start:
        receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


def test_every_message_is_delivered_once_in_order_through_failures_timeouts_and_an_absence(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    port = free_port()
    receiver = Receiver(
        port,
        deque(
            [(500, {}, b"boom"), ("late", 1.0), (429, {"Retry-After": "1"}, b""), (503, {}, b"")]
        ),
    )
    handlers = Handlers()
    handlers.deliver(
        "pushed",
        f"http://svc:s3cret-pass@127.0.0.1:{port}/events?v=1",
        timeout=0.3,
        max_attempts=50,
        backoff=Backoff(initial=0.05, maximum=2.0),
    )
    keys = [f"k{i % 3}" for i in range(15)]
    ids = put(url, "pushed", [{"n": i} for i in range(15)], keys)
    with receiving(receiver, start=False), handler_thread(url, handlers, concurrency=2):
        # The port is closed: connections are refused, and the attempts retried.
        wait_for(lambda: count(url, "consumer_queue", "attempts >= 2") >= 1, 20, "refusals")
        with psycopg.connect(url) as conn:
            errors = [r[0] for r in conn.execute("SELECT last_error FROM outbox.consumer_queue")]
        assert any("ConnectionRefusedError" in (e or "") for e in errors), errors
        assert not any("s3cret-pass" in (e or "") for e in errors), "the password is masked"
        receiver.start()
        wait_for(lambda: processed(url) == 15, 60, "every message delivered")
    accepted = receiver.accepted
    assert sorted(r.headers["ce-id"] for r in accepted) == sorted(str(i) for i in ids)
    for key in ("k0", "k1", "k2"):
        numbers = [json.loads(r.body)["n"] for r in accepted if r.headers["ce-subject"] == key]
        assert numbers == sorted(numbers), f"{key} out of order: {numbers}"
    assert dead(url) == 0
    statuses = [r.status for r in receiver.requests]
    # The plan, all seen (the late answer is recorded when it is written, after the others).
    assert (statuses.count(500), statuses.count(429), statuses.count(503)) == (1, 1, 2), statuses
    throttled = next(r for r in receiver.requests if r.status == 429)
    again = next(
        r
        for r in receiver.requests
        if r.headers["ce-id"] == throttled.headers["ce-id"] and r.at > throttled.at
    )
    assert again.at - throttled.at >= 0.9, "Retry-After: 1 was honoured"

    first = accepted[0]
    assert first.path == "/events?v=1"
    assert first.headers["ce-specversion"] == "1.0"
    assert first.headers["ce-type"] == "pushed"
    assert first.headers["ce-source"] == "outbox://" + url.rsplit("/", 1)[1]
    assert first.headers["content-type"] == "application/json"
    assert datetime.fromisoformat(first.headers["ce-time"]).tzinfo is not None
    credentials = base64.b64encode(b"svc:s3cret-pass").decode()
    assert first.headers["authorization"] == f"Basic {credentials}"


def test_a_4xx_is_dead_at_once_with_its_status_and_the_start_of_its_body(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    port = free_port()

    class Refusing(Receiver):
        def default(self, headers: dict[str, str], body: bytes) -> Answer:
            if json.loads(body)["n"] == 1:
                return (404, {}, b"no such order " + b"x" * 5000)
            return (200, {}, b"ok")

    receiver = Refusing(port)
    handlers = Handlers()
    handlers.deliver("pushed", f"http://127.0.0.1:{port}/", max_attempts=5)
    put(url, "pushed", [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}], ["a", "a", "a", "b"])
    with receiving(receiver), handler_thread(url, handlers, concurrency=2):
        wait_for(lambda: processed(url) + dead(url) == 4, 30, "every message handled or dead")
    assert (processed(url), dead(url)) == (3, 1)
    with psycopg.connect(url) as conn:
        ((attempts, error),) = conn.execute(
            "SELECT attempts, last_error FROM outbox.consumer_queue WHERE dead_at IS NOT NULL"
        ).fetchall()
    assert attempts == 1, "not retried"
    assert "PermanentFailure" in error
    assert f"POST http://127.0.0.1:{port}/: HTTP 404 Not Found: no such order xxx" in error
    assert "x" * (ERROR_BODY_BYTES - len("no such order ")) in error
    assert "x" * (ERROR_BODY_BYTES - len("no such order ") + 1) not in error, "bounded"
    assert sum(1 for r in receiver.requests if r.status == 404) == 1


# -- the callback alone, against the receiver ----------------------------------------------------


def _message(key: bytes | None = b"order 7/\xc3\xa9") -> InboxMessage[Any]:
    now = datetime.now(UTC)
    return InboxMessage(
        id=uuid.uuid4(),
        topic="orders.placed",
        key=key,
        payload={"n": 1},
        raw_payload=b'{"n":1}',
        content_type="application/json",
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        attempt=1,
        created_at=now,
        received_at=now,
    )


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, None),
        (201, None),
        (204, None),
        (301, PermanentFailure),
        (400, PermanentFailure),
        (401, PermanentFailure),
        (403, PermanentFailure),
        (404, PermanentFailure),
        (409, PermanentFailure),
        (422, PermanentFailure),
        (408, RetryLater),
        (429, RetryLater),
        (500, RetryLater),
        (502, RetryLater),
        (503, RetryLater),
    ],
)
def test_each_status_is_handled_dead_or_retried(status: int, outcome: type[Exception]) -> None:
    port = free_port()
    receiver = Receiver(port, deque([(status, {"location": "http://127.0.0.1:1/"}, b"why")]))
    delivery = HttpDelivery("orders.placed", f"http://127.0.0.1:{port}/in", timeout=5)
    with receiving(receiver):
        if outcome is None:
            delivery.post(_message(), "outbox://orders")
        else:
            with pytest.raises(outcome, match=f"HTTP {status} .*: why"):
                delivery.post(_message(), "outbox://orders")
    (request,) = receiver.requests
    assert request.headers["ce-subject"] == "order%207/%C3%A9"
    assert request.headers["ce-source"] == "outbox://orders"
    assert request.headers["traceparent"].startswith("00-0af7651916cd43dd")
    assert request.body == b'{"n":1}'


def test_a_refused_connection_and_a_timeout_are_retried() -> None:
    port = free_port()
    delivery = HttpDelivery("t", f"http://127.0.0.1:{port}/", timeout=0.3)
    with pytest.raises(RetryLater, match="ConnectionRefusedError"):
        delivery.post(_message(None), "outbox://x")
    with receiving(Receiver(port, deque([("late", 1.0)]))):
        started = time.monotonic()
        with pytest.raises(RetryLater, match=r"no answer within 0\.3 s"):
            delivery.post(_message(None), "outbox://x")
        assert time.monotonic() - started < 0.9


def test_retry_after_is_read_as_seconds_or_a_date() -> None:
    assert retry_after("3") == 3.0
    assert retry_after(None) is None
    assert retry_after("soon") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert retry_after("\xb2") is None  # a digit to str.isdigit, not to float()
    assert retry_after("9" * 400) == float("inf")  # cut to the backoff's maximum


def test_an_interim_answer_before_the_final_one_is_skipped() -> None:
    """`103 Early Hints` (or `102 Processing`) before the 2xx: http.client skips only `100
    Continue` and read the 103 as the answer, which made the message dead at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    finals = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"HTTP/1.1 503 Busy\r\n\r\n"]

    def answer() -> None:
        for final in finals:
            client, _ = listener.accept()
            with client:
                client.recv(65536)
                client.sendall(
                    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
                    b"HTTP/1.1 102 Processing\r\n\r\n" + final
                )

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        delivery = HttpDelivery("t", f"http://127.0.0.1:{port}/", timeout=5)
        delivery.post(_message(None), "outbox://x")  # handled
        with pytest.raises(RetryLater, match="HTTP 503"):
            delivery.post(_message(None), "outbox://x")
    finally:
        thread.join(10)
        listener.close()


def test_a_2xx_with_a_broken_body_is_handled_and_an_error_keeps_what_was_read() -> None:
    """The body was read before the status was looked at: a 2xx with a bad chunk was an
    IncompleteRead, retried (the accepted message POSTed again, dead once its attempts were
    spent)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    broken = b"Transfer-Encoding: chunked\r\n\r\nzz\r\nnot a chunk"
    answers = [b"HTTP/1.1 200 OK\r\n" + broken, b"HTTP/1.1 503 Busy\r\n" + broken]

    def answer() -> None:
        for raw in answers:
            client, _ = listener.accept()
            with client:
                client.recv(65536)
                client.sendall(raw)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        delivery = HttpDelivery("t", f"http://127.0.0.1:{port}/", timeout=5)
        delivery.post(_message(None), "outbox://x")  # handled
        with pytest.raises(RetryLater, match=r"HTTP 503 Busy$"):
            delivery.post(_message(None), "outbox://x")
    finally:
        thread.join(10)
        listener.close()


def test_a_5xx_with_a_retry_after_of_garbage_is_retried_not_dead() -> None:
    port = free_port()
    garbage = [(503, {"Retry-After": value}, b"busy") for value in ("\xb2", "soon", "-1")]
    delivery = HttpDelivery("t", f"http://127.0.0.1:{port}/", timeout=5)
    with receiving(Receiver(port, deque(garbage))):
        for _ in garbage:
            with pytest.raises(RetryLater, match="HTTP 503") as caught:
                delivery.post(_message(None), "outbox://x")
            assert caught.value.after is None


def test_a_retry_after_delays_the_next_attempt_up_to_the_backoffs_maximum() -> None:
    from outbox.core.handlers import HandlerSpec
    from outbox.daemons.handler.failures import failed_attempt

    spec = HandlerSpec("t", print, 5, Backoff(initial=0.1, maximum=30.0, jitter=0), True)
    row: Any = type("Row", (), {"id": 1})()
    assert failed_attempt(row, spec, RetryLater("x", 7.0), 0).delay == 7.0
    assert failed_attempt(row, spec, RetryLater("x", 900.0), 0).delay == 30.0
    assert failed_attempt(row, spec, RetryLater("x"), 0).delay == 0.1
    gone = failed_attempt(row, spec, PermanentFailure("x"), 0)
    assert gone.dead and gone.delay == 0.0


def test_ce_values_are_percent_encoded() -> None:
    assert ce_value("orders.placed") == "orders.placed"
    assert ce_value('a b"%c') == "a%20b%22%25c"
    assert ce_value(b"\x00\xff") == "%00%FF"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://u:hunter22@host/x", "is not http:// or https://"),
        ("http:///path", "names no host"),
        ("http://host:99999/", "invalid port"),
        ("http://host/#frag", "#fragment"),
        ("", "non-empty str"),
        ("127.0.0.1:8080/in", "is not http:// or https://"),
    ],
)
def test_a_bad_url_is_refused_at_registration_with_its_password_masked(
    url: str, message: str
) -> None:
    handlers = Handlers()
    with pytest.raises(ConfigurationError, match=message) as info:
        handlers.deliver("t", url)
    assert "hunter22" not in str(info.value)
    assert handlers.topics == []


def test_urls_are_shown_with_their_password_masked() -> None:
    assert mask_url("https://u:p4ss@h:8443/x?q=1") == "https://u:***@h:8443/x?q=1"
    assert mask_url("https://u@h/x") == "https://u@h/x"
    assert mask_url("http://h/x") == "http://h/x"
    delivery = HttpDelivery("t", "https://u:p4ss@h/x")
    assert "p4ss" not in delivery.__qualname__


def test_deliver_registers_one_handler_per_topic() -> None:
    handlers = Handlers()
    handlers.deliver("a", "http://127.0.0.1:1/a")

    @handlers.handler("b")
    def b(message: InboxMessage[Any], conn: Any) -> None:
        pass

    assert handlers.topics == ["a", "b"]
    spec = handlers.get("a")
    assert spec is not None and spec.is_async and spec.ordered
    with pytest.raises(ConfigurationError, match="already has the handler"):
        handlers.deliver("b", "http://127.0.0.1:1/b")


def test_the_cli_checks_deliver_urls_before_it_starts(outbox_database_url: str) -> None:
    for entry, message in [
        ("pushed=ftp://u:hunter22@h/", "is not http:// or https://"),
        ("no-url-here", "--deliver takes TOPIC=URL"),
    ]:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "outbox.cli",
                "handler",
                "--database-url",
                outbox_database_url,
                "--deliver",
                entry,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode != 0
        assert message in run.stderr, run.stderr
        assert "hunter22" not in run.stderr + run.stdout
    run = subprocess.run(
        [sys.executable, "-m", "outbox.cli", "handler", "--database-url", outbox_database_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "or --deliver TOPIC=URL" in run.stderr


def test_outbox_run_delivers_what_a_service_sent_without_a_registry(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    """`outbox run --deliver TOPIC=URL` alone: sent with `broker.send`, relayed over the log
    kept in PostgreSQL, consumed and POSTed, once each, in order per key."""
    from outbox import Broker

    url = outbox_database_url
    port = free_port()
    broker = Broker()
    with psycopg.connect(url) as conn, conn.transaction():
        ids = [broker.send(conn, "pushed.run", {"n": i}, key=f"k{i % 2}") for i in range(6)]
    receiver = Receiver(port, deque([(500, {}, b"not yet")]))
    with (
        receiving(receiver),
        Daemon(
            "run",
            "--deliver",
            f"pushed.run=http://127.0.0.1:{port}/hook",
            "--deliver-timeout",
            "2",
            "--database-url",
            url,
            *transport_args(outbox_log_url),
            "--group",
            "push-run",
            "--poll-interval",
            "0.2",
        ) as daemon,
    ):
        try:
            wait_for(lambda: len(receiver.accepted) >= 6, 90, "six deliveries")
        except AssertionError:
            raise AssertionError(daemon.output()) from None
        daemon.terminate()
        assert daemon.wait(60) == 0, daemon.output()
    accepted = receiver.accepted
    assert sorted(r.headers["ce-id"] for r in accepted) == sorted(str(i) for i in ids)
    for key in ("k0", "k1"):
        numbers = [json.loads(r.body)["n"] for r in accepted if r.headers["ce-subject"] == key]
        assert numbers == sorted(numbers)


def test_a_delivery_has_at_most_concurrency_requests_in_flight() -> None:
    port = free_port()
    in_flight = 0
    most = 0
    guard = threading.Lock()

    class Slow(Receiver):
        def default(self, headers: dict[str, str], body: bytes) -> Answer:
            nonlocal in_flight, most
            with guard:
                in_flight += 1
                most = max(most, in_flight)
            time.sleep(0.2)
            with guard:
                in_flight -= 1
            return (200, {}, b"")

    delivery = HttpDelivery("t", f"http://127.0.0.1:{port}/", timeout=5, concurrency=2)
    with receiving(Slow(port)) as receiver:
        posts = [
            threading.Thread(target=delivery.post, args=(_message(), "outbox://x"))
            for _ in range(6)
        ]
        for post in posts:
            post.start()
        for post in posts:
            post.join(10)
        assert len(receiver.accepted) == 6
    assert most == 2


def test_a_message_http_cannot_carry_is_dead_at_once() -> None:
    """A foreign record's content type with a line break cannot be a header: no attempt can
    send it, so it is not retried."""
    port = free_port()
    delivery = HttpDelivery("t", f"http://127.0.0.1:{port}/", timeout=2)
    broken = dataclasses.replace(_message(), content_type="text/plain\r\nx-evil: 1")
    with receiving(Receiver(port)) as receiver:
        with pytest.raises(PermanentFailure, match="cannot be sent over HTTP"):
            delivery.post(broken, "outbox://x")
    assert receiver.requests == []
