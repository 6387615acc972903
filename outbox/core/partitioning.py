"""Kafka's default partitioner, for transports that place keyed records as Kafka would.

A key lands in partition murmur2(key) % partitions, as with the Java client and outbox's relay
(librdkafka's `murmur2_random`), so a key keeps its partition, and its order, whichever
transport carried it.
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of `data` (`Utils.murmur2` of the Java client), unsigned 32-bit."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & _MASK
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & _MASK
        k ^= k >> r
        k = (k * m) & _MASK
        h = ((h * m) & _MASK) ^ k
    tail = data[whole:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a keyed record among `partitions`, as Kafka's default partitioner."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
