"""The composition root: one `Settings` in, running parts out (issue 32, decision 20).

`App` (app.py) builds a producer, a consumer, a handler, or a relay per database under a
supervisor, on any registered transport; `OutboxRuntime` (process.py) runs the three of one
service in threads of one process (`outbox run`, or an application's); `Settings` (settings.py)
is the one typed settings object they are built from. This package is the only one that imports
both the daemons (outbox/daemons/) and the adapters (outbox/postgres/, outbox/kafka/,
outbox/pglog/): the CLI, `outbox.testing.drain` and the benchmarks ask it.
"""

from outbox.runtime.app import App, InMemory, Part, Stores, postgres_stores
from outbox.runtime.process import OutboxRuntime
from outbox.runtime.settings import (
    ConsumerConfig,
    Databases,
    HandlerConfig,
    ObservabilityConfig,
    ProducerConfig,
    Settings,
    TransportSettings,
)

__all__ = [
    "App",
    "ConsumerConfig",
    "Databases",
    "HandlerConfig",
    "InMemory",
    "ObservabilityConfig",
    "OutboxRuntime",
    "Part",
    "ProducerConfig",
    "Settings",
    "Stores",
    "TransportSettings",
    "postgres_stores",
]
