"""Kafka topic-name rules, checked before anything is written; `Topic`, a topic declared once."""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload
from uuid import UUID

from outbox.core.codecs import check_payload_type, prepare, type_name
from outbox.core.errors import ConfigurationError, InvalidKey, InvalidTopic, SerializationError

MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic(topic: object, what: str = "topic") -> str:
    """Return `topic` if Kafka would accept it as a topic name, else raise `InvalidTopic`;
    `what` names it in the error (a subscription's name follows the same rules)."""
    if not isinstance(topic, str):
        raise InvalidTopic(f"{what} must be a str, got {type(topic).__name__}")
    if not topic:
        raise InvalidTopic(f"{what} must not be empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopic(
            f"{what} is {len(topic)} characters long; Kafka allows at most {MAX_TOPIC_LENGTH}"
        )
    if topic in (".", ".."):
        raise InvalidTopic(f"{what} {topic!r} is reserved by Kafka")
    if not _LEGAL.fullmatch(topic):
        bad = sorted({c for c in topic if not _LEGAL.fullmatch(c)})
        raise InvalidTopic(
            f"{what} {topic!r} contains {', '.join(map(repr, bad))}; "
            "only ASCII letters, digits, '.', '_' and '-' are allowed"
        )
    return topic


P = TypeVar("P")


