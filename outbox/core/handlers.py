"""The handler registry: `@handlers.handler("topic")` binds a topic to a callback.

One topic has exactly one handler in a registry (a callback, or a push delivery to an HTTP
endpoint: `deliver`); a second registration for the same topic is
refused when the decorator runs (to fan out, call several functions from one handler, or give
each consumer its own inbox schema). Registries from several modules merge with `include`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import typing
from collections import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from outbox.core import topics as _topics
from outbox.core.codecs import check_payload_type, decoder, type_name
from outbox.core.envelope import InboxMessage
from outbox.core.errors import ConfigurationError
from outbox.core.push import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT, HttpDelivery
from outbox.core.retry import Backoff
from outbox.core.serializers import JsonSerializer, Serializer
from outbox.core.text import first_line
from outbox.core.topics import Topic, validate_topic

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
    #: The type `message.payload` is validated into (from the Topic, else the callback's
    #: annotation `InboxMessage[T]`); None: the decoded JSON value, as sent.
    payload_type: type[Any] | None = None
    #: The Topic the handler was registered with, if any.
    declared: Topic[Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.func.__module__}.{_name_of(self.func)}"


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

    A handler registered with a `Topic` follows the name it answers to: while a test runs the
    Topic under a name of its own (`outbox.testing.topic_renamed`), `get`, `topics` and the
    specs answer under that name.
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
        #: By the name each topic was registered under (a Topic's declared name).
        self._specs: dict[str, HandlerSpec] = {}
        self._sent: dict[str, Topic[Any]] = {}
        #: `_specs` by the names their Topics answer to now, as of `topics.names_version()`.
        self._live: dict[str, HandlerSpec] = {}
        self._live_version = -1

    def handler(
        self,
        topic: str | Topic[Any],
        *,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        ordered: bool = True,
    ) -> Callable[[Func], Func]:
        """Register the decorated function (sync or async) as the handler of `topic`.

        With a `Topic` declaring a payload type, or a first parameter annotated
        `InboxMessage[T]` (T a dataclass or pydantic model), `message.payload` is a T: a
        payload that does not validate is dead at once, its validation error recorded.

        With `ordered=False` a message waiting for a retry does not hold back the later
        messages of its key.
        """
        return self._register(
            topic, max_attempts=max_attempts, backoff=backoff, ordered=ordered, batch=False
        )

    def batch_handler(
        self,
        topic: str | Topic[Any],
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

    def deliver(
        self,
        topic: str | Topic[Any],
        url: str,
        *,
        timeout: float | None = None,
        concurrency: int | None = None,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        source: str | None = None,
    ) -> None:
        """Deliver `topic` to an HTTP endpoint: each message POSTed to `url` (http:// or
        https://; credentials in it are sent as Basic authorization and masked in logs) as a
        CloudEvent in binary mode, in order per key (`outbox.core.push` says what each answer
        does). `timeout` bounds each socket operation (default 10 s), `concurrency` the
        requests in flight at once (default 8); `max_attempts` and `backoff` are the retry
        policy as for `handler`; `source` is `ce-source` (default `outbox://<database>`).

        The URL is checked now: a bad one raises `ConfigurationError` before anything runs.
        """
        name = validate_topic(topic.declared_name if isinstance(topic, Topic) else topic)
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        delivery = HttpDelivery(
            name,
            url,
            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
            concurrency=DEFAULT_CONCURRENCY if concurrency is None else concurrency,
            source=source,
        )
        self._add(
            HandlerSpec(
                topic=name,
                func=delivery,
                max_attempts=max_attempts,
                backoff=backoff or DEFAULT_BACKOFF,
                is_async=True,
                ordered=True,
                declared=topic if isinstance(topic, Topic) else None,
            )
        )

    def _register(
        self,
        topic: str | Topic[Any],
        *,
        max_attempts: int,
        backoff: Backoff | None,
        ordered: bool,
        batch: bool,
    ) -> Callable[[Func], Func]:
        """What `handler` and `batch_handler` share: check the arguments now, register the
        function when the decorator is applied."""
        declared = topic if isinstance(topic, Topic) else None
        name = validate_topic(topic.declared_name if isinstance(topic, Topic) else topic)
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        decorator = "batch_handler" if batch else "handler"

        def decorate(func: Func) -> Func:
            if not callable(func):
                raise ConfigurationError(f"@{decorator}({name!r}) must decorate a function")
            where = f"@{decorator}({name!r}) on {_name_of(func)!r}"
            _check_arguments(func, where, batch)
            # Names an annotation uses may be local to the function applying the decorator.
            localns = _caller_locals()
            payload_type = _payload_type(func, where, batch, declared, localns)
            if payload_type is not None:
                try:
                    decoder(payload_type, localns)  # resolved now, not at the first message
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{where}: {exc}") from exc
            # An object whose __call__ is a coroutine function is async as well.
            is_async = inspect.iscoroutinefunction(func) or (
                not inspect.isroutine(func)
                and inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004
            )
            if batch and is_async:
                raise ConfigurationError(
                    f"@{decorator}({name!r}): {_name_of(func)} is async; batch handlers "
                    "must be sync functions (use @handler for an async callback)"
                )
            self._add(
                HandlerSpec(
                    topic=name,
                    func=func,
                    max_attempts=max_attempts,
                    backoff=backoff or DEFAULT_BACKOFF,
                    is_async=is_async,
                    ordered=ordered,
                    batch=batch,
                    payload_type=payload_type,
                    declared=declared,
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
        self._live_version = -1

    def _current(self) -> dict[str, HandlerSpec]:
        """The specs by the name each topic answers to now: a Topic a test runs under another
        name (`outbox.testing.topic_renamed`) is handled under that name."""
        version = _topics.names_version()
        if version == self._live_version:
            return self._live
        live: dict[str, HandlerSpec] = {}
        for spec in self._specs.values():
            name = spec.declared.name if spec.declared is not None else spec.topic
            if name != spec.topic:
                spec = replace(spec, topic=name)
            existing = live.get(name)
            if existing is not None and existing.func is not spec.func:
                raise HandlerConflict(
                    f"topic {name!r} has two handlers while a Topic runs under that name: "
                    f"{existing.name} and {spec.name}; rename to a name no handler reads"
                )
            live[name] = spec
        self._live, self._live_version = live, version
        return live

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
        for spec in other._specs.values():
            self._add(spec)
        other_sent = other.sent_topics
        if other_sent:
            self.sends(*other_sent)
        return self

    def sends(self, *topics: Topic[Any]) -> None:
        """Declare topics this service sends (for its AsyncAPI document and checks); a second
        declaration of a name must be the same `Topic` object."""
        for topic in topics:
            if not isinstance(topic, Topic):
                raise ConfigurationError(
                    f"sends() takes outbox.Topic declarations, got {type(topic).__name__}"
                )
            existing = self._sent.get(topic.declared_name)
            if existing is not None and existing is not topic:
                raise ConfigurationError(
                    f"topic {topic.name!r} is already declared as sent by another Topic object "
                    f"({existing!r}); declare each topic once and import it"
                )
            self._sent[topic.declared_name] = topic

    @property
    def sent_topics(self) -> tuple[Topic[Any], ...]:
        """The topics declared with `sends`, by name."""
        return tuple(sorted(self._sent.values(), key=lambda topic: topic.name))

    def get(self, topic: str) -> HandlerSpec | None:
        """The handler of `topic`, or None."""
        return self._current().get(topic)

    @property
    def unordered_topics(self) -> list[str]:
        """Topics whose handler was declared `ordered=False`."""
        return sorted(t for t, spec in self._current().items() if not spec.ordered)

    @property
    def topics(self) -> list[str]:
        """The registered topics, sorted."""
        return sorted(self._current())

    def __iter__(self) -> Iterator[HandlerSpec]:
        return iter(list(self._current().values()))

    def __len__(self) -> int:
        return len(self._specs)


#: Payload annotations that mean "the decoded JSON value, as today".
_UNTYPED: tuple[object, ...] = (Any, object, dict, list, str, int, float, bool, bytes)
_LISTS = (list, abc.Sequence, abc.Iterable, abc.Collection, abc.MutableSequence)


def _caller_locals() -> dict[str, Any]:
    """The local names of the code applying a decorator (two frames up), or none."""
    try:
        return dict(sys._getframe(2).f_locals)
    except (AttributeError, ValueError):  # an interpreter without frames, or a short stack
        return {}


def _payload_type(
    func: Callable[..., Any],
    where: str,
    batch: bool,
    declared: Topic[Any] | None,
    localns: dict[str, Any],
) -> type[Any] | None:
    """The payload type of a handler: the Topic's, else its first parameter's annotation
    (`InboxMessage[T]`, or a list of them for a batch handler); both given must agree."""
    annotated = _annotated(func, where, batch, localns)
    from_topic = declared.payload if declared is not None else None
    if from_topic is not None and annotated is not None and annotated is not from_topic:
        raise ConfigurationError(
            f"{where}: the topic carries {type_name(from_topic)} but the callback is "
            f"annotated for {type_name(annotated)}"
        )
    return from_topic if from_topic is not None else annotated


def _annotated(
    func: Callable[..., Any], where: str, batch: bool, localns: dict[str, Any]
) -> type[Any] | None:
    """The T of the first parameter's `InboxMessage[T]` annotation, or None. Only that
    annotation is resolved (with `typing.get_type_hints`), so a connection type imported under
    TYPE_CHECKING still works; one that cannot be resolved is an error naming the function."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters or parameters[0].annotation is inspect.Parameter.empty:
        return None
    first = parameters[0]
    probe = _probe(first.name, first.annotation)
    target = inspect.unwrap(func)
    try:
        hint = typing.get_type_hints(
            probe, globalns=getattr(target, "__globals__", None), localns=localns
        )[first.name]
    except Exception as exc:
        raise ConfigurationError(
            f"{where}: cannot resolve the annotation {first.annotation!r} of its parameter "
            f"{first.name!r} ({type(exc).__name__}: {exc}); import the names it uses at "
            "module level (not only under TYPE_CHECKING)"
        ) from exc
    if batch and typing.get_origin(hint) in _LISTS:
        (hint,) = typing.get_args(hint) or (Any,)
    if hint is InboxMessage or typing.get_origin(hint) is not InboxMessage:
        return None
    (argument,) = typing.get_args(hint)
    if argument in _UNTYPED or isinstance(argument, TypeVar):
        return None
    if typing.get_origin(argument) in (dict, list, abc.Mapping, abc.Sequence):
        return None
    return check_payload_type(argument, where)


def _check_arguments(func: Callable[..., Any], where: str, batch: bool) -> None:
    """A callback is called with two positional arguments, the message (a batch handler: the
    list of messages) and the transaction's handle: one that cannot take them would fail each
    attempt until its message went dead, so it is refused when the decorator runs."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to read (some builtins): called as it is
        return
    try:
        signature.bind(None, None)
    except TypeError:
        first = "messages" if batch else "message"
        raise ConfigurationError(
            f"{where} must take two positional arguments, ({first}, conn): the "
            f"{first} and the transaction's handle; its signature is {signature}"
        ) from None


def _probe(name: str, annotation: object) -> Callable[[], None]:
    """A function annotated with only `name: annotation`, for `typing.get_type_hints`."""

    def probe() -> None:
        return None

    probe.__annotations__ = {name: annotation}
    return probe


def load_handlers(path: str, *, allow_empty: bool = False) -> Handlers:
    """Import `package.module:attribute` and check that it names a `Handlers` registry, with
    at least one handler unless `allow_empty` (a service that only sends); one
    ConfigurationError for every way that fails, the module's own exception included."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"handlers must be given as module:attribute (e.g. myservice.handlers:handlers), "
            f"got {path!r}"
        )
    if "/" in module_name or module_name.endswith(".py"):
        relative = module_name.removesuffix(".py").removeprefix("./")
        dotted = (
            f"{relative.replace('/', '.')}:{attribute}"
            if not relative.startswith("/")  # an absolute path: no dotted name to offer
            else "myservice.handlers:handlers, run from the directory that holds myservice/"
        )
        raise ConfigurationError(
            f"handlers must be given as a module's dotted name, not a file: {dotted} (got {path!r})"
        )
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            where = (
                f" (looked in the current directory, {Path.cwd()}, and sys.path: run from the "
                "directory that holds it, or add that directory to PYTHONPATH)"
            )
        raise ConfigurationError(
            f"cannot import {module_name!r} for handlers: {exc}{where}"
        ) from None
    except Exception as exc:  # the module itself fails: no retry can fix it either
        raise ConfigurationError(
            f"cannot import {module_name!r} for handlers: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, Handlers):
        raise ConfigurationError(
            f"{path} is a {type(target).__name__}, not an outbox.Handlers registry"
        )
    if not allow_empty and not len(target):
        raise ConfigurationError(f"{path} has no handlers registered")
    return target


def _name_of(func: Any) -> str:
    """A callback's qualified name; for a callable object, its class's."""
    name = getattr(func, "__qualname__", None)
    return name if isinstance(name, str) else f"{type(func).__qualname__} object"
