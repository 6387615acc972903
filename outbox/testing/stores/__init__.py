"""In-memory queue stores behind outbox's ports: `producer_queue` and `consumer_queue` without
PostgreSQL, for fast unit tests of code that runs over the same ports as the daemons.

`MemoryOutbox` is a `producer_queue`: `send` writes a message as `Broker.send` would have
(composed and validated the same way, committed at once), and `stores()` gives the relay stores
a `Producer` reads it through. `MemoryInbox` is a `consumer_queue` with its
`consumer_processed`: `writers()` gives the `InboxWriters` a `Consumer` stores through,
`stores()` the relay stores a `HandlerRunner` reads it through, and a callback receives a
`MemoryTransaction`, whose `write`s commit with its row.

Contract: each store behaves as PostgreSQL's adapters (outbox/postgres/) do, which are the
reference; both pass one contract suite (tests/stores/). Rows are fetched in id order per lane,
a key waits behind its retrying row, a message id is stored once (pending, dead, or handled
within the dedup window), handler transactions see their own writes, hold their rows' locks
until they end and apply at commit or never, a value PostgreSQL would refuse raises
`DataError`, lanes are owned one session at a time, and a write wakes a queue's sessions while
one of its relays sleeps. What one process's memory cannot offer (locks and wake-ups across
processes, an unreachable database, a schema not migrated) are the suite's feature flags.

The sessions, databases and rows the stores hand out are public, documented, and in the
modules that make them: `producer_queue` (MemoryOutbox), `consumer_queue` (MemoryInbox and its
sessions), `relays` (lanes and wake-ups, shared), `values` (what PostgreSQL refuses). Imports
nothing of outbox/postgres/, no driver and no daemon.
"""

from outbox.testing.stores.consumer_queue import MemoryInbox, MemoryTransaction
from outbox.testing.stores.producer_queue import MemoryOutbox
from outbox.testing.stores.values import DataError, LockTimeout, MemoryLost

__all__ = [
    "DataError",
    "LockTimeout",
    "MemoryInbox",
    "MemoryLost",
    "MemoryOutbox",
    "MemoryTransaction",
]
