"""Kafka topic-name rules, checked before anything is written; `Topic`, a topic declared once."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload
from uuid import UUID

from outbox.core.codecs import check_payload_type, prepare, type_name
from outbox.core.errors import ConfigurationError, InvalidKey, InvalidTopic, SerializationError

MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic(topic: object) -> str:
    """Return `topic` if Kafka would accept it as a topic name, else raise `InvalidTopic`."""
    if not isinstance(topic, str):
        raise InvalidTopic(f"topic must be a str, got {type(topic).__name__}")
    if not topic:
        raise InvalidTopic("topic must not be empty")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopic(
            f"topic is {len(topic)} characters long; Kafka allows at most {MAX_TOPIC_LENGTH}"
        )
    if topic in (".", ".."):
        raise InvalidTopic(f"topic {topic!r} is reserved by Kafka")
    if not _LEGAL.fullmatch(topic):
        bad = sorted({c for c in topic if not _LEGAL.fullmatch(c)})
        raise InvalidTopic(
            f"topic {topic!r} contains {', '.join(map(repr, bad))}; "
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
    """

    __slots__ = ("content_type", "description", "key", "name", "payload")

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
        self.name: str = validate_topic(name)
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
