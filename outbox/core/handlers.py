"""The handler registry: `@handlers.handler("topic")` binds a topic to a callback.

One topic has exactly one handler in a registry; a second registration for the same topic is
refused when the decorator runs (to fan out, call several functions from one handler, or give
each consumer its own inbox schema). Registries from several modules merge with `include`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from outbox.core.errors import ConfigurationError
from outbox.core.retry import Backoff
from outbox.core.serializers import JsonSerializer, Serializer
from outbox.core.topics import validate_topic

Func = TypeVar("Func", bound=Callable[..., Any])
TransactionKind = Literal["psycopg", "sqlalchemy"]
DEFAULT_BACKOFF = Backoff(initial=1.0, maximum=300.0)


class HandlerConflict(ConfigurationError):
    """Two handlers registered for one topic."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One registered handler and its retry policy."""

    topic: str
    func: Callable[..., Any]
    max_attempts: int
    backoff: Backoff
    is_async: bool
    #: Messages of one key are handled in order, a key waiting behind its failing message.
    ordered: bool = True
    #: Registered with `batch_handler`: the callback takes a list of messages.
    batch: bool = False

    @property
    def name(self) -> str:
        return f"{self.func.__module__}.{self.func.__qualname__}"


class Handlers:
    """A registry of message handlers, run by `outbox handler module:attribute`.

    `transaction` chooses what a callback receives as its second argument: a psycopg
    connection ("psycopg", the default; `AsyncConnection` for async callbacks) or a SQLAlchemy
    `Session` ("sqlalchemy"; `AsyncSession` for async callbacks). Either way the callback's
    writes commit together with the marking of the message as processed, or not at all.

    `pipeline=True` (psycopg, sync callbacks only) runs each batch transaction in psycopg's
    pipeline mode: a callback's statements go to the server without waiting for their results,
    so a batch costs about one round trip instead of one per statement. Results a callback
    fetches still arrive when it asks for them. What changes: a failing statement raises later
    (at the next fetch or at the end of the batch), so the runner then rolls the batch back and
    runs it again without the pipeline to find the failing message; `COPY` is not allowed, and
    `cursor.rowcount` is only known after a fetch. Opt in when callbacks only write.
    """

    def __init__(
        self,
        *,
        transaction: TransactionKind = "psycopg",
        serializer: Serializer | None = None,
        pipeline: bool = False,
    ) -> None:
        if transaction not in ("psycopg", "sqlalchemy"):
            raise ConfigurationError(
                f"transaction must be 'psycopg' or 'sqlalchemy', got {transaction!r}"
            )
        if pipeline and transaction != "psycopg":
            raise ConfigurationError(
                "pipeline=True needs transaction='psycopg': SQLAlchemy reads every result as "
                "soon as it executes, which would undo the pipeline"
            )
        self.transaction: TransactionKind = transaction
        self.pipeline = bool(pipeline)
        self.serializer: Serializer = serializer or JsonSerializer()
        self._specs: dict[str, HandlerSpec] = {}

    def handler(
        self,
        topic: str,
        *,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        ordered: bool = True,
    ) -> Callable[[Func], Func]:
        """Register the decorated function (sync or async) as the handler of `topic`.

        With `ordered=False` a message waiting for a retry does not hold back the later
        messages of its key.
        """
        return self._register(
            topic, max_attempts=max_attempts, backoff=backoff, ordered=ordered, batch=False
        )

    def batch_handler(
        self,
        topic: str,
        *,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        ordered: bool = True,
    ) -> Callable[[Func], Func]:
        """Register the decorated sync function as the handler of `topic`, called with a list
        of messages: `func(messages: list[InboxMessage], conn)`.

        The runner passes the consecutive messages of `topic` in one handler transaction (up
        to `--transaction-size`), in id order, and marks them processed in that transaction, so
        the callback can write their effects with one `executemany` or `COPY`. When it raises
        for a list of several messages, nothing of that transaction commits and each message is
        handled again alone, so the failure is recorded against the message that causes it and
        retried like any other. A callback must therefore be all-or-nothing over its list: it
        must not catch a failure of one message and carry on with the others.

        Not in a batch: OpenTelemetry spans and `broker.send`'s causation id, both of which
        belong to one message.
        """
        return self._register(
            topic, max_attempts=max_attempts, backoff=backoff, ordered=ordered, batch=True
        )

    def _register(
        self,
        topic: str,
        *,
        max_attempts: int,
        backoff: Backoff | None,
        ordered: bool,
        batch: bool,
    ) -> Callable[[Func], Func]:
        """What `handler` and `batch_handler` share: check the arguments now, register the
        function when the decorator is applied."""
        validate_topic(topic)
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        decorator = "batch_handler" if batch else "handler"

        def decorate(func: Func) -> Func:
            if not callable(func):
                raise ConfigurationError(f"@{decorator}({topic!r}) must decorate a function")
            is_async = inspect.iscoroutinefunction(func)
            if batch and is_async:
                raise ConfigurationError(
                    f"@{decorator}({topic!r}): {func.__qualname__} is async; batch handlers "
                    "must be sync functions (use @handler for an async callback)"
                )
            self._add(
                HandlerSpec(
                    topic=topic,
                    func=func,
                    max_attempts=max_attempts,
                    backoff=backoff or DEFAULT_BACKOFF,
                    is_async=is_async,
                    ordered=ordered,
                    batch=batch,
                )
            )
            return func

        return decorate

    def _add(self, spec: HandlerSpec) -> None:
        existing = self._specs.get(spec.topic)
        if existing is not None and existing.func is not spec.func:
            raise HandlerConflict(
                f"topic {spec.topic!r} already has the handler {existing.name}; "
                f"cannot also register {spec.name} (one handler per topic)"
            )
        self._specs[spec.topic] = spec

    def include(self, other: Handlers) -> Handlers:
        """Merge another registry's handlers into this one; returns self."""
        if other.transaction != self.transaction:
            raise ConfigurationError(
                f"cannot include a registry using {other.transaction!r} transactions into one "
                f"using {self.transaction!r}"
            )
        if other.pipeline != self.pipeline:
            raise ConfigurationError(
                f"cannot include a registry with pipeline={other.pipeline} into one with "
                f"pipeline={self.pipeline}"
            )
        for spec in other:
            self._add(spec)
        return self

    def get(self, topic: str) -> HandlerSpec | None:
        """The handler of `topic`, or None."""
        return self._specs.get(topic)

    @property
    def unordered_topics(self) -> list[str]:
        """Topics whose handler was declared `ordered=False`."""
        return sorted(t for t, spec in self._specs.items() if not spec.ordered)

    @property
    def topics(self) -> list[str]:
        """The registered topics, sorted."""
        return sorted(self._specs)

    def __iter__(self) -> Iterator[HandlerSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)
