"""Consumer-group lag: each group's committed offsets against the end of their partitions.

Used by `outbox status --kafka-bootstrap ...` and `outbox console`. The committed offsets come
from the group coordinator (AdminClient `list_consumer_group_offsets`, one group per request as
librdkafka requires), the ends of the partitions from `get_watermark_offsets` of a consumer that
never joins a group (it only asks the partition leaders). Nothing here commits or changes a
group.

Lag of a partition (`outbox.core.lag.PartitionLag`) = end (high watermark) - committed offset.
A partition the group has no commit for (a committed offset < 0) is not reported: the group
has never read it, and its start position decides what it will read.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.core.lag import GroupLag, PartitionLag, lag_json
from outbox.core.text import first_line
from outbox.kafka.publisher import client

# GroupLag, PartitionLag and lag_json live in outbox.core.lag (the PostgreSQL log returns them
# too); they stay importable from here.
__all__ = ["DEFAULT_TIMEOUT", "GroupLag", "LagReader", "PartitionLag", "lag_json", "read_lag"]

#: The group name under which `LagReader.lag` reports that the cluster's groups could not be
#: listed.
EVERY_GROUP = "(every group)"

log = logging.getLogger("outbox.lag")

#: Seconds a lag read waits for the cluster, per request.
DEFAULT_TIMEOUT = 10.0


class LagReader:
    """Reads consumer-group lag from one Kafka cluster; `close` when done."""

    def __init__(
        self,
        bootstrap: str,
        extra: Mapping[str, str] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        # Quiet: an unreachable cluster is reported once, in the result, not as a librdkafka
        # line per connection attempt.
        base: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0, **dict(extra or {})}
        self._timeout = timeout
        self._admin = client(AdminClient, base)
        # A consumer that never subscribes never joins its group; the id is only required.
        self._watermarks = client(
            Consumer,
            {
                **base,
                "group.id": f"outbox-lag-reader-{uuid.uuid4()}",
                "enable.auto.commit": False,
            },
        )

    def list_groups(self) -> list[str]:
        """The ids of the cluster's consumer groups, in name order; `KafkaException` when the
        cluster could not be asked (none listed, and an error for every broker)."""
        result = self._admin.list_consumer_groups(request_timeout=self._timeout).result()
        errors = list(getattr(result, "errors", None) or ())
        for error in errors:
            log.warning("listing consumer groups: %s", error)
        if errors and not result.valid:
            raise KafkaException(errors[0])
        return sorted(g.group_id for g in result.valid)

    def group_lag(self, group: str) -> GroupLag:
        """The lag of `group` on every partition it has committed offsets for."""
        try:
            request = [ConsumerGroupTopicPartitions(group)]
            futures = self._admin.list_consumer_group_offsets(
                request, request_timeout=self._timeout
            )
            answer = futures[group].result()
            committed = [
                tp
                for tp in (answer.topic_partitions or [])
                if tp.error is None and tp.offset is not None and tp.offset >= 0
            ]
            partitions = []
            for tp in sorted(committed, key=lambda t: (t.topic, t.partition)):
                _low, high = self._watermarks.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=self._timeout, cached=False
                )
                partitions.append(PartitionLag(tp.topic, tp.partition, tp.offset, int(high)))
        except (KafkaException, RuntimeError, ValueError) as exc:
            return GroupLag(group, error=first_line(exc))
        return GroupLag(group, tuple(partitions))

    def lag(self, groups: Iterable[str] | None = None) -> list[GroupLag]:
        """The lag of each of `groups` (every group of the cluster when None)."""
        if groups is None:
            try:
                names = self.list_groups()
            except (KafkaException, RuntimeError, ValueError) as exc:
                # Not "no group": every group's lag is unknown, which fails `status --check`.
                return [GroupLag(EVERY_GROUP, error=f"cannot list the groups: {first_line(exc)}")]
        else:
            names = list(dict.fromkeys(groups))
        return [self.group_lag(g) for g in names]

    def close(self) -> None:
        """Close the watermark consumer (the admin client has nothing to close)."""
        self._watermarks.close()


def read_lag(
    bootstrap: str,
    groups: Sequence[str] | None = None,
    extra: Mapping[str, str] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[GroupLag]:
    """The lag of `groups` (every group when None or empty) in one short-lived reader."""
    reader = LagReader(bootstrap, extra, timeout=timeout)
    try:
        return reader.lag(groups or None)
    finally:
        reader.close()
