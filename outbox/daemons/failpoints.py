"""Named points where the fault-injection suite kills a daemon, to prove nothing is lost.

`OUTBOX_FAILPOINT=name` (or `name@n`, the n-th time the point is reached) makes the process
SIGKILL itself at that point. Unset, `failpoint()` is a dictionary-free string comparison.
Points: producer.before_produce, producer.after_produce, producer.after_promote (messages that
fell due moved into producer_queue), consumer.after_insert, handler.before_commit.
"""

from __future__ import annotations

import os
import signal

from outbox.settings import FAILPOINT

POINTS = frozenset(
    {
        "producer.before_produce",
        "producer.after_produce",
        "producer.after_promote",
        "consumer.after_insert",
        "handler.before_commit",
    }
)


def _parse(spec: str | None) -> tuple[str | None, int]:
    if not spec:
        return None, 0
    name, _, nth = spec.partition("@")
    if name not in POINTS:
        raise ValueError(f"OUTBOX_FAILPOINT names an unknown point {name!r}: {sorted(POINTS)}")
    return name, int(nth or 1)


_target, _nth = _parse(os.environ.get(FAILPOINT))
_reached = 0


def failpoint(name: str) -> None:
    """Kill this process with SIGKILL if `name` is the armed point and its turn has come."""
    global _reached
    if name != _target:
        return
    _reached += 1
    if _reached >= _nth:
        os.kill(os.getpid(), signal.SIGKILL)
