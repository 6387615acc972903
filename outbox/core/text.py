"""Text that PostgreSQL will store: no NUL, no lone surrogates.

PostgreSQL's `text` and `jsonb` refuse U+0000, and a Python str with a lone surrogate cannot
be encoded to UTF-8 at all. Whatever outbox writes from outside its control (an exception's
text, a broker's error, a foreign record's header) goes through `storable` first, so that one
odd character can never make a statement fail and stop a daemon.
"""

from __future__ import annotations


def storable(text: str) -> str:
    """`text` with NUL written as `\\x00` and lone surrogates as `\\udXXX`; else unchanged."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def is_storable(text: str) -> bool:
    """Whether PostgreSQL stores `text` as it is (no NUL, valid UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (its type's name when empty), storable."""
    try:
        text = str(exc).strip()
    except Exception:  # an exception whose __str__ raises
        text = ""
    return storable(text.splitlines()[0] if text else type(exc).__name__)
