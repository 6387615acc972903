"""Message ids: UUID version 7 (RFC 9562), time-ordered so that index inserts stay local."""

from __future__ import annotations

import os
import socket
import time
import uuid
from uuid import UUID


def uuid7() -> UUID:
    """A new UUIDv7: 48 bits of Unix milliseconds, then 74 random bits (version and variant set).

    Random (v4) ids land all over the unique index on message_id, so every insert touches a
    different index page; time-ordered ids append at its right edge like a sequence.
    """
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & 0xFFFF_FFFF_FFFF) << 80 | rand & ((1 << 80) - 1)
    value &= ~(0xF << 76)
    value |= 0x7 << 76  # version 7
    value &= ~(0x3 << 62)
    value |= 0x2 << 62  # RFC 9562 variant
    return UUID(int=value)


def process_id() -> str:
    """host:pid:random, unique per daemon process and start (a relay id, a log member id)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
