"""Routing on the way in: a consumer of several databases stores each record in its tenant's
inbox (outbox/daemons/routing.py). The transport is the in-memory one (fast, and its committed
offsets are easy to read); the databases are real PostgreSQL databases of the harness. The
Kafka path and a kill -9 are in test_routing_kafka.py."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from outbox.core.databases import Database
from outbox.core.errors import ConfigurationError
from outbox.core.headers import TENANT_HEADER
from outbox.daemons.consumer import Consumer, ConsumerConfig, Subscription
from outbox.daemons.routing import Routing
from outbox.postgres import migrate
from outbox.runtime import postgres_stores
from outbox.testing.memory import InMemoryTransport
from outbox.testing.servers import drop_database

from .relay_helpers import running, wait_for

TOPIC = "orders"
GROUP = "g"


def _rows(url: str) -> list[tuple[Any, ...]]:
    """(payload, dead, last_error) of every row of the inbox, in offset order per partition."""
    try:
        with psycopg.connect(url) as conn:
            return conn.execute(
                "SELECT payload, dead_at IS NOT NULL, last_error FROM outbox.consumer_queue "
                "ORDER BY source_partition, source_offset"
            ).fetchall()
    except psycopg.errors.UndefinedTable:
        return []


def _payloads(url: str, dead: bool = False) -> list[bytes]:
    return sorted(bytes(r[0]) for r in _rows(url) if r[1] == dead)


def _send(transport: InMemoryTransport, tenant: bytes | None, payload: bytes, key: bytes) -> None:
    headers = [] if tenant is None else [(TENANT_HEADER, tenant)]
    transport.append(TOPIC, key, payload, headers)


def _end_offsets(transport: InMemoryTransport) -> dict[int, int]:
    return {p: len([r for r in transport.records(TOPIC) if r.partition == p]) for p in range(3)}


def _committed(transport: InMemoryTransport) -> dict[int, int]:
    return {p: transport.committed(GROUP, TOPIC, p) for p in range(3)}


def _consumer(transport: InMemoryTransport, databases: list[Database], **routing: Any) -> Consumer:
    # Built by hand: the test tunes the routing (its memory bound, its re-read interval). The
    # quarantine database is named, as routing requires: the first one unless a test says.
    if "dedicated" not in routing:
        routing.setdefault("quarantine", databases[0].name)
    return Consumer(
        ConsumerConfig(batch_size=50, poll_timeout=0.05, connect_timeout=2),
        lambda: transport.subscriber([TOPIC], GROUP),
        subscription=Subscription(group=GROUP, topics=[TOPIC]),
        inbox=postgres_stores().inboxes,
        routing=Routing(databases=tuple(databases), **routing),
    )


@pytest.fixture
def tenants(outbox_database_factory: Callable[..., str]) -> Iterator[dict[str, str]]:
    """Three migrated tenant databases, by NAME."""
    yield {name: outbox_database_factory() for name in ("acme", "globex", "initech")}


def _databases(tenants: dict[str, str]) -> list[Database]:
    return [Database(name, url, "outbox") for name, url in tenants.items()]


def test_each_record_lands_in_its_tenants_inbox_and_the_unroutable_are_quarantined(
    tenants: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 3)
    for n in range(30):
        tenant = list(tenants)[n % 3]
        _send(transport, tenant.encode(), f"{tenant}-{n}".encode(), b"k%d" % n)
    _send(transport, None, b"no-header", b"x")
    _send(transport, b"umbrella", b"unknown", b"y")
    _send(transport, b"\xff\xfe", b"undecodable", b"z")
    transport.append(TOPIC, b"w", b"twice", [(TENANT_HEADER, b"acme"), (TENANT_HEADER, b"acme")])
    caplog.set_level(logging.WARNING, "outbox.consumer")
    consumer = _consumer(transport, _databases(tenants), quarantine="globex")
    with running(consumer):
        wait_for(lambda: _committed(transport) == _end_offsets(transport), 30, "every commit")
    for tenant, url in tenants.items():
        assert _payloads(url) == sorted(
            f"{tenant}-{n}".encode() for n in range(30) if list(tenants)[n % 3] == tenant
        )
    assert _payloads(tenants["acme"], dead=True) == []
    assert _payloads(tenants["initech"], dead=True) == []
    errors = {bytes(r[0]): r[2] for r in _rows(tenants["globex"]) if r[1]}
    assert errors[b"no-header"] == "no tenant header ('outbox-tenant')"
    assert errors[b"unknown"] == "unknown tenant 'umbrella'"
    assert errors[b"undecodable"].startswith("tenant header 'outbox-tenant' is not UTF-8 text")
    assert errors[b"twice"].startswith("tenant header 'outbox-tenant' comes 2 times")
    assert (consumer.stored, consumer.quarantined) == (30, 4)
    assert any("quarantined" in r.getMessage() for r in caplog.records)


def test_a_quarantine_database_of_its_own_stores_only_what_cannot_be_routed(
    tenants: dict[str, str], outbox_database_factory: Callable[..., str]
) -> None:
    """`--quarantine-database quarantine=URL`: the records of no tenant are dead there, none in
    a tenant's inbox; a record naming the quarantine database as its tenant is one of them."""
    quarantine = Database("quarantine", outbox_database_factory(), "outbox")
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 3)
    for n, tenant in enumerate(tenants):
        _send(transport, tenant.encode(), f"{tenant}-{n}".encode(), b"k%d" % n)
    _send(transport, None, b"no-header", b"x")
    _send(transport, b"umbrella", b"unknown", b"y")
    _send(transport, b"quarantine", b"not-a-tenant", b"z")
    consumer = _consumer(transport, _databases(tenants), dedicated=quarantine)
    assert consumer.database.name == "quarantine"  # readiness checks the quarantine database
    with running(consumer):
        wait_for(lambda: _committed(transport) == _end_offsets(transport), 30, "every commit")
    for n, (tenant, url) in enumerate(tenants.items()):
        assert _payloads(url) == [f"{tenant}-{n}".encode()]
        assert _payloads(url, dead=True) == []
    assert _payloads(quarantine.url) == []
    errors = {bytes(r[0]): r[2] for r in _rows(quarantine.url) if r[1]}
    assert errors == {
        b"no-header": "no tenant header ('outbox-tenant')",
        b"unknown": "unknown tenant 'umbrella'",
        b"not-a-tenant": "unknown tenant 'quarantine'",
    }
    assert (consumer.stored, consumer.quarantined) == (3, 3)


