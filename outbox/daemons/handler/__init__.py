"""The Handler: `consumer_queue` -> the service's decorated callbacks.

runner.py: the relay's loop hooks, dispatch to the workers, the lease and retention;
worker.py: one thread and its sessions; batches.py: batch transactions and how a failure splits
them; failures.py: what a failure records; config.py: the settings. The registry loader is
`outbox.core.handlers.load_handlers`, re-exported here.
"""

from outbox.core.handlers import load_handlers
from outbox.core.inbox_rows import Pending
from outbox.daemons.handler.config import HandlerConfig
from outbox.daemons.handler.failures import Misused, Undecodable
from outbox.daemons.handler.runner import HandlerRunner

__all__ = ["HandlerConfig", "HandlerRunner", "Misused", "Pending", "Undecodable", "load_handlers"]
