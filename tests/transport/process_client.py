"""A publisher or a group member of a registered transport, in a process of its own, for the
contract cases that cross processes (tests/transport/test_contract_processes.py).

    python -m tests.transport.process_client publish SETTINGS TOPIC FIRST COUNT BATCH PAUSE ACKS
    python -m tests.transport.process_client consume SETTINGS TOPIC GROUP OUT MOST PAUSE

SETTINGS is a `TransportSettings`, pickled and base64-encoded (the transport's options are
frozen dataclasses). A publisher publishes messages FIRST..FIRST+COUNT-1 (payload
{"n": N, "by": PID}, one key, so one partition) in batches of BATCH, pausing PAUSE seconds
between batches, and appends each acknowledged N to the file ACKS (flushed and fsynced) once
`publish` returned. A member polls TOPIC as GROUP (MOST records at a time, then PAUSE seconds
of work), appends `read N partition offset` for each record to OUT, commits the batch, then
appends `committed N` for each; SIGTERM closes it (it leaves the group).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import sys
import time
from typing import Any

from outbox import transports
from outbox.core.batches import outgoing


def _settings(text: str) -> transports.TransportSettings:
    found: transports.TransportSettings = pickle.loads(base64.b64decode(text))
    return found


def encode(settings: transports.TransportSettings) -> str:
    return base64.b64encode(pickle.dumps(settings)).decode()


def _append(path: str, lines: list[str]) -> None:
    with open(path, "a") as handle:
        handle.write("".join(f"{line}\n" for line in lines))
        handle.flush()
        os.fsync(handle.fileno())


def publish(found: transports.TransportSettings, topic: str, first: int, count: int,
            batch: int, pause: float, acks: str) -> None:  # fmt: skip
    from tests.transport.test_contract import message

    entry = transports.get(found.name)
    publisher = entry.make_publishers(transports.options(found))[0]()
    me = os.getpid()
    try:
        for start in range(first, first + count, batch):
            numbers = list(range(start, min(start + batch, first + count)))
            records = [
                outgoing(message(topic, json.dumps({"n": n, "by": me}).encode(), key=b"one"))
                for n in numbers
            ]
            results = publisher.publish(records)
            _append(
                acks, [str(n) for n, failed in zip(numbers, results, strict=True) if not failed]
            )
            time.sleep(pause)
    finally:
        publisher.close()


def consume(
    found: transports.TransportSettings,
    topic: str,
    group: str,
    out: str,
    most: int = 20,
    pause: float = 0.05,
) -> None:
    entry = transports.get(found.name)
    subscriber: Any = entry.make_subscribers(
        transports.options(found), group, [topic], found.start
    )[0]()
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    _append(out, ["started"])
    try:
        while not stopping:
            batch = subscriber.poll(most, 0.2)
            rows = batch.rows()
            if not rows:
                continue
            _append(
                out,
                [f"read {json.loads(r.payload)['n']} {r.partition} {r.offset}" for r in rows],
            )
            time.sleep(pause)  # a little work per batch, so that a rebalance meets one
            subscriber.commit(batch)
            _append(out, [f"committed {json.loads(r.payload)['n']}" for r in rows])
    finally:
        subscriber.close()
        _append(out, ["closed"])


def main(argv: list[str]) -> None:
    mode, settings, *rest = argv
    found = _settings(settings)
    if mode == "publish":
        topic, first, count, batch, pause, acks = rest
        publish(found, topic, int(first), int(count), int(batch), float(pause), acks)
    else:
        topic, group, out, most, pause = rest
        consume(found, topic, group, out, int(most), float(pause))


if __name__ == "__main__":
    main(sys.argv[1:])
