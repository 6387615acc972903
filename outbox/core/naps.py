"""When a woken reader says it is awake again: shared by the relays and the log subscriber.

A reader that has nothing to do announces a nap (a flag in the database), so that writers
NOTIFY it only then: NOTIFY takes a cluster-wide lock at commit, which costs only under sustained
load. A woken reader keeps the flag until it has found work at every look for `AWAKE_AFTER`
seconds. Clearing it on every wake-up and setting it again at the next empty look cost two
writes and a look per wake-up, most of the work of a reader at a low rate, to spare writers a
NOTIFY that costs them nothing there.
"""

from __future__ import annotations

#: Seconds of finding work at every look after which a woken reader clears its nap flag.
AWAKE_AFTER = 0.05
