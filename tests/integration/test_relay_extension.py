"""The relay's low-latency path: a short batch on its way takes in the rows committed meanwhile
(they go out at once, not after its acknowledgements), keeping per-key order and topic rules,
and its rows are deleted only once all of them were acknowledged."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from outbox.core.batches import OutgoingRecord
from outbox.core.lanes import lane_for
from outbox.daemons import producer
from outbox.daemons.producer import Producer, ProducerConfig
from outbox.ports import DeliveryFailure
from tests.integration.relay_helpers import running, wait_for


def _queued(id_: int, key: bytes | None, topic: str, headers: str | None = None) -> OutgoingRecord:
    return OutgoingRecord(id_, topic, key, b"", "", "", "", headers, 0)


def test_rows_join_a_batch_on_its_way_only_where_order_allows() -> None:
    keys = {b"k": "A"}  # the batch on its way sends k to A
    fetched = [
        _queued(1, b"k", "A"),
        _queued(2, b"k", "B"),  # k to another topic: this row and k's later rows wait
        _queued(3, None, "B"),
        _queued(4, b"k", "A"),
        _queued(5, b"j", "B"),
        _queued(6, b"x", "A", headers='{"h": "v"}'),  # user headers: a batch of its own
        _queued(7, b"m", "A"),
    ]
    assert [r.id for r in producer._joining(fetched, keys)] == [1, 3, 5]
    assert keys == {b"k": "A", b"j": "B"}


class _Extending:
    """A publisher that, while its first batch is on its way, commits `late` rows and takes
    them in through `more` (as the Kafka publisher does)."""

    extends_batches = True

    def __init__(self, commit_late: Callable[[], list[int]]) -> None:
        self.commit_late = commit_late
        self.batches: list[list[int]] = []
        self.deleted_before_ack: list[int] = []

    def publish(
        self,
        records: Sequence[OutgoingRecord],
        meanwhile: Callable[[], None] | None = None,
        more: Callable[[], Sequence[OutgoingRecord] | None] | None = None,
    ) -> list[DeliveryFailure | None]:
        batch = [r.id for r in records]
        if not self.batches:
            assert more is not None, "a short batch should take rows in on its way"
            late = self.commit_late()
            for _ in range(50):  # the late rows are committed: `more` finds them
                batch += [r.id for r in more() or ()]
                if set(late) <= set(batch):
                    break
        elif meanwhile is not None:
            meanwhile()
        self.batches.append(batch)
        return [None] * len(batch)

    def close(self) -> None:
        pass


def _send(conn: psycopg.Connection[Any], key: bytes, topic: str) -> int:
    message_id = uuid.uuid4()
    row = conn.execute(
        "INSERT INTO outbox.producer_queue (message_id, topic, key, payload, headers, "
        "content_type, lane) VALUES (%s, %s, %s, '{}', '{}', 'application/json', %s) "
        "RETURNING id",
        (message_id, topic, key, lane_for(key, message_id)),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_short_batch_takes_in_rows_committed_while_it_is_on_its_way(
    outbox_database_url: str,
) -> None:
    url = outbox_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        first = _send(conn, b"k", "t.a")

        late: list[int] = []

        def commit_late() -> list[int]:
            late.extend(
                [_send(conn, b"k", "t.a"), _send(conn, b"j", "t.a"), _send(conn, b"k", "t.b")]
            )
            return late[:2]

        publisher = _Extending(commit_late)
        config = ProducerConfig(database_url=url, poll_interval=0.2)
        with running(Producer(config, lambda: publisher)):
            wait_for(lambda: len(publisher.batches) >= 2, 20, "two batches")
            wait_for(
                lambda: (
                    conn.execute("SELECT count(*) FROM outbox.producer_queue").fetchone() == (0,)
                ),
                20,
                "every row deleted",
            )
    late_k, late_j, k_to_b = late
    # k's row to t.b may not join a batch that sends k to t.a: it goes in the next one.
    assert publisher.batches[0] == [first, late_k, late_j]
    assert publisher.batches[1] == [k_to_b]
