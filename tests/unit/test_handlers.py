"""The handler registry and how a handler path is loaded, without servers."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox import ConfigurationError, HandlerConflict, Handlers, InvalidTopic
from outbox.daemons.handler import load_handlers


def test_a_second_handler_for_a_topic_is_refused_when_decorating() -> None:
    handlers = Handlers()

    @handlers.handler("orders.created")
    def first(message: object, conn: object) -> None: ...

    with pytest.raises(HandlerConflict, match=r"already has the handler .*first"):

        @handlers.handler("orders.created")
        def second(message: object, conn: object) -> None: ...

    spec = handlers.get("orders.created")
    assert spec is not None and spec.func is first


def test_registries_merge_and_conflicts_surface_on_include() -> None:
    a, b, c = Handlers(), Handlers(), Handlers()
    a.handler("a")(lambda m, t: None)
    b.handler("b", max_attempts=2)(lambda m, t: None)
    c.handler("a")(lambda m, t: None)
    a.include(b)
    assert a.topics == ["a", "b"]
    assert a.get("b").max_attempts == 2  # type: ignore[union-attr]
    with pytest.raises(HandlerConflict):
        a.include(c)
    with pytest.raises(ConfigurationError, match="sqlalchemy"):
        a.include(Handlers(transaction="sqlalchemy"))


def test_async_handlers_are_recognised() -> None:
    handlers = Handlers()

    @handlers.handler("x")
    async def on_x(message: object, conn: object) -> None: ...

    assert handlers.get("x").is_async  # type: ignore[union-attr]


def test_an_object_with_an_async_call_is_an_async_handler() -> None:
    """Called as a sync callback it would return a coroutine that never runs."""

    class OnY:
        async def __call__(self, message: object, conn: object) -> None: ...

    handlers = Handlers()
    handlers.handler("y")(OnY())
    assert handlers.get("y").is_async  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="async"):
        handlers.batch_handler("z")(OnY())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"topic": "bad topic"}, InvalidTopic),
        ({"topic": "t", "max_attempts": 0}, ConfigurationError),
    ],
)
def test_bad_registrations(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        Handlers().handler(**kwargs)  # type: ignore[arg-type]


def test_bad_transaction_kind() -> None:
    with pytest.raises(ConfigurationError, match="'psycopg' or 'sqlalchemy'"):
        Handlers(transaction="django")  # type: ignore[arg-type]


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "svc_handlers_mod.py").write_text(
        textwrap.dedent(
            """
            from outbox import Handlers
            handlers = Handlers()
            empty = Handlers()
            not_handlers = 42
            @handlers.handler("t")
            def on_t(message, conn):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "svc_handlers_mod"
    sys.modules.pop("svc_handlers_mod", None)


def test_load_handlers_finds_the_registry(app_module: str) -> None:
    assert load_handlers(f"{app_module}:handlers").topics == ["t"]


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_colon_here", "module:attribute"),
        ("svc_missing_module:handlers", "cannot import 'svc_missing_module'"),
        ("{mod}:nope", "has no attribute 'nope'"),
        ("{mod}:not_handlers", "is a int, not an outbox.Handlers"),
        ("{mod}:empty", "no handlers registered"),
        # A file path where the module's dotted name goes: the dotted name it means.
        ("svc/handlers.py:handlers", "a module's dotted name, not a file: svc.handlers:handlers"),
        ("./svc/handlers:registry", "not a file: svc.handlers:registry"),
        ("svc_handlers.py:handlers", "not a file: svc_handlers:handlers"),
        ("/srv/svc/handlers.py:handlers", "not a file: myservice.handlers:handlers, run from"),
        # A package not found from here: where it was looked for.
        ("svc_missing_module:handlers", f"(looked in the current directory, {Path.cwd()}, "),
    ],
)
def test_load_handlers_errors_name_the_problem(app_module: str, path: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_handlers(path.format(mod=app_module))
    assert fragment in str(info.value)


def _one(message: object) -> None: ...


def _three(message: object, conn: object, extra: object) -> None: ...


def _keyword_only(*, message: object, conn: object) -> None: ...


@pytest.mark.parametrize("func", [_one, _three, _keyword_only, lambda: None])
@pytest.mark.parametrize("batch", [False, True])
def test_a_callback_that_cannot_take_message_and_handle_is_refused_when_decorating(
    func: object, batch: bool
) -> None:
    # Called with (message, handle) for every message: a one-argument callback would fail
    # each attempt until its message went dead, minutes after the mistake.
    handlers = Handlers()
    register = handlers.batch_handler if batch else handlers.handler
    with pytest.raises(ConfigurationError, match=r"must take two positional arguments") as info:
        register("t")(func)  # type: ignore[type-var]
    assert "(messages, conn)" in str(info.value) if batch else "(message, conn)" in str(info.value)
    assert handlers.topics == []


class _Callable:
    def __call__(self, message: object, conn: object) -> None: ...


@pytest.mark.parametrize(
    "func",
    [
        lambda message, conn: None,
        lambda message, conn, extra=None: None,
        lambda *args: None,
        lambda message, *rest, **options: None,
        _Callable(),
    ],
)
def test_callbacks_that_take_message_and_handle_are_accepted(func: object) -> None:
    handlers = Handlers()
    handlers.handler("t")(func)  # type: ignore[type-var]
    assert handlers.topics == ["t"]
