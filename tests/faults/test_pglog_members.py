"""Members of a log consumer group as real `outbox consumer --transport postgres` processes,
frozen (SIGSTOP) and killed (SIGKILL) while records flow: a frozen member's partitions are taken
over after its session timeout, a woken one rejoins without committing over its successor, and
every record reaches the inbox."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

from outbox.pglog import PgLog
from outbox.testing.plugin import DatabaseFactory

from ..integration.relay_helpers import Daemon, count, wait_for
from ..integration.test_pglog import publish
from ..integration.test_pglog_groups import TOPIC, _ends, _holders
from ..integration.test_pglog_groups import log_url as log_url

pytestmark = pytest.mark.faults


def consumer(inbox: str, log_url: str, group: str = "g") -> Daemon:
    return Daemon(
        "consumer",
        "--database-url",
        inbox,
        "--transport",
        "postgres",
        "--log-url",
        log_url,
        "--topic",
        TOPIC,
        "--group",
        group,
        "--log-session-timeout",
        "2",
    )


def test_a_consumer_process_frozen_with_sigstop_loses_its_partitions_and_loses_nothing(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    inbox = outbox_database_factory()
    PgLog(log_url).create_topic(TOPIC, 4)
    with consumer(inbox, log_url) as frozen, consumer(inbox, log_url) as survivor:
        wait_for(lambda: _holders(log_url) == 2, 30, "both members to hold partitions")
        publish(log_url, TOPIC, 0, 400)
        wait_for(lambda: count(inbox, "consumer_queue") == 400, 60, "the first 400 stored")
        frozen.signal(signal.SIGSTOP)
        try:
            publish(log_url, TOPIC, 400, 1200)
            wait_for(
                lambda: count(inbox, "consumer_queue") == 1200, 30, "the survivor to take over"
            )
            assert _holders(log_url) == 1
        finally:
            frozen.signal(signal.SIGCONT)
        # The woken member finds its session ended, rejoins, and shares the partitions again.
        wait_for(lambda: _holders(log_url) == 2, 30, "the woken member to rejoin")
        publish(log_url, TOPIC, 1200, 1600)
        wait_for(lambda: count(inbox, "consumer_queue") == 1600, 30, "every record stored")
        for daemon in (frozen, survivor):
            assert daemon.process.poll() is None, daemon.output()
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(30) == 0, daemon.output()
        assert "evicted member" in survivor.output(), survivor.output()
    assert PgLog(log_url).committed("g", TOPIC) == _ends(log_url)
    assert count(inbox, "consumer_queue") == 1600


def test_three_members_frozen_and_killed_at_random_while_records_flow(
    outbox_database_factory: DatabaseFactory, log_url: str
) -> None:
    inbox = outbox_database_factory()
    PgLog(log_url).create_topic(TOPIC, 6)
    rng = random.Random(22)
    published = 0
    stop = threading.Event()

    def flow() -> None:
        nonlocal published
        while not stop.is_set():
            publish(log_url, TOPIC, published, published + 50)
            published += 50
            time.sleep(0.05)

    members = [consumer(inbox, log_url) for _ in range(3)]
    outputs: list[str] = []
    publisher = threading.Thread(target=flow)
    try:
        wait_for(lambda: _holders(log_url) == 3, 30, "three members to hold partitions")
        publisher.start()
        # Frozen past the session timeout (evicted, then woken), frozen briefly (kept),
        # killed (restarted): each at a random member, twice.
        for action in ["freeze long", "freeze short", "kill", "freeze long", "kill"]:
            i = rng.randrange(3)
            if action == "kill":
                members[i].signal(signal.SIGKILL)
                members[i].wait(10)
                outputs.append(members[i].output())
                members[i].close()
                members[i] = consumer(inbox, log_url)
            else:
                members[i].signal(signal.SIGSTOP)
                time.sleep(5 if action == "freeze long" else 1)
                members[i].signal(signal.SIGCONT)
            time.sleep(rng.uniform(1, 3))
        stop.set()
        publisher.join()
        wait_for(lambda: count(inbox, "consumer_queue") == published, 60, "every record stored")
        wait_for(lambda: _holders(log_url) == 3, 30, "three members again")
        wait_for(
            lambda: PgLog(log_url).committed("g", TOPIC) == _ends(log_url),
            30,
            "every offset committed",
        )
        for member in members:
            assert member.process.poll() is None, member.output()
            member.signal(signal.SIGTERM)
            assert member.wait(30) == 0, member.output()
            outputs.append(member.output())
        # The long freezes were evictions.
        assert sum(o.count("evicted member") for o in outputs) >= 2, outputs
    finally:
        stop.set()
        if publisher.is_alive():
            publisher.join()
        for member in members:
            if member.process.poll() is None:
                member.signal(signal.SIGCONT)
            member.close()
    assert count(inbox, "consumer_queue") == published
