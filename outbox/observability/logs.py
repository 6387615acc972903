"""Log output of the `outbox` command: text or JSON lines, secrets always masked.

JSON lines carry `timestamp` (UTC, ISO 8601), `level`, `logger`, `message`, every `extra=`
field of the call (the daemons put per-topic counts, `message_id`, `topic` there) and, for an
exception, `exception` (the traceback in one string). Both formats pass everything through
`redact_text`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from outbox.core.redact import redact_text

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _redacted(value: Any) -> Any:
    """A JSON-ready copy of `value` with every string redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {str(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact_text(str(value))


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call added with `extra=`."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, message, extra fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(_redacted(entry), ensure_ascii=False)


#: Control characters a text log line must not carry as they are: they move a terminal's
#: cursor, set its title, recolour it, or end the line early (a "\r" or "\n" inside an
#: exception's text could forge a line of its own).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with control characters written as escapes (`\x1b`, `\r`); line breaks too
    unless `keep_newlines` (a traceback's own lines)."""
    escaped = _CONTROL.sub(_escape, text)
    return escaped if keep_newlines else escaped.replace("\n", "\\n")


class RedactingFormatter(logging.Formatter):
    """The classic text format, with secrets masked and control characters escaped: a message
    is one line whatever text it carries (an exception's, a record's); a traceback keeps its
    line breaks."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        safe = escape_controls(message)
        if safe != message:
            record = logging.makeLogRecord({**record.__dict__, "msg": safe, "args": None})
        return escape_controls(redact_text(super().format(record)), keep_newlines=True)


def configure_logging(level: str, log_format: LogFormat, stream: TextIO | None = None) -> None:
    """Send every log line to `stream` (stderr) at `level`, as text or JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else RedactingFormatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def topic_summary(counts: dict[str, int], limit: int = 8, what: str = "topics") -> str:
    """`a=3, b=1` for a log line, the largest first, at most `limit` of `what` named."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{topic}={n}" for topic, n in ranked[:limit])
    if len(ranked) > limit:
        text += f", and {len(ranked) - limit} more {what}"
    return text


#: Seconds between two lines of one `LimitedLog`.
LIMITED_INTERVAL = 5.0


class LimitedLog:
    """A recurring log line that cannot flood: at most one line per `interval` seconds.

    The first call logs at once; calls within `interval` of the last line are counted, and the
    next line that is let through says "(repeated N times in the last T s)". `flush()` logs
    the count of calls not yet reported. Thread-safe: the threads of one loop may share one.
    """

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        interval: float = LIMITED_INTERVAL,
    ) -> None:
        self.logger = logger
        self.level = level
        self.interval = interval
        self._lock = threading.Lock()
        self._last: float | None = None
        self._held = 0
        self._held_message: tuple[str, tuple[Any, ...]] | None = None

    def __call__(self, message: str, *args: Any, **kwargs: Any) -> bool:
        """Log `message % args` now, unless a line went out less than `interval` ago (then
        count it); True when logged."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last < self.interval:
                self._held += 1
                self._held_message = (message, args)
                return False
            held, since = self._held, self._last
            self._last, self._held, self._held_message = now, 0, None
        if held and since is not None:
            message += " (repeated %d times in the last %.0fs)"
            args = (*args, held, now - since)
        self.logger.log(self.level, message, *args, **kwargs)
        return True

    def flush(self) -> None:
        """Log the calls counted since the last line, if any, as one summary line."""
        with self._lock:
            held, held_message, since = self._held, self._held_message, self._last
            self._held, self._held_message = 0, None
        if held and held_message is not None and since is not None:
            message, args = held_message
            self.logger.log(
                self.level,
                message + " (repeated %d times in the last %.0fs)",
                *args,
                held,
                time.monotonic() - since,
            )


#: What a summary line says of each daemon's batches: its verb and what it counts.
SUMMARY_WORDS = {
    "producer": ("relayed", "messages"),
    "consumer": ("stored", "records"),
    "handler": ("handled", "messages"),
}


class BatchSummary:
    """A daemon's batches summed into one INFO line per `interval` seconds (the first batch of
    a quiet spell starts the interval; what is left is said at `flush`), instead of a line per
    batch and, with several databases, per database: a daemon's log stays a few lines a
    minute whatever its rate and its number of databases.

    Each `add` brings a batch's size, its main count per topic (relayed, stored, handled), its
    other counts per topic (failed, dead, quarantined...) and the database it was of."""

    def __init__(self, logger: logging.Logger, kind: str, interval: float) -> None:
        self._logger = logger
        self.kind = kind
        self.interval = interval
        self._lock = threading.Lock()
        self._reset()
        self._timer: threading.Timer | None = None

    def _reset(self) -> None:
        self._batches = 0
        self._size = 0
        self._main: dict[str, int] = {}
        self._others: dict[str, dict[str, int]] = {}
        self._databases: dict[str, int] = {}
        self._since = time.monotonic()

    def add(
        self,
        size: int,
        main: dict[str, int],
        others: dict[str, dict[str, int]] | None = None,
        database: str | None = None,
    ) -> None:
        with self._lock:
            if self._batches == 0:
                self._since = time.monotonic()
                if self._timer is None:
                    self._timer = threading.Timer(self.interval, self.flush)
                    self._timer.daemon = True
                    self._timer.name = f"outbox-{self.kind}-summary"
                    self._timer.start()
            self._batches += 1
            self._size += size
            for topic, n in main.items():
                self._main[topic] = self._main.get(topic, 0) + n
            for name, counts in (others or {}).items():
                into = self._others.setdefault(name, {})
                for topic, n in counts.items():
                    if n:
                        into[topic] = into.get(topic, 0) + n
            if database is not None:
                self._databases[database] = self._databases.get(database, 0) + sum(main.values())

    def flush(self) -> None:
        """Say what was summed since the last line, if anything (at stop, and by the timer)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._batches == 0:
                return
            batches, size, main = self._batches, self._size, self._main
            others = {name: counts for name, counts in self._others.items() if counts}
            databases, seconds = self._databases, time.monotonic() - self._since
            self._reset()
        verb, noun = SUMMARY_WORDS.get(self.kind, ("processed", "messages"))
        text = f"{verb} {sum(main.values())} of {size} {noun} in {batches} batches over "
        text += f"{seconds:.1f}s ({topic_summary(main) or 'none'})"
        for name, counts in others.items():
            shown = str(counts[""]) if set(counts) == {""} else topic_summary(counts)
            text += f"; {name.replace('_', ' ')} {shown}"
        if databases:
            shown = topic_summary(databases, limit=5, what="databases")
            text += f"; {len(databases)} databases ({shown})"
        self._logger.info(
            text,
            extra={
                "event": f"{self.kind}.summary",
                "batches": batches,
                "batch_size": size,
                verb: main,
                **others,
                **({"databases": databases} if databases else {}),
                "seconds": round(seconds, 3),
            },
        )
