"""Consumer-group lag as the operator tools show it, whichever transport it was read from.

The Kafka reader (`outbox.kafka.lag`) and the PostgreSQL log (`outbox.pglog.PgLog.lag`) both
return these: per group, each partition it has a committed offset in, with the partition's
end. Offsets are Kafka's: the committed offset is the next one the group reads, the end the
next one a producer writes, so the difference is the records the group has yet to read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class WentBack:
    """The last time the log was found behind a group's position in a partition (restored
    from a backup, its newest records deleted by hand; docs/decisions/0019): when, the group's
    position then, the partition's end, and the offset the group read it again from."""

    at: datetime
    position: int
    end: int
    read_from: int


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group: committed offset, end of the partition, and the difference;
    on the PostgreSQL log, also how often the log went back under the group there (the
    group's position was past its end, or past a record it had not read) and the last time."""

    topic: str
    partition: int
    committed: int
    end: int
    went_back: int = 0
    last_went_back: WentBack | None = None

    @property
    def lag(self) -> int:
        """Records after the committed offset (never negative)."""
        return max(0, self.end - self.committed)

    @property
    def past_end(self) -> bool:
        """The committed offset is past the partition's end: not "lag 0" but an offset no
        record has (written by hand, or the partition was recreated); the group would skip
        the records written up to it. The log's consumers reset it to the end when they take
        the partition."""
        return self.committed > self.end


@dataclass(frozen=True)
class GroupLag:
    """The lag of one consumer group; `error` says why it could not be read (then no rows)."""

    group: str
    partitions: tuple[PartitionLag, ...] = ()
    error: str | None = None

    @property
    def total(self) -> int:
        """Lag summed over every partition."""
        return sum(p.lag for p in self.partitions)

    @property
    def past_end(self) -> tuple[PartitionLag, ...]:
        """The partitions whose committed offset is past their end (`PartitionLag.past_end`)."""
        return tuple(p for p in self.partitions if p.past_end)

    def topics(self) -> dict[str, int]:
        """Lag summed per topic, topics in name order."""
        totals: dict[str, int] = {}
        for p in self.partitions:
            totals[p.topic] = totals.get(p.topic, 0) + p.lag
        return dict(sorted(totals.items()))


def went_back_json(w: WentBack | None) -> dict[str, Any] | None:
    """`PartitionLag.last_went_back` as JSON (None stays None)."""
    if w is None:
        return None
    return {
        "at": w.at.isoformat(),
        "position": w.position,
        "end": w.end,
        "read_from": w.read_from,
    }


def lag_json(groups: Sequence[GroupLag]) -> list[dict[str, Any]]:
    """The lag as JSON-ready dicts: group, total, per-topic totals, partitions (each saying
    whether its committed offset is past its end, and how often the log went back under the
    group there), error."""
    return [
        {
            "group": g.group,
            "total": g.total,
            "topics": g.topics(),
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "committed": p.committed,
                    "end": p.end,
                    "lag": p.lag,
                    "past_end": p.past_end,
                    "went_back": p.went_back,
                    "last_went_back": went_back_json(p.last_went_back),
                }
                for p in g.partitions
            ],
            "error": g.error,
        }
        for g in groups
    ]
