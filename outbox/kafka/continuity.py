"""A partition's offsets follow each other: a jump is read again before anything is committed.

The Consumer commits, after storing a batch, the offset after the batch's last record of each
partition: every record below it counts as stored. That holds only if the records of a
partition reach it without a hole. A partition's log can have holes of its own (a transaction's
commit marker, aborted records under read_committed, compaction), but a broker can also hand
out a record after the one behind it: the local Tansu broker, with several producers writing
one partition, has been seen answering a fetch at the head of the log with offset n + 1 while
offset n, reserved by another producer's write, was not readable yet (it was there on a later
read). Committing past n lost the record (the chaos soak, tests/faults/test_soak.py).

(Tansu 0.6's memory engine reserves a produce's offsets before it stores the batch, and a
fetch returns the stored batches from the requested offset on without checking that the first
one starts there; its maintainer describes the slow producer / fast producer case in nisshi
pull request 713.)

So, within an assignment, the subscriber knows the offset each partition's next record must
have: the committed offset at assignment, then the last record's offset + 1. A record beyond
it is not delivered: the subscriber seeks the partition back to the missing offset and drops
the partition's later records of that poll. If a read comes back with the missing record, the
broker had skipped it (logged as a warning); if `HOLE_READS` reads in a row jump from the same
offset, the hole is the log's own and is accepted. A real hole costs two more fetches of the
partition (on Apache Kafka, where they come from transactional producers, not from outbox's).
A record below the expected offset (the same broker has been seen delivering one twice in a
row) was delivered already, or lies below the committed offset: it is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

log = logging.getLogger("outbox.consumer")

Partition = tuple[str, int]

#: Reads in a row that must jump from the same offset before the hole is taken as the log's.
HOLE_READS = 3


class Record(Protocol):
    """What the check reads of a record (a confluent-kafka `Message` is one)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...


R = TypeVar("R", bound=Record)


class Continuity:
    """The expected next offset of each assigned partition, and the jumps being read again."""

    def __init__(self) -> None:
        #: (topic, partition) -> the offset its next record must have; absent: not known yet.
        self._expected: dict[Partition, int] = {}
        #: (topic, partition) -> (the missing offset it was sought back to, reads that jumped).
        self._rereading: dict[Partition, tuple[int, int]] = {}
        #: Counters (tests, logs): records a broker skipped and gave on the second read; holes
        #: that were the log's own.
        self.skipped = 0
        self.holes = 0

    def start(self, partition: Partition, offset: int) -> None:
        """`partition` was assigned and reads from `offset` (a committed or sought offset)."""
        self._rereading.pop(partition, None)
        if offset >= 0:
            self._expected[partition] = offset
        else:
            self._expected.pop(partition, None)

    def forget(self, partitions: Iterable[Partition]) -> None:
        """`partitions` were revoked or lost: their next assignment starts afresh."""
        for partition in partitions:
            self._expected.pop(partition, None)
            self._rereading.pop(partition, None)

    def admit(self, records: Sequence[R]) -> tuple[Sequence[R], dict[Partition, int]]:
        """The records that follow on from what was delivered, and the partitions to seek back
        (to the offset missing before a jump; none of their later records is kept)."""
        if self._rereading:
            return self._admit_slowly(records, 0)
        expected = self._expected
        for i, record in enumerate(records):  # the usual case: every record follows on
            partition = (record.topic() or "", record.partition() or 0)
            offset = record.offset() or 0
            known = expected.get(partition)
            if known is not None and known != offset:
                return self._admit_slowly(records, i)
            expected[partition] = offset + 1
        return records, {}

    def _admit_slowly(
        self, records: Sequence[R], first: int
    ) -> tuple[list[R], dict[Partition, int]]:
        """`admit` from `records[first]` on, the first record that does not follow on."""
        kept: list[R] = list(records[:first])
        seek: dict[Partition, int] = {}
        for record in records[first:]:
            partition = (record.topic() or "", record.partition() or 0)
            if partition in seek:
                continue  # after a jump: read again from the missing offset
            offset = record.offset() or 0
            expected = self._expected.get(partition)
            if expected is not None and offset > expected:
                missing, reads = self._rereading.get(partition, (expected, 0))
                reads = reads + 1 if missing == expected else 1
                if reads < HOLE_READS:
                    self._rereading[partition] = (expected, reads)
                    seek[partition] = expected
                    continue
                del self._rereading[partition]
                self.holes += 1
                log.debug(
                    "%s[%d]: no record at offsets %d to %d (read %d times); going on",
                    *partition,
                    expected,
                    offset - 1,
                    reads,
                )
            elif expected is not None and offset == expected and partition in self._rereading:
                del self._rereading[partition]
                self.skipped += 1
                log.warning(
                    "%s[%d]: the broker skipped offset %d and gave it on a later read; "
                    "nothing was committed past it",
                    *partition,
                    expected,
                )
            elif expected is not None and offset < expected:
                continue  # delivered already (or below the committed offset): stored
            self._expected[partition] = offset + 1
            kept.append(record)
        return kept, seek
