"""`outbox console`: an operator's web page per service database.

Queues by topic and state, the live processes, each consumer group's lag, throughput sampled
by the console itself, and the dead letters (filter, open, requeue, purge). Served by uvicorn
(Starlette), the `console` extra; see docs/how-to/console.md.
"""

from outbox.console.server import Console, ConsoleConfig, Database, serve

__all__ = ["Console", "ConsoleConfig", "Database", "serve"]
