"""Metrics, health, logs and startup/fatal lines of the daemons, against real servers."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from outbox import Backoff, Broker, Handlers, InboxMessage, Message
from outbox.daemons.producer import BUSY_BATCH_FACTOR
from outbox.observability.runtime import ObservabilityConfig
from outbox.testing.servers import Servers

from . import inbox_app
from .relay_helpers import (
    Daemon,
    consumer_thread,
    count,
    handler_thread,
    producer_thread,
    spawn_consumer,
    spawn_handler,
    spawn_producer,
    wait_for,
)

broker = Broker()
_NO_WAIT = Backoff(initial=0.01, maximum=0.05, jitter=0)

#: Both servers on ephemeral loopback ports, probes and gauges refreshed quickly.
FAST = {
    "metrics_port": 0,
    "metrics_host": "127.0.0.1",
    "health_port": 0,
    "health_host": "127.0.0.1",
    "probe_interval": 0.2,
    "probe_timeout": 1.0,
    "stats_interval": 0.2,
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample served at /metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """One sample's value; None when the series does not exist (yet)."""
    return samples.get((name, frozenset(labels.items())))


def health(port: int, path: str) -> tuple[int, str]:
    """Status and body of a health endpoint."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:  # refused or reset on a machine too busy to accept: not an answer
        return 0, str(error)


def _send(url: str, topics: dict[str, int]) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        broker.send_many(
            conn,
            [
                Message(topic, {"n": i}, key=f"k{i % 7}")
                for topic, n in topics.items()
                for i in range(n)
            ],
        )


def _port(daemon: Any, which: str) -> int:
    wait_for(lambda: getattr(daemon.observability, which) is not None, 30, f"the {which}")
    return int(getattr(daemon.observability, which))


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_count_every_message_per_topic_in_each_daemon(
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
    outbox_topic_factory: Any,
) -> None:
    url, other = outbox_database_url, outbox_topic_factory()
    sent = {outbox_topic: 120, other: 45}
    _send(url, sent)
    observe = ObservabilityConfig(**FAST)  # type: ignore[arg-type]

    with producer_thread(url, outbox_kafka_bootstrap, batch_size=50, observability=observe) as p:
        port = _port(p, "metrics_port")
        wait_for(lambda: count(url) == 0, 60, "producer_queue to drain")
        wait_for(
            lambda: value(scrape(port), "outbox_queue_depth", queue="producer_queue") == 0,
            10,
            "the producer_queue gauge to show the drained queue",
        )
        samples = scrape(port)
    for topic, n in sent.items():
        assert value(samples, "outbox_producer_messages_relayed_total", topic=topic) == n
        assert not value(samples, "outbox_producer_messages_failed_total", topic=topic)
    assert value(samples, "outbox_producer_batch_size_sum") == sum(sent.values())
    # 165 rows from batches of 50 that double while full (50 + 100 + 15, or more batches).
    assert (value(samples, "outbox_producer_batch_size_count") or 0) >= 3
    assert value(samples, "outbox_producer_delivery_seconds_count") == value(
        samples, "outbox_producer_batch_size_count"
    )
    assert value(samples, "outbox_lanes_owned") == 64
    info = [labels for name, labels in samples if name == "outbox_info"]
    assert info and ("daemon", "producer") in info[0]

    handlers = Handlers()
    for topic in sent:

        @handlers.handler(topic)
        def on_message(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
            time.sleep(0.001)

    total = sum(sent.values())
    gauges = ("outbox_queue_depth", "outbox_queue_oldest_age_seconds")
    with consumer_thread(url, outbox_kafka_bootstrap, list(sent), observability=observe) as c:
        consumer_port = _port(c, "metrics_port")
        wait_for(lambda: count(url, "consumer_queue") == total, 60, "every message stored")
        # Nothing handles them yet: the consumer's gauge of consumer_queue shows them waiting.
        wait_for(
            lambda: (
                value(scrape(consumer_port), "outbox_queue_depth", queue="consumer_queue") == total
            ),
            10,
            "the consumer_queue gauge to show the stored messages",
        )
        with handler_thread(url, handlers, observability=observe) as runner:
            handler_port = _port(runner, "metrics_port")
            assert consumer_port != handler_port  # two daemons, two registries, one process
            wait_for(
                lambda: count(url, "consumer_processed") == total,
                60,
                "every message handled",
            )
            for port in (consumer_port, handler_port):
                wait_for(
                    lambda port=port: all(
                        value(scrape(port), g, queue="consumer_queue") == 0 for g in gauges
                    ),
                    10,
                    "the consumer_queue gauges to reach 0",
                )
            handled = scrape(handler_port)
        stored = scrape(consumer_port)
    for topic, n in sent.items():
        # One database: no `database` label (a daemon serving several adds it).
        assert value(stored, "outbox_consumer_messages_received_total", topic=topic) == n
        assert value(stored, "outbox_consumer_messages_stored_total", topic=topic) == n
        assert value(handled, "outbox_handler_messages_handled_total", topic=topic) == n
        assert value(handled, "outbox_handler_duration_seconds_count", topic=topic) == n
        assert (value(handled, "outbox_handler_duration_seconds_sum", topic=topic) or 0) >= (
            n * 0.001
        )
        assert not value(handled, "outbox_handler_messages_failed_total", topic=topic)
    assert value(stored, "outbox_consumer_batch_size_sum") == total
    assert value(handled, "outbox_handler_batch_size_sum") == total
    assert value(handled, "outbox_lanes_owned") == 64
    assert (value(handled, "outbox_seconds_since_progress") or 0) < 5


def test_dead_producer_rows_are_a_gauge(
    outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    # gap: nothing exported how many rows producer_dead holds
    from outbox.postgres.queries import queries

    url = outbox_database_url
    _send(url, {outbox_topic: 3})
    with psycopg.connect(url) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM outbox.producer_queue LIMIT 2")]
        conn.execute(
            queries("outbox")["producer_fail"],
            {"ids": ids, "errors": ["refused for good"] * 2, "delays": [None, None]},
        )
    observe = ObservabilityConfig(**FAST)  # type: ignore[arg-type]
    with producer_thread(url, outbox_kafka_bootstrap, observability=observe) as p:
        port = _port(p, "metrics_port")
        wait_for(
            lambda: value(scrape(port), "outbox_producer_dead_rows") == 2,
            10,
            "the dead-rows gauge to show producer_dead",
        )


def test_failed_and_dead_handler_messages_are_counted(
    outbox_database_url: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    _insert_inbox(url, outbox_topic, [{"fail_times": 1}, {"fail_times": 9}, {}])
    handlers = Handlers()

    @handlers.handler(outbox_topic, max_attempts=2, backoff=_NO_WAIT)
    def on_message(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        if message.attempt <= message.payload.get("fail_times", 0):
            raise RuntimeError("planned failure")

    observe = ObservabilityConfig(**FAST)  # type: ignore[arg-type]
    with handler_thread(url, handlers, observability=observe) as runner:
        port = _port(runner, "metrics_port")
        wait_for(
            lambda: (
                value(scrape(port), "outbox_handler_messages_dead_total", topic=outbox_topic) == 1
                and value(scrape(port), "outbox_handler_messages_handled_total", topic=outbox_topic)
                == 2
            ),
            30,
            "one dead and two handled",
        )
        samples = scrape(port)
    # fail_times=1: one failure then success; fail_times=9: two failures, dead at the second.
    assert value(samples, "outbox_handler_messages_failed_total", topic=outbox_topic) == 3


# -- health ------------------------------------------------------------------------------------


def test_readyz_is_503_while_the_broker_is_frozen_and_livez_stays_200(
    outbox_servers: Servers,
    outbox_database_url: str,
    outbox_kafka_bootstrap: str,
    outbox_topic: str,
) -> None:
    kafka = outbox_servers.kafka
    if not hasattr(kafka, "pause"):
        pytest.skip("the broker in use cannot be frozen")
    url, bootstrap = outbox_database_url, outbox_kafka_bootstrap
    observe = ObservabilityConfig(**FAST)  # type: ignore[arg-type]
    with (
        producer_thread(url, bootstrap, observability=observe, poll_interval=0.2) as relay,
        consumer_thread(url, bootstrap, [outbox_topic], observability=observe) as consumer,
    ):
        ports = [_port(relay, "health_port"), _port(consumer, "health_port")]
        for port in ports:
            wait_for(lambda port=port: health(port, "/readyz")[0] == 200, 30, "ready")
            assert health(port, "/livez") == (200, "ok\n")
        assert health(ports[0], "/nothing")[0] == 404
        kafka.pause()
        try:
            for port in ports:
                wait_for(lambda port=port: health(port, "/readyz")[0] == 503, 15, "not ready")
                status, reason = health(port, "/readyz")
                assert status == 503 and "Kafka unreachable" in reason, reason
                assert health(port, "/livez")[0] == 200  # waiting, not wedged
        finally:
            kafka.resume()
        for port in ports:
            wait_for(lambda port=port: health(port, "/readyz")[0] == 200, 30, "ready again")


def test_readyz_is_503_while_postgres_refuses_connections(
    outbox_database_url: str, outbox_admin_url: str
) -> None:
    url = outbox_database_url
    database = urlsplit(url).path.lstrip("/")
    handlers = Handlers()

    @handlers.handler("unused.topic")
    def on_message(message: InboxMessage, conn: psycopg.Connection[Any]) -> None:
        pass

    def allow(allowed: bool) -> None:
        with psycopg.connect(outbox_admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(database), sql.Literal(allowed)
                )
            )
            if not allowed:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (database,),
                )

    observe = ObservabilityConfig(**FAST)  # type: ignore[arg-type]
    with handler_thread(url, handlers, observability=observe) as runner:
        port = _port(runner, "health_port")
        wait_for(lambda: health(port, "/readyz")[0] == 200, 30, "ready")
        allow(False)
        try:
            wait_for(lambda: health(port, "/readyz")[0] == 503, 15, "not ready")
            _status, reason = health(port, "/readyz")
            assert "PostgreSQL unreachable" in reason and "Kafka" not in reason, reason
            time.sleep(0.5)
            assert health(port, "/livez")[0] == 200  # reconnecting with backoff, not wedged
        finally:
            allow(True)
        wait_for(lambda: health(port, "/readyz")[0] == 200, 30, "ready again")


# -- logs --------------------------------------------------------------------------------------


def _json_lines(output: str) -> list[dict[str, Any]]:
    lines = [line for line in output.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line parses, or the test fails


@pytest.mark.parametrize("interval", ["0", "10"])
def test_json_logs_summarize_batches_or_say_each_and_sighup_reloads_nothing(
    interval: str, outbox_database_url: str, outbox_kafka_bootstrap: str, outbox_topic: str
) -> None:
    """--log-interval 0: an INFO line per batch; else the batches summed into one INFO line
    per interval (what is left said at stop), each batch's line DEBUG."""
    url = outbox_database_url
    _send(url, {outbox_topic: 200})
    with spawn_producer(
        url,
        outbox_kafka_bootstrap,
        "--batch-size",
        "50",
        env={"OUTBOX_LOG_FORMAT": "json", "OUTBOX_LOG_INTERVAL": interval},
    ) as relay:
        wait_for(lambda: count(url) == 0, 60, "producer_queue to drain")
        relay.signal(signal.SIGHUP)
        time.sleep(0.5)
        assert relay.process.poll() is None, "SIGHUP must not stop the daemon"
        relay.signal(signal.SIGTERM)
        assert relay.wait(30) == 0, relay.output()
        entries = _json_lines(relay.output())
    for entry in entries:
        assert {"timestamp", "level", "logger", "message"} <= entry.keys()
    batches = [e for e in entries if e.get("event") == "producer.batch"]
    summaries = [e for e in entries if e.get("event") == "producer.summary"]
    info = [e for e in entries if e["level"] == "INFO"]
    if interval == "0":
        assert sum(sum(e["relayed"].values()) for e in batches) == 200
        # --batch-size 50, doubled while batches come back full, at most BUSY_BATCH_FACTOR times.
        assert all(
            e["level"] == "INFO" and e["batch_size"] <= 50 * BUSY_BATCH_FACTOR for e in batches
        )
        assert 2 <= len(batches) < 200 and not summaries
        assert len(info) <= len(batches) + 3  # start, stop and the signal; nothing per message
    else:
        assert batches == []  # DEBUG, below the default level
        assert sum(sum(e["relayed"].values()) for e in summaries) == 200
        assert sum(e["batch_size"] for e in summaries) == 200
        assert all(e["level"] == "INFO" and e["batches"] >= 1 for e in summaries)
        assert sum(e["batches"] for e in summaries) >= 2
        assert 1 <= len(summaries) <= 2  # the drain took less than an interval or two
        assert "relayed 200 of 200 messages" in summaries[0]["message"] or len(summaries) == 2
        assert len(info) <= len(summaries) + 3
    assert next(e["event"] for e in entries if "event" in e) == "producer.start"
    assert any("SIGHUP" in e["message"] and e["level"] == "WARNING" for e in entries)


