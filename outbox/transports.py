"""The registry of transports: which adapter `--transport NAME` means, never a daemon.

Each transport declares its own entry (an `outbox.ports.Transport`) in its own folder: its name,
its flags and the options object they are parsed into, how its publishers, subscribers, probe
and lag reader are made from those options, its contract-test factory and which of its settings
are secret. This module only knows where the built-in entries are (one line each, imported when
first asked for, so that choosing a transport by its name loads no driver it does not need) and
takes others by `register(entry)`: a module named in `OUTBOX_TRANSPORT_MODULES` (comma-separated,
imported on the registry's first use) registers its transport there, and it then runs under
every command, `status`, the console, AsyncAPI and `drain` like the built-in ones
(docs/how-to/transports.md).

The CLI, the composition root (outbox/runtime/) and the operator tools hold a transport's
options as a `TransportSettings` and pass them back to the entry: none reads their fields.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

from outbox import settings as env
from outbox.core.errors import ConfigurationError
from outbox.ports import Transport, TransportSettings

__all__ = [
    "KAFKA",
    "LOG",
    "Transport",
    "TransportSettings",
    "entries",
    "get",
    "names",
    "options",
    "register",
    "settings_of",
]

#: The built-in transports: one line each, `module:ATTRIBUTE` of its entry.
BUILT_IN: dict[str, str] = {
    "kafka": "outbox.kafka.transport:KAFKA",
    "postgres": "outbox.pglog.transport:LOG",
    "memory": "outbox.testing.memory:MEMORY",
}

_REGISTERED: dict[str, Transport[Any]] = {}
_LOCK = threading.RLock()
_LOADED_MODULES: set[str] = set()


def register(entry: Transport[Any]) -> Transport[Any]:
    """Add a transport to the registry (a third party's, from its own module); a
    `ConfigurationError` if another transport has its name. Returns `entry`."""
    with _LOCK:
        known = _REGISTERED.get(entry.name)
        if entry.name in BUILT_IN or (known is not None and known is not entry):
            raise ConfigurationError(f"a transport named {entry.name!r} is registered already")
        _REGISTERED[entry.name] = entry
    return entry


def _load_configured() -> None:
    """Import the modules `OUTBOX_TRANSPORT_MODULES` names (each registers its transport),
    once each; one `ConfigurationError` naming a module that cannot be imported."""
    listed = [m.strip() for m in os.environ.get(env.TRANSPORT_MODULES, "").split(",")]
    for module in listed:
        if not module or module in _LOADED_MODULES:
            continue
        with _LOCK:
            if module in _LOADED_MODULES:
                continue
            _LOADED_MODULES.add(module)
            try:
                import_module(module)
            except ImportError as exc:
                raise ConfigurationError(
                    f"{env.TRANSPORT_MODULES} names {module!r}, which cannot be imported: {exc}"
                ) from None


def _built_in(name: str) -> Transport[Any]:
    module, _, attribute = BUILT_IN[name].partition(":")
    entry: Transport[Any] = getattr(import_module(module), attribute)
    return entry


def names(feature: str | None = None) -> tuple[str, ...]:
    """The registered transports' names, in the order they are offered (the built-in ones
    first); with `feature`, those that have it (`Transport.features`: "processes" are the
    ones the CLI's daemons can use)."""
    _load_configured()
    every = (*BUILT_IN, *(n for n in _REGISTERED if n not in BUILT_IN))
    if feature is None:
        return every
    return tuple(n for n in every if feature in get(n).features)


def entries(feature: str | None = None) -> tuple[Transport[Any], ...]:
    """The registered transports (with `feature`, those that have it)."""
    return tuple(get(name) for name in names(feature))


def get(name: str, *, what: str = "transport", hint: str = "") -> Transport[Any]:
    """The transport registered as `name`; one `ConfigurationError` naming the registered ones
    otherwise (`what` names the setting in it, `hint` is appended)."""
    _load_configured()
    if isinstance(name, str) and name in BUILT_IN:
        return _built_in(name)
    try:
        return _REGISTERED[name]
    except (KeyError, TypeError):
        raise ConfigurationError(
            f"{what} must be one of {', '.join(names())}, got {name!r}{hint}"
        ) from None


def options(found: TransportSettings) -> Any:
    """The options of `found`'s transport: its own, or its defaults when it has none."""
    if found.options is not None:
        return found.options
    return get(found.name).options_of({})


def settings_of(
    name: str, values: Mapping[str, Any] | None = None, **more: Any
) -> TransportSettings:
    """The `TransportSettings` of transport `name` from flag values by destination
    (`kafka_bootstrap=...`, `log_url=...`; the others keep their defaults): what a program
    that builds its settings in code gives, as the CLI gives its parsed flags. `start` is
    where a new consumer group starts; the endpoints of the other transports that are given
    are remembered in `unused` (warned about at start)."""
    given = {**(values or {}), **more}
    entry = get(name, what="--transport", hint=f" (from {env.TRANSPORT}?)")
    unused = tuple(
        f"{other.endpoint_flag} (or {other.endpoint_env})"
        if other.endpoint_env
        else other.endpoint_flag
        for other in entries()
        if other is not entry and other.endpoint_dest and given.get(other.endpoint_dest)
    )
    return TransportSettings(
        name=entry.name,
        options=entry.options_of(given),
        start=given.get("start"),
        unused=unused,
    )


def __getattr__(attribute: str) -> Any:
    """`KAFKA` and `LOG`: the built-in entries, imported when asked for."""
    if attribute == "KAFKA":
        return get("kafka")
    if attribute == "LOG":
        return get("postgres")
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


if TYPE_CHECKING:  # the adapters' modules are not imported here, not even for their types
    KAFKA: Transport[Any]
    LOG: Transport[Any]
