"""Run a fixed-name `Topic` under a name of the test's own: `topic_renamed`.

A service declares `ORDERS = Topic("orders.created", Order)` once, at module level, and its
code sends with it and registers its handler with it. A test that must not share the topic with
another test (a real broker, a log kept between tests) runs that same object under another name
for a block: every `broker.send(..., ORDERS, ...)`, and every `Handlers` registry that
registered ORDERS, use the new name until the block ends, in every thread of the process (the
daemons `drain` runs included). The Topic's declared name comes back at the end, whatever the
block raised, so the next test sees the declaration as written.

`Topic.renamed(name)` is the other way: a copy, for code that takes its Topic as an argument.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from outbox.core.topics import MAX_TOPIC_LENGTH, Topic, override_name, validate_topic

#: "-" and 8 hex digits: what `per_test_name` appends.
_SUFFIX_LENGTH = 9


def per_test_name(topic: Topic[Any] | str) -> str:
    """`<topic's name>-<8 hex digits>`, a new name each call, cut to fit Kafka's 249
    characters."""
    base = topic.declared_name if isinstance(topic, Topic) else validate_topic(topic)
    return f"{base[: MAX_TOPIC_LENGTH - _SUFFIX_LENGTH]}-{secrets.token_hex(4)}"


@contextmanager
def topic_renamed(topic: Topic[Any], name: str | None = None) -> Iterator[str]:
    """Run `topic` under `name` (default: `per_test_name(topic)`) for the block; yields the name.

    Inside the block `topic.name` is `name`: sends with the Topic go to that topic, and the
    registries that registered it handle that topic (build the daemons, or call `drain`,
    inside the block). The declared name, or the name an enclosing block gave, comes back at the
    end. `InvalidTopic` if Kafka would refuse `name` (nothing is renamed then).
    """
    if not isinstance(topic, Topic):
        raise TypeError(
            f"topic_renamed takes an outbox.Topic, got {type(topic).__name__}: a topic given by "
            "its name alone needs no renaming, pass the per-test name instead"
        )
    chosen = per_test_name(topic) if name is None else name
    before = override_name(topic, chosen)  # InvalidTopic before anything changes
    try:
        yield chosen
    finally:
        override_name(topic, before)


__all__ = ["per_test_name", "topic_renamed"]