def test_handler_errors_carry_message_id_and_topic_in_json(
    outbox_database_url: str, outbox_topic: str
) -> None:
    url = outbox_database_url
    with psycopg.connect(url) as conn:
        conn.execute(inbox_app.SCHEMA)
    ids = _insert_inbox(url, outbox_topic, [{"fail_times": 1}])
    with spawn_handler(
        url,
        "tests.integration.inbox_app:handlers",
        env={"INBOX_APP_TOPIC": outbox_topic, "OUTBOX_LOG_FORMAT": "json"},
    ) as handler:
        wait_for(
            lambda: count(url, "consumer_processed") == 1,
            60,
            "the message handled after its retry",
        )
        handler.signal(signal.SIGTERM)
        assert handler.wait(30) == 0, handler.output()
        entries = _json_lines(handler.output())
    failures = [e for e in entries if e["level"] == "WARNING" and "failed" in e["message"]]
    assert len(failures) == 1, entries
    assert failures[0]["message_id"] == str(ids[0])
    assert failures[0]["topic"] == outbox_topic
    summaries = [e for e in entries if e.get("event") == "handler.summary"]
    assert sum(sum(e["handled"].values()) for e in summaries) == 1
    assert sum(sum(e.get("failed", {}).values()) for e in summaries) == 1