def test_a_quarantine_database_of_its_own_is_no_tenants() -> None:
    tenants = [Database("acme", "postgresql://h/acme", "outbox")]
    with pytest.raises(ConfigurationError, match="database name 'acme' is given twice"):
        Routing(databases=tuple(tenants), dedicated=Database("acme", "postgresql://h/q", "o"))
    with pytest.raises(ConfigurationError, match="a database of its own, not 'acme'"):
        Routing(
            databases=tuple(tenants),
            quarantine="acme",
            dedicated=Database("q", "postgresql://h/q", "outbox"),
        )


def test_a_failing_tenant_holds_back_only_itself_and_its_offsets(
    outbox_database_factory: Callable[..., str],
) -> None:
    # acme's database exists but is not migrated: its records wait (the partition's offset
    # stays below the oldest), the others flow; once migrated, acme's are stored too.
    good = outbox_database_factory()
    acme = outbox_database_factory(migrated=False)
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    for n in range(10):
        _send(transport, b"good", b"good-%d" % n, b"k")
    _send(transport, b"acme", b"acme-0", b"k")
    for n in range(10, 20):
        _send(transport, b"good", b"good-%d" % n, b"k")
    databases = [Database("good", good, "outbox"), Database("acme", acme, "outbox")]
    consumer = _consumer(transport, databases)
    with running(consumer):
        wait_for(lambda: len(_payloads(good)) == 20, 30, "the good tenant's records")
        wait_for(lambda: transport.committed(GROUP, TOPIC, 0) == 10, 30, "the commit up to acme")
        migrate.upgrade(acme, "outbox")
        wait_for(lambda: _payloads(acme) == [b"acme-0"], 30, "acme's record once migrated")
        wait_for(lambda: transport.committed(GROUP, TOPIC, 0) == 21, 30, "the commit past it")
    assert len(_payloads(good)) == 20


def test_beyond_the_memory_bound_records_are_read_again_and_stored_once(
    outbox_database_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "outbox.consumer")
    good = outbox_database_factory()
    acme = outbox_database_factory(migrated=False)
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 3)
    for n in range(200):
        tenant = b"acme" if n % 4 == 0 else b"good"
        _send(transport, tenant, b"%s-%d" % (tenant, n), b"k%d" % n)
    databases = [Database("good", good, "outbox"), Database("acme", acme, "outbox")]
    # Room for about one batch of acme's records: the rest is not kept while acme fails.
    consumer = _consumer(transport, databases, held_bytes=5000)
    with running(consumer):
        wait_for(lambda: len(_payloads(good)) == 150, 30, "the good tenant's records")
        assert transport.committed(GROUP, TOPIC, 0) < _end_offsets(transport)[0]
        migrate.upgrade(acme, "outbox")
        wait_for(lambda: len(_payloads(acme)) == 50, 30, "acme's records, read again")
        wait_for(lambda: _committed(transport) == _end_offsets(transport), 30, "every commit")
    assert len(_payloads(good)) == 150  # the inbox stores a message once, read again or not
    assert any("not kept" in r.getMessage() for r in caplog.records)
    assert any("reading again" in r.getMessage() for r in caplog.records)


