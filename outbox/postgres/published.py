"""The message ids `outbox serve` accepted (`http_published`), so that a publish retried over
HTTP writes nothing twice (migration 0009, docs/decisions/0023)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from outbox.postgres.queries import queries


class Published:
    """The ids of one schema's `http_published`, on the caller's connection and transaction."""

    def __init__(self, schema: str) -> None:
        sql = queries(schema)
        self._claim, self._forget = sql["serve_claim_ids"], sql["serve_forget_ids"]

    def claim(self, conn: Any, message_ids: Sequence[UUID]) -> set[UUID]:
        """Record `message_ids` in the caller's transaction; those not recorded before. A
        concurrent transaction recording one of them makes this wait for its end."""
        if not message_ids:
            return set()
        rows = conn.execute(self._claim, {"message_ids": list(message_ids)}).fetchall()
        return {row[0] for row in rows}

    def forget(self, conn: Any, window: float, batch: int = 10_000) -> int:
        """Forget ids recorded more than `window` seconds ago, at most `batch`; how many."""
        row = conn.execute(self._forget, {"window": window, "batch": batch}).fetchone()
        return int(row[0]) if row else 0
