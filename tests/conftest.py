"""Shared pytest configuration.

The outbox fixtures (`outbox_servers`, `outbox_database_url`, `outbox_topic`, ...) come from the
`outbox.testing.plugin` pytest plugin, loaded through the package's `pytest11` entry point once
it is installed (`./run test` does that). Do not also list it in `pytest_plugins`: pytest
would register it twice and fail. pytest's own `pytester` is enabled here, for the tests that run
a user's test files in a subprocess (tests/integration/test_plugin_lazy_servers.py).

`relay_transport` runs a test on each registered transport that crosses processes: Kafka and
the log kept in PostgreSQL (tests/integration/relay_helpers.py, `RelayTransport`), each by its
own harness.

The property tests (Hypothesis) draw new examples on every run on a developer's machine, to go
on finding what no one thought of; under CI (`CI` set) they draw the same examples every run
(`derandomize`), so that a run is red for a change, not for a new draw. Run them with
`HYPOTHESIS_PROFILE=explore` (or without CI) to explore, and keep what they find as a case.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable

import pytest
from hypothesis import settings as hypothesis_settings

from outbox import transports
from tests.integration.relay_helpers import TEST_CONSUMER_KAFKA, RelayTransport

hypothesis_settings.register_profile("ci", derandomize=True)
hypothesis_settings.register_profile("explore")
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "explore")
)

pytest_plugins = ["pytester"]

#: The daemons' transports the end-to-end and fault tests run on: every registered transport
#: whose records other processes see (a module of OUTBOX_TRANSPORT_MODULES adds its own).
RELAY_TRANSPORTS = list(transports.names("processes"))


def _kafka_harness(request: pytest.FixtureRequest) -> RelayTransport:
    """Kafka: the session's broker."""
    return RelayTransport(
        "kafka",
        request.getfixturevalue("outbox_kafka_bootstrap"),
        request.getfixturevalue("outbox_topic_factory"),
        TEST_CONSUMER_KAFKA,
    )


def _log_harness(request: pytest.FixtureRequest) -> RelayTransport:
    """The log kept in PostgreSQL: a fresh migrated log database."""
    from outbox.pglog import PgLog

    url: str = request.getfixturevalue("outbox_log_url")
    log = PgLog(url)

    def make_topic(partitions: int = 3) -> str:
        name = f"t-{secrets.token_hex(4)}"
        log.create_topic(name, partitions)
        return name

    return RelayTransport("postgres", url, make_topic, {})


#: How the end-to-end tests drive each transport: they read a topic back, and start daemons
#: with its flags (tests/integration/relay_helpers.py).
RELAY_HARNESSES: dict[str, Callable[[pytest.FixtureRequest], RelayTransport]] = {
    "kafka": _kafka_harness,
    "postgres": _log_harness,
}


@pytest.fixture(params=RELAY_TRANSPORTS)
def relay_transport(request: pytest.FixtureRequest) -> RelayTransport:
    """Each registered transport that crosses processes, for the tests that exercise the
    transport end to end: Kafka (the session's broker), the log kept in PostgreSQL (a fresh
    migrated log database), and any other registered one its harness is known for."""
    harness = RELAY_HARNESSES.get(request.param)
    if harness is None:
        pytest.skip(
            f"transport {request.param!r} has no end-to-end harness in tests/conftest.py "
            "(RELAY_HARNESSES); its contract and CLI tests run it"
        )
    return harness(request)