def test_past_the_bound_a_tenant_keeps_its_keys_order_and_does_not_wait_for_another(
    outbox_database_factory: Callable[..., str],
) -> None:
    # acme and beta fail, both beyond the bound; beta works again while acme still fails:
    # beta's records not kept are read again at once, and every key keeps its order.
    urls = {name: outbox_database_factory(migrated=False) for name in ("acme", "beta")}
    good = outbox_database_factory()
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    names = (b"good", b"acme", b"beta")
    for n in range(240):
        _send(transport, names[n % 3], b"%d" % n, b"k")  # one key, one partition
    databases = [Database("good", good, "outbox")]
    databases += [Database(name, url, "outbox") for name, url in urls.items()]
    consumer = _consumer(transport, databases, held_bytes=5000)
    with running(consumer):
        wait_for(lambda: len(_payloads(good)) == 80, 30, "the good tenant's records")
        migrate.upgrade(urls["beta"], "outbox")
        wait_for(lambda: len(_payloads(urls["beta"])) == 80, 30, "beta's, acme still failing")
        migrate.upgrade(urls["acme"], "outbox")
        wait_for(lambda: len(_payloads(urls["acme"])) == 80, 30, "acme's")
        wait_for(lambda: _committed(transport) == _end_offsets(transport), 30, "every commit")
    for url in (good, *urls.values()):
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT source_offset FROM outbox.consumer_queue ORDER BY id")
            offsets = [r[0] for r in rows]
        assert offsets == sorted(offsets) and len(offsets) == 80


def test_a_dropped_tenant_waits_until_removed_from_the_file_then_is_quarantined(
    tenants: dict[str, str], outbox_admin_url: str, tmp_path: Path
) -> None:
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    file = tmp_path / "tenants.txt"
    file.write_text("".join(f"{name}={url}\n" for name, url in tenants.items()))
    databases = _databases(tenants)
    consumer = _consumer(transport, databases, databases_file=str(file), reread_interval=0.2)
    with running(consumer):
        for n in range(3):
            _send(transport, b"acme", b"acme-%d" % n, b"k")
        wait_for(lambda: len(_payloads(tenants["acme"])) == 3, 30, "acme's first records")
        drop_database(outbox_admin_url, urlsplit(tenants["initech"]).path.lstrip("/"))
        for n in range(3, 6):
            _send(transport, b"initech", b"initech-%d" % n, b"k")
            _send(transport, b"acme", b"acme-%d" % n, b"k")
        wait_for(lambda: len(_payloads(tenants["acme"])) == 6, 30, "acme flowing past initech")
        assert transport.committed(GROUP, TOPIC, 0) == 3  # below initech's first record
        file.write_text(f"acme={tenants['acme']}\nglobex={tenants['globex']}\n")
        wait_for(lambda: len(_payloads(tenants["acme"], dead=True)) == 3, 30, "the quarantine")
        wait_for(lambda: transport.committed(GROUP, TOPIC, 0) == 9, 30, "the commit past them")
    errors = {r[2] for r in _rows(tenants["acme"]) if r[1]}
    assert errors == {"unknown tenant 'initech'"}


