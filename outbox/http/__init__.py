"""`outbox serve`: topics, publish and subscriptions over HTTP for services in any language
(docs/http.md, docs/decisions/0023).

`serve(settings, config)` runs the server on uvicorn until SIGTERM or SIGINT; `build(settings,
config)` makes the FastAPI application (for tests, or to mount in an application of one's own).
The databases and the transport come from the composition root's `Settings` (the flags the
daemons take); where it listens, its tokens and its bounds from `ServeConfig`. FastAPI and
uvicorn come with the `serve` extra: this package's `__init__` imports neither, so that a
missing extra is one line (`require_extra`).
"""

from __future__ import annotations

import importlib.util
import signal
from types import FrameType
from typing import TYPE_CHECKING, Any

from outbox.core.errors import ConfigurationError
from outbox.http.config import DEFAULT_PORT, ServeConfig
from outbox.http.tokens import SCOPES, Token, read_tokens

if TYPE_CHECKING:
    from outbox.runtime.settings import Settings

__all__ = [
    "DEFAULT_PORT",
    "SCOPES",
    "ServeConfig",
    "Token",
    "build",
    "read_tokens",
    "require_extra",
    "serve",
]

#: What a missing extra says.
MISSING_EXTRA = "outbox serve needs the serve extra: pip install 'pg-kafka-outbox[serve]'"


def require_extra() -> None:
    """ConfigurationError naming the `serve` extra unless FastAPI and uvicorn are installed."""
    for module in ("fastapi", "uvicorn"):
        if importlib.util.find_spec(module) is None:
            raise ConfigurationError(f"{MISSING_EXTRA} ({module} is not installed)")


def build(settings: Settings, config: ServeConfig, *, check: bool = True) -> Any:
    """The FastAPI application of `settings` and `config`; with `check`, first one error if a
    database or the log is unreachable or not migrated."""
    require_extra()
    from outbox.http.app import create_app
    from outbox.http.service import Service

    service = Service(settings, config)
    if check:
        try:
            service.check()
        except Exception:
            service.close()
            raise
    return create_app(service)


def serve(settings: Settings, config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT (uvicorn's: requests in flight finish)."""
    require_extra()
    import uvicorn

    app = build(settings, config)

    class Server(uvicorn.Server):
        """uvicorn's server, which after a graceful stop on SIGTERM exits 0 as the daemons do
        (uvicorn raises the signal again once stopped, which makes the exit status -15)."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    server = Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            # A connection idle this long is closed; a slow body is bounded by BodyLimit, too
            # many connections at once are answered 503 rather than queued.
            timeout_keep_alive=5,
            limit_concurrency=1000,
            timeout_graceful_shutdown=10,
            log_level="warning",
            access_log=False,
            server_header=False,
        )
    )
    server.run()
