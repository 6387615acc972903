"""When a message is due: `deliver_at` (an absolute, aware time) or `delay` (from the database's
clock at send), checked before anything is written (docs/delayed-delivery.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from outbox.core.errors import InvalidDueTime

#: The longest delay accepted: PostgreSQL's timestamps end in the year 294276, and a delay
#: past that would abort the caller's transaction instead of raising here.
MAX_DELAY = timedelta(days=3_650_000)


@dataclass(frozen=True, slots=True)
class Due:
    """A message's due time: `at` (the instant given, in UTC), or `delay` after the database's
    `now()` at send. Exactly one is set."""

    at: datetime | None = None
    delay: timedelta | None = None


def due(deliver_at: object, delay: object) -> Due | None:
    """The due time of `send(..., deliver_at=, delay=)`, None for "now"; `InvalidDueTime` for
    both given, a naive or non-datetime `deliver_at`, a negative, too long or non-timedelta
    `delay`. A zero delay means now; a `deliver_at` in the past means now too (it is due)."""
    if deliver_at is not None and delay is not None:
        raise InvalidDueTime(
            "give deliver_at (a time) or delay (a timedelta), not both; nothing was written"
        )
    if deliver_at is not None:
        if not isinstance(deliver_at, datetime):
            raise InvalidDueTime(
                f"deliver_at is a {type(deliver_at).__name__}, expected a datetime with a time "
                "zone; nothing was written"
            )
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise InvalidDueTime(
                f"deliver_at {deliver_at.isoformat()} is naive: give it a time zone "
                "(datetime.now(UTC) + ..., or .replace(tzinfo=...)): a naive time means "
                "another moment on each machine; nothing was written"
            )
        try:
            # The instant, in UTC: PostgreSQL refuses an offset beyond 15:59 that Python's
            # time zones allow (up to 23:59), which aborted the caller's transaction.
            at = deliver_at.astimezone(UTC)
        except OverflowError:
            raise InvalidDueTime(
                f"deliver_at {deliver_at.isoformat()} is out of range in UTC; nothing was written"
            ) from None
        return Due(at=at)
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise InvalidDueTime(
                f"delay is a {type(delay).__name__}, expected a datetime.timedelta; nothing "
                "was written"
            )
        if delay < timedelta(0):
            raise InvalidDueTime(
                f"delay {delay} is negative: give a delay of zero or more, or deliver_at for a "
                "time (which may be past: then it is due now); nothing was written"
            )
        if delay > MAX_DELAY:
            raise InvalidDueTime(
                f"delay {delay} is longer than {MAX_DELAY.days} days; nothing was written"
            )
        if delay == timedelta(0):
            return None
        return Due(delay=delay)
    return None
