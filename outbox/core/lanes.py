"""Lanes: how messages are spread over relays while each key keeps its order.

Every message gets a lane from a hash of its key at send time. A lane is owned by one relay
process at a time, which sends its rows in id order, so all messages of one key go out in order.
Messages without a key have no order and are spread by their id.
"""

from __future__ import annotations

import zlib
from uuid import UUID

#: The number of lanes. Part of the stored format: changing it re-maps keys to lanes.
LANES = 64


def lane_for(key: bytes | None, message_id: UUID) -> int:
    """The lane of a message: a stable hash of its key, or of its id when it has no key."""
    if key is None:
        return message_id.int % LANES
    return zlib.crc32(key) % LANES