class Topic(Generic[P]):
    """A topic declared once: its name, payload type, key and content type.

    Sender and receiver import the same declaration: `broker.send(conn, topic, payload)` checks
    that the payload is a `payload` instance and takes the message key from `key` (unless the
    call gives one); `@handlers.handler(topic)` gives the callback `message.payload` as a
    `payload` instance, validated on the way in. `payload` is a pydantic v2 model, a dataclass,
    or None for any JSON value; `key` names an attribute of the payload, or is a function of it
    returning str, bytes or None.

    `renamed(name)` is a copy declared under another name. A test that must run this very
    object (imported by the code under test) under a name of its own uses
    `outbox.testing.topic_renamed`, which makes it answer to that name in this process until
    the block ends: sends, and the `Handlers` registries that registered it, follow.
    """

    __slots__ = ("_name", "content_type", "description", "key", "payload")

    @overload
    def __init__(
        self: Topic[Any],
        name: str,
        payload: None = None,
        *,
        key: str | Callable[[Any], str | bytes | None] | None = None,
        content_type: str = "application/json",
        description: str = "",
    ) -> None: ...

    @overload
    def __init__(
        self,
        name: str,
        payload: type[P],
        *,
        key: str | Callable[[P], str | bytes | None] | None = None,
        content_type: str = "application/json",
        description: str = "",
    ) -> None: ...

    def __init__(
        self,
        name: str,
        payload: type[P] | None = None,
        *,
        key: str | Callable[[P], str | bytes | None] | None = None,
        content_type: str = "application/json",
        description: str = "",
    ) -> None:
        self._name: str = validate_topic(name)
        self.payload: type[P] | None = check_payload_type(payload, f"Topic({name!r})")
        try:  # a key type with no JSON form, say, refused now rather than at the first send
            prepare(self.payload, _caller_locals())
        except ConfigurationError as exc:
            raise ConfigurationError(f"Topic({name!r}): {exc}") from None
        if isinstance(key, str):
            if not key.isidentifier():
                raise ConfigurationError(
                    f"Topic({name!r}): key {key!r} must be the name of a payload attribute "
                    "or a function of the payload"
                )
            if self.payload is not None and not _has_attribute(self.payload, key):
                raise ConfigurationError(
                    f"Topic({name!r}): key {key!r} is not a field of {type_name(self.payload)}"
                )
        elif key is not None and not callable(key):
            raise ConfigurationError(
                f"Topic({name!r}): key must be an attribute name, a function or None, "
                f"got {type(key).__name__}"
            )
        self.key: str | Callable[[P], str | bytes | None] | None = key
        if not isinstance(content_type, str) or not content_type:
            raise ConfigurationError(f"Topic({name!r}): content_type must be a non-empty str")
        self.content_type: str = content_type
        self.description: str = description

    @property
    def name(self) -> str:
        """The topic's name: as declared, or the one a test runs it under for now
        (`outbox.testing.topic_renamed`)."""
        if _overrides:
            return _overrides.get(self, self._name)
        return self._name

    @property
    def declared_name(self) -> str:
        """The name the Topic was declared with, whatever name a test runs it under."""
        return self._name

    def renamed(self, name: str) -> Topic[P]:
        """A copy of this declaration under another topic name (payload type, key, content
        type and description the same); `InvalidTopic` if Kafka would refuse the name. The
        copy is a Topic of its own: this one, and whoever holds it, are unchanged."""
        try:
            valid = validate_topic(name)
        except InvalidTopic as exc:
            raise InvalidTopic(f"cannot rename topic {self.name!r}: {exc}") from None
        copy: Topic[P] = object.__new__(Topic)
        copy._name = valid
        copy.payload = self.payload
        copy.key = self.key
        copy.content_type = self.content_type
        copy.description = self.description
        return copy

    def key_of(self, payload: P) -> bytes | None:
        """The message key the declaration derives from `payload` (UTF-8 for str; int and UUID
        by their text), or None when it declares none."""
        if self.key is None:
            return None
        if isinstance(self.key, str):
            try:
                value: object = getattr(payload, self.key)
            except AttributeError:
                raise InvalidKey(
                    f"topic {self.name!r}: the payload ({type(payload).__name__}) has no "
                    f"attribute {self.key!r} to take the key from"
                ) from None
        else:
            try:
                value = self.key(payload)
            except Exception as exc:  # the declaration's own function: say whose it is
                name = getattr(self.key, "__qualname__", repr(self.key))
                raise InvalidKey(
                    f"topic {self.name!r}: its key function {name} raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, str):
            try:
                return value.encode()
            except UnicodeEncodeError:
                raise InvalidKey(
                    f"topic {self.name!r}: key {value!r} is not valid Unicode"
                ) from None
        if isinstance(value, int | UUID) and not isinstance(value, bool):
            return str(value).encode()
        raise InvalidKey(
            f"topic {self.name!r}: the key derived from the payload is a "
            f"{type(value).__name__}; expected str, bytes, int, UUID or None"
        )

    def check(self, payload: object) -> None:
        """Refuse a payload that is not of the declared type (`SerializationError`); a
        subclass too, which the handler would read back as the declared type: another value."""
        expected = self.payload
        if expected is None or type(payload) is expected:
            return
        if not isinstance(payload, expected):
            raise SerializationError(
                f"topic {self.name!r} carries {type_name(expected)}; got a "
                f"{type(payload).__qualname__}: build a {type_name(expected)}"
            )
        metadata = getattr(type(payload), "__pydantic_generic_metadata__", None)
        if metadata and metadata.get("origin") is expected:  # Model[int] for Model: its own
            return
        raise SerializationError(
            f"topic {self.name!r} carries {type_name(expected)}; got a "
            f"{type(payload).__qualname__}, a subclass, which the handler would read back as a "
            f"{type_name(expected)} (not equal to what was sent, its own fields dropped): build "
            f"a {type_name(expected)}"
        )

    def __repr__(self) -> str:
        payload = type_name(self.payload) if self.payload is not None else "any JSON"
        return f"Topic({self.name!r}, {payload})"


#: The names Topics answer to instead of their declared ones, for a test
#: (`outbox.testing.topic_renamed`): one table for the whole process, so that the daemons' threads
#: see it too. Empty outside such tests (`Topic.name` then costs one truth test).
_overrides: dict[Topic[Any], str] = {}
#: Counts the changes of `_overrides`: a registry keyed by topic names builds its keys again
#: when it differs (`names_version`).
_version = 0
_overrides_lock = threading.Lock()


def override_name(topic: Topic[Any], name: str | None) -> str | None:
    """Make `topic` answer to `name` in this whole process (None: to its declared name again)
    and return the name it answered to before when that was not its declared one, else None.

    For `outbox.testing.topic_renamed`, which restores what this returns; `InvalidTopic` if
    Kafka would refuse `name`.
    """
    global _version
    if not isinstance(topic, Topic):
        raise ConfigurationError(f"a Topic is renamed, not a {type(topic).__name__}")
    if name is not None:
        try:
            validate_topic(name)
        except InvalidTopic as exc:
            raise InvalidTopic(
                f"cannot run topic {topic.declared_name!r} under another name: {exc}"
            ) from None
    with _overrides_lock:
        before = _overrides.get(topic)
        if name is None or name == topic.declared_name:
            _overrides.pop(topic, None)
        else:
            _overrides[topic] = name
        _version += 1
    return before


def names_version() -> int:
    """A number that changes whenever a Topic starts or stops answering to another name."""
    return _version


def _caller_locals() -> dict[str, Any]:
    """The local names where the Topic is declared (names its payload's annotations may use)."""
    try:
        return dict(sys._getframe(2).f_locals)
    except (AttributeError, ValueError):  # an interpreter without frames, or a short stack
        return {}


def _has_attribute(payload_type: type[Any], name: str) -> bool:
    """True if instances of `payload_type` have the attribute `name` (a field or property)."""
    if dataclasses.is_dataclass(payload_type) and name in {
        f.name for f in dataclasses.fields(payload_type)
    }:
        return True
    fields = getattr(payload_type, "model_fields", None)
    if isinstance(fields, dict) and name in fields:
        return True
    return hasattr(payload_type, name)
