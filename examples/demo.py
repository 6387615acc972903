"""The demo: two services, each with its own database, talking through Kafka.

    ./run demo [--messages N]          or, in the repository's root:
    python -m examples.demo [--messages N]

The orders service (`examples/orders_service`) inserts orders and sends `orders.created` in the
same transaction; every 4th order's payment is declined and its transaction rolls back. Three
daemons run as their own processes through the real `outbox` command: the producer relays the
orders database's outbox to Kafka, the consumer stores the topic in the shipping database's
inbox, and the handler runs `examples.shipping_service.handlers:handlers`, which inserts one
shipment per order. The demo polls both databases to show each message's way, stops the daemons
with SIGTERM, prints `outbox status` of both databases, and checks that the shipments are
exactly the committed orders, each once.

Everything runs on this machine: a throwaway PostgreSQL and Kafka-protocol broker (or the ones
named by OUTBOX_TEST_DATABASE_URL / OUTBOX_TEST_KAFKA_BOOTSTRAP, where the demo's databases,
topic and group get a random suffix). It lives with the example services in a source checkout,
not in the `outbox` package: `outbox demo` only says where to run it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from outbox.core.numbers import flag_type
from outbox.postgres import migrate
from outbox.postgres.migrate import sqlalchemy_url

if TYPE_CHECKING:
    from outbox.testing.servers import Servers

#: The repository's root: `examples/` (this file's directory) is importable from there.
REPO_ROOT = Path(__file__).resolve().parent.parent
HANDLERS = "examples.shipping_service.handlers:handlers"
GROUP = "shipping"
PARTITIONS = 3
CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
#: Local broker: a consumer joins its group in half of session.timeout.ms.
CONSUMER_KAFKA_CONFIG = ("session.timeout.ms=6000", "heartbeat.interval.ms=1000")
POLL_INTERVAL = 0.005
READY_TIMEOUT = 30.0
TRACE_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


def _say(text: str = "") -> None:
    print(text, flush=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def short_id(message_id: UUID) -> str:
    """The last 8 hex digits of a message id: random bits of the UUIDv7, unlike its first 8
    (the time in milliseconds, the same for every message of a run)."""
    return "…" + message_id.hex[-8:]


def run_demo(messages: int = 10) -> int:
    """Run the demo; return 0 when the shipments are exactly the committed orders, each once."""
    if messages < 1:
        print(f"demo: error: --messages must be at least 1, got {messages}", file=sys.stderr)
        return 1
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))

    from outbox.testing.servers import ServerError, start_servers

    _say("the outbox demo: an orders service and a shipping service, each with its own database,")
    _say("talking through Kafka with a transactional outbox and inbox\n")
    base = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    try:
        _say("1. starting PostgreSQL and a Kafka-protocol broker on 127.0.0.1 ...")
        started = time.monotonic()
        try:
            servers = start_servers(base)
        except ServerError as exc:
            print(f"demo: error: cannot start the demo servers: {exc}", file=sys.stderr)
            return 1
        with servers:
            _say(f"   postgres  {servers.postgres.url}  ({servers.postgres.source})")
            _say(f"   kafka     {servers.kafka.bootstrap}  ({servers.kafka.source})")
            _say(f"   ready in {time.monotonic() - started:.1f} s\n")
            return _Demo(servers, messages).run()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the daemons ------------------------------------------------------------------------------


class _Daemon:
    """One `outbox` daemon as its own process; its output goes to a temporary file."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str]) -> None:
        self.name = name
        self.args = list(args)
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox.cli", "--log-level", "WARNING", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def running(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        if self.running():
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """The exit code; a daemon that does not stop in time is killed (code -9)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def tail(self, lines: int = 20) -> str:
        self._log.seek(0)
        text = self._log.read().decode(errors="replace").rstrip()
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def kill(self) -> None:
        if self.running():
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        self.kill()
        self._log.close()


# -- following the messages -------------------------------------------------------------------


@dataclass
class _Order:
    """One placed order and what the tracer saw happen to its message (monotonic times)."""

    order_id: int
    customer: str
    total: Decimal
    message_id: UUID
    committed: bool
    committed_at: float = 0.0
    relayed_at: float | None = None
    stored_at: float | None = None
    handled_at: float | None = None
    dead: bool = False
    shipments: list[int] = field(default_factory=list)

    def after_commit(self, moment: float | None) -> str:
        return "-" if moment is None else f"+{_ms(moment - self.committed_at)}"


class _Tracer(threading.Thread):
    """Polls both databases and notes when each committed message reached each stage."""

    def __init__(self, orders_url: str, shipping_url: str) -> None:
        super().__init__(name="outbox-demo-tracer", daemon=True)
        self._urls = (orders_url, shipping_url)
        self._lock = threading.Lock()
        self._orders: list[_Order] = []
        self._stop_event = threading.Event()
        self.error: BaseException | None = None

    def watch(self, order: _Order) -> None:
        with self._lock:
            self._orders.append(order)

    def settled(self) -> bool:
        """Whether every watched message was handled or gave up (dead)."""
        with self._lock:
            return all(o.handled_at is not None or o.dead for o in self._orders)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)

    def run(self) -> None:
        orders_url, shipping_url = self._urls
        try:
            with (
                psycopg.connect(orders_url, autocommit=True) as orders_db,
                psycopg.connect(shipping_url, autocommit=True) as shipping_db,
            ):
                while not self._stop_event.is_set():
                    self._poll(orders_db, shipping_db)
                    self._stop_event.wait(POLL_INTERVAL)
        except BaseException as exc:  # reported by the demo
            self.error = exc

    def _poll(
        self, orders_db: psycopg.Connection[Any], shipping_db: psycopg.Connection[Any]
    ) -> None:
        with self._lock:
            pending = [o for o in self._orders if o.handled_at is None and not o.dead]
        if not pending:
            return
        unrelayed = [o.message_id for o in pending if o.relayed_at is None]
        queued: set[UUID] = set()
        if unrelayed:
            queued = {
                row[0]
                for row in orders_db.execute(
                    "SELECT message_id FROM outbox.producer_queue WHERE message_id = ANY(%s)",
                    (unrelayed,),
                )
            }
        # One statement, one snapshot: a shipment commits together with its message's move
        # from the inbox (consumer_queue) to the handled ids (consumer_processed).
        inbox: dict[UUID, tuple[bool, bool, list[int]]] = {}
        for message_id, processed, dead, shipment_id in shipping_db.execute(
            "SELECT q.message_id, q.processed, q.dead, s.id"
            " FROM (SELECT message_id, false AS processed, dead_at IS NOT NULL AS dead"
            "       FROM outbox.consumer_queue"
            "       UNION ALL SELECT message_id, true, false FROM outbox.consumer_processed) q"
            " LEFT JOIN shipments s ON s.message_id = q.message_id"
            " WHERE q.message_id = ANY(%s) ORDER BY s.id",
            ([o.message_id for o in pending],),
        ):
            seen = inbox.setdefault(message_id, (processed, dead, []))
            if shipment_id is not None:
                seen[2].append(shipment_id)
        now = time.monotonic()
        with self._lock:
            for order in pending:
                if order.relayed_at is None and order.message_id not in queued:
                    order.relayed_at = now
                if order.message_id in inbox:
                    processed, order.dead, shipments = inbox[order.message_id]
                    if order.stored_at is None:
                        order.stored_at = now
                    if processed:
                        order.handled_at = now
                        order.shipments = shipments


# -- the demo ---------------------------------------------------------------------------------


class _Demo:
    def __init__(self, servers: Servers, messages: int) -> None:
        from examples.orders_service import DEFAULT_TOPIC, TOPIC_ENV

        self.servers = servers
        self.messages = messages
        # On servers we did not start, leave no trace and collide with nothing of earlier runs.
        db_suffix = f"_{secrets.token_hex(3)}" if servers.postgres.source == "external" else ""
        kafka_suffix = f"-{secrets.token_hex(3)}" if servers.kafka.source == "external" else ""
        self.drop_databases = servers.postgres.source == "external"
        self.orders_db = f"orders{db_suffix}"
        self.shipping_db = f"shipping{db_suffix}"
        self.orders_url = servers.postgres.url_for(self.orders_db)
        self.shipping_url = servers.postgres.url_for(self.shipping_db)
        self.topic = (os.environ.get(TOPIC_ENV) or DEFAULT_TOPIC) + kafka_suffix
        self.group = GROUP + kafka_suffix
        self.topic_env = TOPIC_ENV
        self.daemons: list[_Daemon] = []
        self.orders: list[_Order] = []

    def run(self) -> int:
        from outbox.testing.servers import drop_database

        with ExitStack() as cleanup:
            cleanup.callback(self._close_logs)
            if self.drop_databases:
                for name in (self.orders_db, self.shipping_db):
                    cleanup.callback(drop_database, self.servers.postgres.url, name)
            self._prepare()
            with self._daemons():
                ready = self._wait_ready()
                traced = ready and self._place_and_trace()
                stopped = self._stop_daemons()
            ok = ready and traced and stopped
            if ready:
                status_ok = self._status()
                verified = self._verify()
                ok = ok and status_ok and verified
            if not ok:
                self._print_logs()
        return 0 if ok else 1

    # -- steps -------------------------------------------------------------------------------

    def _prepare(self) -> None:
        from examples import orders_service, shipping_service
        from outbox.testing.servers import create_database, create_topic

        admin = self.servers.postgres.url
        _say("2. two databases, one per service, each with the outbox tables and its own:")
        for name, url, service, tables in (
            (self.orders_db, self.orders_url, orders_service, "orders"),
            (self.shipping_db, self.shipping_url, shipping_service, "shipments"),
        ):
            create_database(admin, name)
            migrate.upgrade(url)  # what `outbox migrate --database-url URL` does
            service.create_schema(url)
            _say(
                f"   {name + ':':<10} outbox migrate (outbox.producer_queue, consumer_queue, "
                f"relay_state) + table {tables}"
            )
        create_topic(self.servers.kafka.bootstrap, self.topic, partitions=PARTITIONS)
        _say(f"   kafka:     topic {self.topic} with {PARTITIONS} partitions\n")

    @contextmanager
    def _daemons(self) -> Iterator[None]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONUNBUFFERED": "1",
            self.topic_env: self.topic,  # the topic the handler registry subscribes to
        }
        os.environ[self.topic_env] = self.topic  # and the one place_order sends to, here
        bootstrap = self.servers.kafka.bootstrap
        kafka_config = [arg for kv in CONSUMER_KAFKA_CONFIG for arg in ("--kafka-config", kv)]
        specs = [
            (
                "producer",
                ["producer", "--database-url", self.orders_url, "--kafka-bootstrap", bootstrap],
                "relays the orders DB's outbox (producer_queue) to Kafka",
            ),
            (
                "consumer",
                [
                    "consumer",
                    "--database-url",
                    self.shipping_url,
                    "--kafka-bootstrap",
                    bootstrap,
                    "--topic",
                    self.topic,
                    "--group",
                    self.group,
                    *kafka_config,
                ],
                "stores the topic's messages in the shipping DB's inbox (consumer_queue)",
            ),
            (
                "handler",
                ["handler", HANDLERS, "--database-url", self.shipping_url],
                "runs ship_order() for each message of the shipping DB's inbox",
            ),
        ]
        placeholders = {
            self.orders_url: f"<{self.orders_db}>",
            self.shipping_url: f"<{self.shipping_db}>",
            bootstrap: "<kafka>",
        }
        _say("3. three daemons, each its own process (python -m outbox.cli --log-level WARNING):")
        try:
            for name, args, role in specs:
                daemon = _Daemon(name, args, env)
                self.daemons.append(daemon)
                shown = _wrap(["outbox", *(placeholders.get(a, a) for a in args)], 78)
                _say(f"   pid {daemon.process.pid:<7} {shown[0]}")
                for line in shown[1:]:
                    _say(f"                 {line}")
                _say(f"               {role}")
            yield
        finally:
            for daemon in self.daemons:
                daemon.kill()

    def _wait_ready(self) -> bool:
        """Wait until the relays registered and the consumer joined its group."""
        _say("   waiting for the producer and handler to register and the consumer to join ...")
        started = time.monotonic()
        deadline = started + READY_TIMEOUT
        producer = handler = consumer = False
        group = _GroupWatch(self.servers.kafka.bootstrap, self.group)
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if not daemon.running():
                    _say(f"   FAILED: the {daemon.name} exited with code {daemon.process.poll()}\n")
                    return False
            producer = producer or _registered(self.orders_url, "producer")
            handler = handler or _registered(self.shipping_url, "handler")
            consumer = consumer or group.stable()
            if producer and handler and consumer:
                note = (
                    " (the local broker takes half of session.timeout.ms to let a consumer join)"
                    if self.servers.kafka.source == "local"
                    else ""
                )
                _say(f"   ready after {time.monotonic() - started:.1f} s{note}\n")
                return True
            time.sleep(0.1)
        if producer and handler:  # the group state is a nicety: messages wait for the consumer
            _say("   (the consumer group is not reported stable yet; going on)\n")
            return True
        _say(f"   FAILED: not ready within {READY_TIMEOUT:.0f} s\n")
        return False

    def _place_and_trace(self) -> bool:
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        from examples.orders_service import place_order

        _say(
            f"4. placing {self.messages} orders: each inserts the order and sends "
            f"{self.topic} in ONE transaction;"
        )
        _say("   every 4th payment is declined and that transaction rolls back")
        tracer = _Tracer(self.orders_url, self.shipping_url)
        tracer.start()
        engine = create_engine(sqlalchemy_url(self.orders_url))
        started = time.monotonic()
        try:
            with Session(engine) as session:
                for n in range(1, self.messages + 1):
                    customer = CUSTOMERS[(n - 1) % len(CUSTOMERS)]
                    total = (Decimal(1499) + 500 * n) / 100
                    order_id, message_id = place_order(session, customer, total)
                    declined = n % 4 == 0
                    if declined:
                        session.rollback()  # payment declined: the order and message vanish
                    else:
                        session.commit()
                    order = _Order(order_id, customer, total, message_id, not declined)
                    order.committed_at = time.monotonic()
                    self.orders.append(order)
                    if not declined:
                        tracer.watch(order)
        finally:
            engine.dispose()
        committed = [o for o in self.orders if o.committed]
        _say(
            f"   placed in {_ms(time.monotonic() - started)}: {len(committed)} committed, "
            f"{len(self.orders) - len(committed)} rolled back\n"
        )
        deadline = time.monotonic() + TRACE_TIMEOUT
        while not tracer.settled() and tracer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        tracer.stop()
        self._print_trace()
        if tracer.error is not None:
            _say(f"   FAILED: polling the databases: {tracer.error}\n")
            return False
        unhandled = [o for o in self.orders if o.committed and o.handled_at is None]
        if unhandled:
            _say(f"   FAILED: {len(unhandled)} committed orders not handled\n")
            return False
        return True

    def _print_trace(self) -> None:
        _say(
            f"5. the way of each message, in ms after its commit "
            f"(seen by polling both databases every {_ms(POLL_INTERVAL)}):"
        )
        _say("     relayed   its row left the orders DB's outbox.producer_queue: Kafka has it")
        _say("     inbox     the consumer stored it in the shipping DB's outbox.consumer_queue")
        _say("               (it reads in batches, waiting up to 0.2 s to fill one)")
        _say("     handled   ship_order ran; shipment and processed mark committed together\n")
        header = ("order", "customer", "total", "message", "relayed", "inbox", "handled")
        rows: list[tuple[str, ...]] = [header]
        for o in self.orders:
            head = (f"#{o.order_id}", o.customer, str(o.total))
            if o.committed:
                rows.append(
                    (
                        *head,
                        short_id(o.message_id),
                        o.after_commit(o.relayed_at),
                        o.after_commit(o.stored_at),
                        "DEAD" if o.dead else o.after_commit(o.handled_at),
                    )
                )
            else:
                rows.append(head)
        widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(header))]
        align = "><><>>>"
        for row, order in zip(rows, [None, *self.orders], strict=True):
            cells = [f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths, strict=False)]
            if order is not None and not order.committed:
                cells.append(
                    "ROLLED BACK (payment declined): order and message "
                    f"{short_id(order.message_id)} never existed"
                )
            elif order is not None:
                if order.shipments:
                    cells.append("-> shipment " + ", ".join(f"#{s}" for s in order.shipments))
                elif order.dead:
                    cells.append("(see: outbox dead-letters list)")
            _say(("   " + "  ".join(cells)).rstrip())
        _say()

    def _stop_daemons(self) -> bool:
        for daemon in self.daemons:
            daemon.terminate()
        codes = [(daemon.name, daemon.wait(STOP_TIMEOUT)) for daemon in self.daemons]
        _say(
            "6. stopping the daemons with SIGTERM: "
            + ", ".join(f"{name} exited {code}" for name, code in codes)
            + "\n"
        )
        return all(code == 0 for _name, code in codes)

    def _status(self) -> bool:
        ok = True
        for step, name, url in (
            ("7", self.shipping_db, self.shipping_url),
            ("8", self.orders_db, self.orders_url),
        ):
            _say(f"{step}. outbox status --database-url <{name}>")
            result = subprocess.run(
                [sys.executable, "-m", "outbox.cli", "status", "--database-url", url],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            for line in (result.stdout + result.stderr).rstrip().splitlines():
                _say(f"   {line}".rstrip())
            _say()
            ok = ok and result.returncode == 0
        return ok

    def _verify(self) -> bool:
        committed = {o.order_id: o.message_id for o in self.orders if o.committed}
        rolled_back = {o.order_id: o.message_id for o in self.orders if not o.committed}
        with psycopg.connect(self.shipping_url) as conn:
            shipments = conn.execute("SELECT order_id, message_id FROM shipments").fetchall()
            in_inbox = {
                row[0]
                for row in conn.execute(
                    "SELECT message_id FROM outbox.consumer_queue WHERE message_id = ANY(%s)"
                    " UNION ALL"
                    " SELECT message_id FROM outbox.consumer_processed WHERE message_id = ANY(%s)",
                    (list(rolled_back.values()), list(rolled_back.values())),
                )
            }
        with psycopg.connect(self.orders_url) as conn:
            orders = {row[0] for row in conn.execute("SELECT id FROM orders")}
        shipped: dict[int, int] = {}
        for order_id, _message_id in shipments:
            shipped[order_id] = shipped.get(order_id, 0) + 1
        problems = [
            f"{what}: {', '.join(f'#{o}' for o in sorted(ids))}"
            for what, ids in (
                ("shipped more than once", {o for o, n in shipped.items() if n > 1}),
                ("never shipped", set(committed) - set(shipped)),
                ("shipped but not committed", set(shipped) - set(committed)),
                (
                    "shipped for another message",
                    {o for o, m in shipments if committed.get(o, m) != m},
                ),
                ("rolled back but in the orders table", orders - set(committed)),
                ("committed but not in the orders table", set(committed) - orders),
            )
            if ids
        ]
        if in_inbox:
            problems.append(f"{len(in_inbox)} rolled-back messages in the shipping inbox")
        ok = not problems
        declined = ", ".join(f"#{o}" for o in sorted(rolled_back)) or "none"
        _say(
            f"9. {len(committed)} orders committed, {len(rolled_back)} rolled back ({declined}); "
            f"{len(shipments)} shipments"
        )
        if ok:
            _say("   OK: exactly one shipment for each committed order, none for the rolled back")
        else:
            for problem in problems:
                _say(f"   FAILED: {problem}")
        _say()
        return ok

    def _close_logs(self) -> None:
        for daemon in self.daemons:
            daemon.close()

    def _print_logs(self) -> None:
        for daemon in self.daemons:
            _say(f"--- last lines of the {daemon.name}'s output ---")
            _say(daemon.tail())


def _wrap(words: Sequence[str], width: int) -> list[str]:
    """A command line cut before its options so that lines stay within `width` characters."""
    units: list[str] = []
    for word in words:
        if units and not word.startswith("--") and units[-1].startswith("--"):
            units[-1] += " " + word  # an option and its value stay together
        else:
            units.append(word)
    lines = [""]
    for unit in units:
        if lines[-1] and unit.startswith("--") and len(lines[-1]) + len(unit) + 3 > width:
            lines[-1] += " \\"
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + unit
    return lines


def _registered(url: str, queue: str) -> bool:
    """Whether a relay of `queue` ("producer" or "handler") registered in `url`."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox.relay_state WHERE queue = %s", (queue,)
        ).fetchone()
    return bool(row and row[0])


class _GroupWatch:
    """Asks the broker whether a consumer group is stable (joined, partitions assigned)."""

    def __init__(self, bootstrap: str, group: str) -> None:
        from confluent_kafka.admin import AdminClient

        # log_level 3: errors only; a timed-out request is no news worth printing here.
        self._admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        self._group = group

    def stable(self) -> bool:
        from confluent_kafka import ConsumerGroupState, KafkaException

        futures = self._admin.describe_consumer_groups([self._group], request_timeout=2)
        try:
            description = futures[self._group].result(timeout=3)
        except (KafkaException, TimeoutError):
            return False
        return bool(description.state == ConsumerGroupState.STABLE)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m examples.demo [--messages N]`."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.demo",
        description="Start local servers and show messages travelling end to end between two "
        "services.",
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--messages", type=flag_type("count"), default=10, help="orders to place, one message each"
    )
    args = parser.parse_args(argv)
    return run_demo(messages=args.messages)


if __name__ == "__main__":
    sys.exit(main())