def test_a_bad_databases_file_is_logged_once_and_the_last_good_list_kept(
    tenants: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    file = tmp_path / "tenants.txt"
    file.write_text("".join(f"{name}={url}\n" for name, url in tenants.items()))
    caplog.set_level(logging.WARNING, "outbox.consumer")
    consumer = _consumer(
        transport, _databases(tenants), databases_file=str(file), reread_interval=0.05
    )
    with running(consumer):
        file.write_text("acme=postgresql://u:secret@h/db\nacme=postgresql://other/db\n")
        wait_for(lambda: any("databases file" in r.getMessage() for r in caplog.records), 10, "log")
        _send(transport, b"initech", b"still-served", b"k")
        wait_for(lambda: _payloads(tenants["initech"]) == [b"still-served"], 30, "the record")
    lines = [r.getMessage() for r in caplog.records if "databases file" in r.getMessage()]
    assert len(lines) == 1
    assert "given twice" in lines[0] and "secret" not in lines[0]


def test_a_tenant_added_to_the_file_is_served_from_its_first_record(
    tenants: dict[str, str], tmp_path: Path
) -> None:
    """The file is read when it changes, not only every reread_interval: a tenant added and
    sent to at once is stored in its inbox, never quarantined as unknown."""
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    file = tmp_path / "tenants.txt"
    first = {name: url for name, url in tenants.items() if name != "globex"}
    file.write_text("".join(f"{name}={url}\n" for name, url in first.items()))
    consumer = _consumer(
        transport, _databases(first), databases_file=str(file), reread_interval=3600.0
    )
    with running(consumer):
        _send(transport, b"acme", b"acme-0", b"k")
        wait_for(lambda: len(_payloads(tenants["acme"])) == 1, 30, "acme's first record")
        file.write_text("".join(f"{name}={url}\n" for name, url in tenants.items()))
        for n in range(5):
            _send(transport, b"globex", b"globex-%d" % n, b"k")
        wait_for(lambda: len(_payloads(tenants["globex"])) == 5, 30, "globex's records")
    assert [r for r in _rows(tenants["acme"]) if r[1]] == []  # nothing quarantined
    assert _payloads(tenants["globex"]) == [b"globex-%d" % n for n in range(5)]


def test_databases_that_do_not_answer_hold_back_only_their_own_records(
    tenants: dict[str, str],
) -> None:
    """Connections are opened off the loop, all at once: ten databases whose server accepts
    and never answers (each connect waits connect_timeout, 2 s) neither delay the consumer's
    start nor the records of the databases that answer (serially: 20 s before the first)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepted by the kernel, never answered
    port = silent.getsockname()[1]
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    mute = [
        Database(f"mute{n}", f"postgresql://u@127.0.0.1:{port}/db{n}", "outbox") for n in range(10)
    ]
    consumer = _consumer(transport, [*mute, *_databases(tenants)])
    try:
        with running(consumer):
            started = time.monotonic()
            for n in range(3):
                _send(transport, b"mute3", b"mute-%d" % n, b"m")
                _send(transport, b"acme", b"acme-%d" % n, b"k")
            wait_for(lambda: len(_payloads(tenants["acme"])) == 3, 30, "acme's records")
            took = time.monotonic() - started
            assert transport.committed(GROUP, TOPIC, 0) == 0  # below mute3's first record
    finally:
        silent.close()
    assert took < 8, f"acme's records waited {took:.1f} s for databases that do not answer"


def test_records_of_a_tenant_not_yet_in_the_file_wait_for_it_then_are_stored_in_order(
    tenants: dict[str, str], tmp_path: Path
) -> None:
    """The producer's databases file named the tenant first: its records reach a consumer
    whose file does not name it yet. They wait (unknown_grace), holding back only themselves
    and the offsets below them; once the file names the tenant they are stored, in order."""
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    file = tmp_path / "tenants.txt"
    first = {name: url for name, url in tenants.items() if name != "globex"}
    file.write_text("".join(f"{name}={url}\n" for name, url in first.items()))
    consumer = _consumer(transport, _databases(first), databases_file=str(file))
    with running(consumer):
        for n in range(5):
            _send(transport, b"globex", b"globex-%d" % n, b"k%d" % (n % 2))
            _send(transport, b"acme", b"acme-%d" % n, b"k")
        wait_for(lambda: len(_payloads(tenants["acme"])) == 5, 30, "acme's records")
        time.sleep(1.0)
        assert _payloads(tenants["acme"], dead=True) == []  # globex's not quarantined
        assert transport.committed(GROUP, TOPIC, 0) == 0  # below globex's first record
        file.write_text("".join(f"{name}={url}\n" for name, url in tenants.items()))
        wait_for(lambda: len(_payloads(tenants["globex"])) == 5, 30, "globex's records")
        wait_for(lambda: transport.committed(GROUP, TOPIC, 0) == 10, 30, "the commit")
    stored = [bytes(r[0]) for r in _rows(tenants["globex"])]
    assert stored == [b"globex-%d" % n for n in range(5)]  # in the order sent
    assert [r for r in _rows(tenants["acme"]) if r[1]] == []  # nothing quarantined


def test_records_of_a_tenant_the_file_never_names_are_quarantined_after_their_wait(
    tenants: dict[str, str], tmp_path: Path
) -> None:
    transport = InMemoryTransport()
    transport.create_topic(TOPIC, 1)
    file = tmp_path / "tenants.txt"
    file.write_text("".join(f"{name}={url}\n" for name, url in tenants.items()))
    consumer = _consumer(
        transport, _databases(tenants), databases_file=str(file), unknown_grace=1.0
    )
    with running(consumer):
        started = time.monotonic()
        _send(transport, b"umbrella", b"lost-0", b"k")
        _send(transport, None, b"headless", b"k")
        wait_for(lambda: len(_payloads(tenants["acme"], dead=True)) == 1, 30, "no header: at once")
        wait_for(lambda: len(_payloads(tenants["acme"], dead=True)) == 2, 30, "the wait's end")
        assert time.monotonic() - started >= 1.0
        wait_for(lambda: transport.committed(GROUP, TOPIC, 0) == 2, 30, "the commit past them")
    errors = {r[2] for r in _rows(tenants["acme"]) if r[1]}
    assert "unknown tenant 'umbrella'" in errors
