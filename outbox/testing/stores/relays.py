"""What both in-memory queues share: lanes owned one session at a time (with a lock count per
session, as PostgreSQL's advisory locks count), the relays' registry with their sleeping flags,
and the wake-ups a write sends while one of them sleeps."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self

from outbox.testing.stores.values import MemoryLost


class Wake:
    """A session's wake-ups, counted: none set between a wait and its reset is lost."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.count = 0

    def set(self) -> None:
        with self.condition:
            self.count += 1
            self.condition.notify_all()

    def take(self, timeout: float) -> bool:
        with self.condition:
            if not self.count:
                self.condition.wait_for(lambda: self.count > 0, max(0.0, timeout))
            woken, self.count = self.count > 0, 0
            return woken


class Relays:
    """One queue's relays, lanes and listeners, shared by its sessions.

    The registry by relay id, with each relay's sleeping flag; the lanes' owners, with a lock
    count per session as advisory locks count; the sessions listening for wake-ups.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered: dict[str, tuple[MemoryRelaySession, bool]] = {}
        self.owners: dict[int, tuple[MemoryRelaySession, int]] = {}
        self.listening: set[MemoryRelaySession] = set()

    def wake_if_sleeping(self) -> None:
        """What a write does: notify every listening session while some relay sleeps."""
        with self.lock:
            if not any(sleeping for _, sleeping in self.registered.values()):
                return
            listening = list(self.listening)
        for session in listening:
            session.wake.set()

    def drop(self, session: MemoryRelaySession) -> None:
        """Forget a closed or lost session: its lanes, its registration, its LISTEN."""
        with self.lock:
            self.listening.discard(session)
            for lane in [lane for lane, (s, _) in self.owners.items() if s is session]:
                del self.owners[lane]
            for relay_id in [r for r, (s, _) in self.registered.items() if s is session]:
                del self.registered[relay_id]


class MemoryRelaySession:
    """One relay's session on an in-memory queue (the `outbox.ports.RelaySession` part)."""

    def __init__(self, relays: Relays, relay_id: str) -> None:
        self.relays = relays
        self.relay_id = relay_id
        self.wake = Wake()
        self._closed = False
        self._lost = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _live(self) -> None:
        if self._lost:
            self._closed = True
            raise MemoryLost("the session was lost")
        if self._closed:
            raise MemoryLost("the session is closed")

    def lose(self) -> None:
        """Lose the session as a killed connection is lost: its lanes and registration go at
        once, and its next statement raises `MemoryLost` (then `closed` is True)."""
        self._lost = True
        self.relays.drop(self)

    def check_lock_class(self) -> None:
        """Nothing can share an in-memory queue's lanes."""
        self._live()

    def join(self) -> None:
        self._live()
        with self.relays.lock:
            self.relays.registered[self.relay_id] = (self, False)
            self.relays.listening.add(self)

    def leave(self, parked: bool = False) -> None:
        self._live()
        with self.relays.lock:
            self.relays.registered.pop(self.relay_id, None)

    def parked_seen(self) -> None:
        """Nothing lists relays in memory but the live ones."""
        self._live()

    def set_sleeping(self, sleeping: bool) -> None:
        self._live()
        with self.relays.lock:
            entry = self.relays.registered.get(self.relay_id)
            if entry is not None:
                self.relays.registered[self.relay_id] = (entry[0], sleeping)

    def live_relays(self) -> int:
        self._live()
        with self.relays.lock:
            return max(1, len(self.relays.registered))

    def held(self) -> set[int]:
        self._live()
        with self.relays.lock:
            return set(self.relays.owners)

    def lock(self, lane: int) -> bool:
        self._live()
        with self.relays.lock:
            owner, count = self.relays.owners.get(lane, (self, 0))
            if owner is not self:
                return False
            self.relays.owners[lane] = (self, count + 1)
            return True

    def lock_each(self, lanes: list[int]) -> list[int]:
        return [lane for lane in lanes if self.lock(lane)]

    def unlock(self, lane: int) -> None:
        self._live()
        with self.relays.lock:
            owner, count = self.relays.owners.get(lane, (None, 0))
            if owner is not self:
                return
            if count > 1:
                self.relays.owners[lane] = (self, count - 1)
            else:
                del self.relays.owners[lane]

    def notified(self, timeout: float) -> bool:
        self._live()
        return self.wake.take(timeout)

    def close(self) -> None:
        self._closed = True
        self.relays.drop(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
