"""`outbox dev` as a process, as a user runs it in a terminal of its own.

`DevProcess` starts it, reads its stdout until it says it runs, and gives the `export` lines it
printed as a mapping; `stop` sends a signal and waits. `processes_under` finds the processes that
run in or name a directory (a PostgreSQL's postmaster and its backends, whose working directory
is the data directory; Tansu's, whose working directory is its own), to tell that none is left.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from outbox.settings import TANSU_BIN

#: `outbox` of the package under test (the checkout's, on PYTHONPATH).
OUTBOX = (sys.executable, "-m", "outbox.cli")
#: The line `outbox dev` prints once the exports are out.
RUNNING = re.compile(
    r"^# running until Ctrl-C .*: then the servers stop and (\S+) (?:is removed|stays)$"
)
EXPORT = re.compile(r"^export ([A-Z_][A-Z0-9_]*)=(.*)$")


class DevProcess:
    """`outbox dev ARGS` in the background; its output is kept line by line."""

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        outbox: Sequence[str] = OUTBOX,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            [*outbox, "dev", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment() if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,  # as in a terminal of its own: our Ctrl-C is not its
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_running(self, timeout: float = 120.0) -> tuple[dict[str, str], Path]:
        """The exports and the servers' directory, once `outbox dev` says it runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = RUNNING.match(line)
                if match:
                    return self.exports(), Path(match.group(1))
            if self.process.poll() is not None:
                self._reader.join(5)
                raise AssertionError(
                    f"outbox dev exited {self.process.returncode}:\n{self.output()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"outbox dev did not say it runs in {timeout:g} s:\n{self.output()}")

    def exports(self) -> dict[str, str]:
        """What the `export` lines set, read as a shell reads them."""
        found = {}
        for line in self.lines:
            match = EXPORT.match(line)
            if match:
                (value,) = shlex.split(match.group(2))
                found[match.group(1)] = value
        return found

    def stop(self, signum: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send `signum`; the exit code (a process that does not stop in time is killed and
        the test fails)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"outbox dev did not stop on {signum.name}:\n{self.output()}"
            ) from None
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def __enter__(self) -> DevProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.process.poll() is None:
            self.stop()


def processes_under(directory: Path) -> list[str]:
    """The processes whose working directory is in `directory` or whose command line names
    it, as `PID command`."""
    root = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd == root or cwd.startswith(root + "/") or root in command:
            found.append(f"{entry.name} {command.strip()}")
    return found


def environment(exports: Mapping[str, str] | None = None, **more: str) -> dict[str, str]:
    """This process's environment as a user's terminal has it: no OUTBOX_* variable of the
    test run (OUTBOX_TANSU_BIN kept: where the broker is), then the exports and `more`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_") or k == TANSU_BIN}
    env.update(exports or {})
    env.update(more)
    return env


def postgres_installed() -> bool:
    """Whether PostgreSQL's server programs are installed, which `outbox dev` runs (with a
    Docker engine instead, it needs testcontainers, which the devserver extra leaves out)."""
    from outbox.testing.servers import ServerError, find_postgres_bindir

    try:
        find_postgres_bindir()
    except ServerError:
        return False
    return True
