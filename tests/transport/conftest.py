"""The transports under test: every contract test runs against each registered transport
(watermill's pattern), made by the contract factory its adapter declares in its registry entry
(`Transport.contract`, outbox/transports.py).

`memory` needs no server; `kafka` is the session's real broker (Tansu locally, or Kafka from
OUTBOX_TEST_KAFKA_BOOTSTRAP / testcontainers), through the same adapters the daemons use;
`postgres` is the PostgreSQL log (outbox.pglog) in a fresh database of the session's server. A
transport registered by a module of OUTBOX_TRANSPORT_MODULES runs here too (the tests' own
append-only log of files, tests/transport/files_log.py, always does).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from outbox import transports
from outbox.ports import ContractTransport

#: What the contract tests are given: a registered transport's contract factory's transport.
TransportUnderTest = ContractTransport

#: The tests' own transport, registered by its module as a third party's would be.
TEST_TRANSPORT_MODULE = "tests.transport.files_log"


def registered_contracts() -> list[str]:
    """The registered transports that declare a contract factory, and the tests' own (which
    is registered for each of its tests only: registered for the session, it would be offered
    by every command's `--transport` in the other tests)."""
    found = [name for name in transports.names() if transports.get(name).contract is not None]
    return [*found, TEST_TRANSPORT] if TEST_TRANSPORT not in found else found


#: The name the tests' own transport registers.
TEST_TRANSPORT = "files"


def register_test_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the tests' own transport for one test: its module registers it when first
    imported, as a third party's does; the registry is put back after the test."""
    monkeypatch.setattr(transports, "_REGISTERED", dict(transports._REGISTERED))
    module = importlib.import_module(TEST_TRANSPORT_MODULE)
    transports.register(module.FILES)


def _entry(request: pytest.FixtureRequest) -> transports.Transport[object]:
    if request.param == TEST_TRANSPORT:
        register_test_transport(request.getfixturevalue("monkeypatch"))
    return transports.get(request.param)


@pytest.fixture(params=registered_contracts())
def transport(request: pytest.FixtureRequest) -> Iterator[TransportUnderTest]:
    """Each registered transport in turn."""
    factory = _entry(request).contract
    assert factory is not None
    under_test = factory(request)
    try:
        yield under_test
    finally:
        under_test.close_all()


@pytest.fixture(params=registered_contracts())
def process_transport(request: pytest.FixtureRequest) -> Iterator[TransportUnderTest]:
    """Each registered transport whose records other processes see ("processes" in its
    features): for the contract cases that cross processes. The others are skipped, saying
    why."""
    entry = _entry(request)
    if "processes" not in entry.features:
        pytest.skip(f"{entry.label} lives in one process: nothing crosses a process")
    assert entry.contract is not None
    under_test = entry.contract(request)
    try:
        yield under_test
    finally:
        under_test.close_all()
