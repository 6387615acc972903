"""Kafka topic-name rules, checked before anything is written."""

from __future__ import annotations

import re

from outbox.core.errors import InvalidTopic

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