# -- startup line and fatal errors -------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _one_error_line(daemon: Daemon) -> str:
    assert daemon.wait(60) == 1, daemon.output()
    output = daemon.output()
    errors = [line for line in output.splitlines() if line.startswith("outbox: error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output, output
    return errors[0]


@pytest.mark.parametrize(
    "url_template",
    [
        "postgresql://app:Pa55-{token}@127.0.0.1:{port}/app",
        # libpq quotes this one back in its error: masked as a remembered secret.
        "postgresql://app:Pa55%zz{token}@127.0.0.1:{port}/app",
        "host=127.0.0.1 port={port} user=app password=Pa55-{token}",
    ],
)
def test_passwords_never_appear_in_the_startup_line_or_the_error(url_template: str) -> None:
    token = "s3cr3t"
    url = url_template.format(token=token, port=_closed_port())
    with spawn_producer(
        url,
        "127.0.0.1:9",
        "--kafka-config",
        f"sasl.password=kafka-{token}",
        "--kafka-config",
        f"sasl.oauthbearer.client.secret=oauth-{token}",
    ) as relay:
        error = _one_error_line(relay)
        output = relay.output()
    assert "cannot connect to PostgreSQL" in error
    assert token not in output, output
    start = [line for line in output.splitlines() if "producer starting:" in line]
    assert len(start) == 1 and "***" in start[0], output
    assert '"sasl.password":"***"' in start[0], start[0]


def test_the_startup_line_lists_every_kafka_setting_in_force_and_masks_its_secrets(
    tmp_path: Path,
) -> None:
    """outbox's forced and default librdkafka settings, the user's from the flags, the
    variables and the file; the secrets of the variable and of the file masked."""
    token = "s3cr3t"
    properties = tmp_path / "kafka.properties"
    properties.write_text(f"ssl.key.password=file-{token}\nclient.id=from-file\n")
    env = {
        "OUTBOX_KAFKA_CONFIG_SASL_PASSWORD": f"env-{token}",
        "OUTBOX_KAFKA_CONFIG_FILE": str(properties),
        "OUTBOX_LOG_FORMAT": "json",
    }
    url = f"postgresql://app@127.0.0.1:{_closed_port()}/app"
    with spawn_producer(url, "127.0.0.1:9", "--kafka-config", "linger.ms=7", env=env) as relay:
        assert relay.wait(30) == 1
        output = relay.output()
    assert token not in output, output
    (start,) = [e for e in _json_lines(output) if e.get("event") == "producer.start"]
    kafka = start["config"]["kafka_config"]
    assert start["config"]["transport"] == "kafka"
    assert kafka["enable.idempotence"] == "true" and kafka["acks"] == "all"  # forced
    assert kafka["partitioner"] == "murmur2_random"  # outbox's default
    assert kafka["linger.ms"] == "7"  # the flag's, over outbox's default
    assert kafka["client.id"] == "from-file"
    assert kafka["sasl.password"] == kafka["ssl.key.password"] == "***"


def test_the_consumer_startup_line_has_the_log_settings_of_the_postgres_transport(
    outbox_database_url: str, outbox_log_url: str
) -> None:
    # The harness's server trusts local connections: a password is accepted, and must not show.
    parts = urlsplit(outbox_log_url)
    password_url = parts._replace(
        netloc=f"{parts.username or 'postgres'}:Pa55-s3cr3t@{parts.hostname}:{parts.port}"
    ).geturl()
    with spawn_consumer(
        outbox_database_url,
        password_url,
        "t.log",
        "g-log",
        "--log-session-timeout",
        "7",
        env={"OUTBOX_LOG_FORMAT": "json"},
    ) as consumer:
        wait_for(lambda: '"consumer.start"' in consumer.output(), 30, "the start-up line")
        consumer.signal(signal.SIGTERM)
        consumer.wait(30)
        output = consumer.output()
    (start,) = [e for e in _json_lines(output) if e.get("event") == "consumer.start"]
    config = start["config"]
    assert config["transport"] == "postgres"
    assert config["log_schema"] == "outbox_log"
    assert config["log_session_timeout"] == 7.0
    assert "password=***" in config["log_url"] and "s3cr3t" not in output
    assert "kafka_config" not in config and "kafka_bootstrap" not in config


def test_fatal_errors_at_start_are_one_line_and_exit_1(
    outbox_database_url: str, outbox_empty_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    closed = f"postgresql://postgres@127.0.0.1:{_closed_port()}/app"
    cases = {
        "cannot connect to PostgreSQL": Daemon(
            "handler", "tests.integration.inbox_app:handlers", "--database-url", closed
        ),
        "no Kafka broker answered": spawn_producer(outbox_database_url, "nothing.invalid:9092"),
        "schema": spawn_producer(outbox_empty_database_url, outbox_kafka_bootstrap),
        "cannot import 'no_such_module'": Daemon(
            "handler", "no_such_module:handlers", "--database-url", outbox_database_url
        ),
    }
    try:
        for expected, daemon in cases.items():
            assert expected in _one_error_line(daemon), daemon.output()
    finally:
        for daemon in cases.values():
            daemon.close()


def test_a_busy_metrics_port_is_a_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/app"
        with spawn_producer(
            url, "127.0.0.1:9", "--metrics-host", "127.0.0.1", "--metrics-port", str(port)
        ) as relay:
            error = _one_error_line(relay)
    assert f"cannot serve metrics on 127.0.0.1:{port}" in error


# -- helpers -----------------------------------------------------------------------------------


def _insert_inbox(url: str, topic: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """Store messages in consumer_queue with the Consumer's own statement."""
    from .test_inbox import put

    return put(url, topic, bodies, [f"key-{i}" for i in range(len(bodies))])


# -- every character a password may hold, on every start-up and error path -----------------------

#: Every printable ASCII character (space, both quotes, backslash, &;,@/#?%=...) and some
#: non-ASCII ones, between markers that appear nowhere else: a partial leak shows a marker.
_LEFT, _RIGHT, _MARKER = "QzXl", "QzXr", "QzX"
_PASSWORD = _LEFT + "".join(chr(c) for c in range(0x20, 0x7F)) + "éü€密🙂\u00a0" + _RIGHT


def _url_form(password: str, host: str, port: str, user: str, dbname: str) -> str:
    """Every character percent-encoded."""
    from urllib.parse import quote

    return f"postgresql://{user}:{quote(password, safe='')}@{host}:{port}/{dbname}"


def _raw_url_form(password: str, host: str, port: str, user: str, dbname: str) -> str:
    """Only what libpq needs percent-encoded (space % / @): & ; , ' " ? # stay as they are."""
    encoded = "".join(f"%{ord(c):02X}" if c in " %/@" else c for c in password)
    return f"postgresql://{user}:{encoded}@{host}:{port}/{dbname}"


def _keyword_form(password: str, host: str, port: str, user: str, dbname: str) -> str:
    """Quoted, with quote and backslash escaped."""
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    return f"host={host} port={port} user={user} password='{escaped}' dbname={dbname}"


def _unquoted_keyword_form(password: str, host: str, port: str, user: str, dbname: str) -> str:
    """Unquoted, only space and backslash escaped (libpq's rule for unquoted values)."""
    escaped = password.replace("\\", "\\\\").replace(" ", "\\ ")
    return f"host={host} port={port} user={user} password={escaped} dbname={dbname}"


_FORMS = (_url_form, _raw_url_form, _keyword_form, _unquoted_keyword_form)


def _fatal_line(daemon: Daemon, log_format: str) -> str:
    assert daemon.wait(60) == 1, daemon.output()
    output = daemon.output()
    assert "Traceback" not in output, output
    if log_format == "text":
        return _one_error_line(daemon)
    fatal = [e for e in _json_lines(output) if e.get("event") == "fatal"]
    assert len(fatal) == 1, output
    return str(fatal[0]["message"])


def test_no_character_of_a_password_reaches_the_startup_line_or_any_error(
    outbox_database_url: str, outbox_empty_database_url: str, outbox_kafka_bootstrap: str
) -> None:
    from psycopg.conninfo import conninfo_to_dict

    real = conninfo_to_dict(outbox_database_url)
    host, port = str(real.get("host", "127.0.0.1")), str(real.get("port", "5432"))
    empty = str(conninfo_to_dict(outbox_empty_database_url)["dbname"])
    # The test server trusts every connection, so the password is ignored where it connects.
    paths = {
        "cannot connect to PostgreSQL": ("127.0.0.1", str(_closed_port()), "app", "app", "x:9"),
        'role "no_such_role" does not exist': (host, port, "no_such_role", "app", "x:9"),
        'database "no_such_db" does not exist': (host, port, "postgres", "no_such_db", "x:9"),
        "run `outbox migrate": (host, port, "postgres", empty, outbox_kafka_bootstrap),
        "no Kafka broker answered": (
            host,
            port,
            "postgres",
            str(real["dbname"]),
            f"127.0.0.1:{_closed_port()}",
        ),
    }
    for expected, (h, p, user, dbname, bootstrap) in paths.items():
        daemons: dict[tuple[str, str], Daemon] = {}
        try:
            for index, form in enumerate(_FORMS):
                conninfo = form(_PASSWORD, h, p, user, dbname)
                assert conninfo_to_dict(conninfo)["password"] == _PASSWORD, conninfo
                # Every form in both formats where nothing answers; else each format twice.
                if expected == "cannot connect to PostgreSQL":
                    formats = ["text", "json"]
                else:
                    formats = ["text" if index % 2 else "json"]
                for log_format in formats:
                    daemons[form.__name__, log_format] = Daemon(
                        "--log-format",
                        log_format,
                        "producer",
                        "--database-url",
                        conninfo,
                        "--kafka-bootstrap",
                        bootstrap,
                        "--kafka-config",
                        "socket.connection.setup.timeout.ms=1000",
                    )
            for (form_name, log_format), daemon in daemons.items():
                error = _fatal_line(daemon, log_format)
                output = daemon.output()
                assert expected in error, (form_name, log_format, output)
                assert _MARKER not in output, (form_name, log_format, output)
                assert "producer starting:" in output, output
        finally:
            for daemon in daemons.values():
                daemon.close()
