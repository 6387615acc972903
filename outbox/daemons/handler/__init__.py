"""The Handler runner: `consumer_queue` -> the service's decorated callbacks (see runner.py)."""

from outbox.daemons.handler.runner import HandlerConfig, HandlerRunner, Pending, load_handlers

__all__ = ["HandlerConfig", "HandlerRunner", "Pending", "load_handlers"]
