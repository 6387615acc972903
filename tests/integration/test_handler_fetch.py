"""The Handler's fetch grows while a backlog keeps it full and shrinks when it comes back short."""

from __future__ import annotations

import psycopg

from outbox import Handlers
from outbox.core.lanes import LANES
from outbox.daemons.handler.config import HandlerConfig
from outbox.daemons.handler.runner import BUSY_BATCH_FACTOR, HandlerRunner


def _pending(url: str, count: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.consumer_queue (message_id, topic, key, payload, content_type, "
            "lane) SELECT gen_random_uuid(), 'fetch.t', ('k' || g)::bytea, '{}'::bytea, "
            "'application/json', g %% 64 FROM generate_series(1, %s) g",
            (count,),
        )


def test_fetches_double_while_full_up_to_the_factor_and_return_to_batch_size(
    outbox_database_url: str,
) -> None:
    batch = 10
    _pending(outbox_database_url, 1000)
    runner = HandlerRunner(HandlerConfig(outbox_database_url, batch_size=batch), Handlers())
    lanes = list(range(LANES))
    with runner.connect() as session, psycopg.connect(outbox_database_url, autocommit=True) as conn:
        sizes = [len(runner.fetch(session, lanes)) for _ in range(6)]
        assert sizes == [10, 20, 40, 80, 80, 80]
        assert sizes[-1] == batch * BUSY_BATCH_FACTOR
        conn.execute(
            "DELETE FROM outbox.consumer_queue "
            "WHERE id > (SELECT min(id) + 14 FROM outbox.consumer_queue)"
        )
        # 15 rows left: a short fetch (15 of 80), then batch_size again.
        assert [len(runner.fetch(session, lanes)) for _ in range(3)] == [15, 10, 15]
