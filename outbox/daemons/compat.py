"""One clear error for a daemon config built the way it was before it held tuning only.

`ProducerConfig`, `ConsumerConfig` and `HandlerConfig` once held the database URL, the schema,
the Kafka settings and the observability settings; those now reach the daemons through the
composition root (`outbox.runtime.Settings`). A config given one of them says so and where it
went, instead of Python's "unexpected keyword argument".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outbox.core.errors import ConfigurationError

#: The fields that left the daemon configs, and where each is given now.
MOVED: Mapping[str, str] = {
    "database_url": "Settings(databases=Databases.of(url))",
    "schema": "Settings(databases=Databases.of(url, schema=...))",
    "kafka_bootstrap": 'Settings(transport=transports.settings_of("kafka", kafka_bootstrap=...))',
    "kafka_config": 'Settings(transport=transports.settings_of("kafka", kafka_config=...))',
    "observability": "Settings(observability=ObservabilityConfig(...))",
    "topics": "Settings(topics=...)",
    "group": "Settings(group=...)",
    "handled_topics": "the Handlers registry given to outbox.runtime.App",
    "database": "Databases.of('NAME=URL')",
    "routing": "Settings(databases=Databases(route_header=..., quarantine=...))",
}


def refuse_moved(cls: type, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise a `ConfigurationError` naming the new home of a moved setting given to `cls`
    (by keyword, or a URL as the first positional argument, as `ProducerConfig(url)` was)."""
    given = [name for name in kwargs if name in MOVED]
    if not given and args and isinstance(args[0], str):
        given = ["database_url"]
    if given:
        where = "; ".join(f"{name}: {MOVED[name]}" for name in given)
        raise ConfigurationError(
            f"{cls.__name__} holds the daemon's tuning only: give {', '.join(given)} "
            f"to the composition root instead, outbox.runtime.App(Settings(...)) ({where})"
        )


def refuse_unwired(cls: type, **given: object) -> None:
    """Raise a `ConfigurationError` when a daemon is built without its stores or database
    (as `Producer(config, publishers)` once was, when outbox registered PostgreSQL's at import)."""
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ConfigurationError(
            f"{cls.__name__} needs {' and '.join(f'{name}=' for name in missing)}: the daemons "
            "no longer default to PostgreSQL's stores; build it with "
            "outbox.runtime.App(Settings(...)), which passes them"
        )
