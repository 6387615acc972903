"""The Handler's rounds grow while a backlog keeps them full and shrink when one is short."""

from __future__ import annotations

import psycopg
import pytest

from outbox import Handlers, InboxMessage
from outbox.core.lanes import LANES
from outbox.daemons.handler.runner import BUSY_BATCH_FACTOR

from .relay_helpers import app_of


def _pending(url: str, count: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox.consumer_queue (message_id, topic, key, payload, content_type, "
            "lane) SELECT gen_random_uuid(), 'fetch.t', ('k' || g)::bytea, '{}'::bytea, "
            "'application/json', g %% 64 FROM generate_series(1, %s) g",
            (count,),
        )


@pytest.mark.parametrize("concurrency", [1, 4])
def test_rounds_double_while_full_up_to_the_factor_and_return_to_batch_size(
    outbox_database_url: str, concurrency: int
) -> None:
    """Each round, every worker fetches and claims its own lanes' rows (its share of the
    round's limit) in its transactions: the rows handled per round double while rounds come
    back full, up to the factor, and a short round sets the limit back to batch_size."""
    batch = 10
    _pending(outbox_database_url, 1000)
    handlers = Handlers()
    handled: list[int] = []

    @handlers.handler("fetch.t")
    def on_row(message: InboxMessage, conn: psycopg.Connection) -> None:
        handled.append(1)

    tuning = {"batch_size": batch, "concurrency": concurrency}
    runner = app_of(outbox_database_url, None, handlers, handler=tuning).handler()
    lanes = list(range(LANES))

    def round_sizes(rounds: int) -> list[int]:
        sizes = []
        for _ in range(rounds):
            before = len(handled)
            runner.work(session, lanes)
            sizes.append(len(handled) - before)
        return sizes

    def share(limit: int) -> int:  # each worker's quota, rounded up
        return concurrency * -(-limit // concurrency)

    try:
        with (
            runner.connect() as session,
            psycopg.connect(outbox_database_url, autocommit=True) as conn,
        ):
            assert round_sizes(6) == [share(n) for n in (10, 20, 40, 80, 80, 80)]
            assert runner._limit == batch * BUSY_BATCH_FACTOR
            conn.execute(
                "DELETE FROM outbox.consumer_queue "
                "WHERE id > (SELECT min(id) + 14 FROM outbox.consumer_queue)"
            )
            # 15 rows left: a short round takes them and sets the limit back to batch_size;
            # the next look finds nothing and starts no round.
            assert round_sizes(1) == [15]
            assert runner._limit == batch
            assert runner.work(session, lanes) is False
            count = conn.execute("SELECT count(*) FROM outbox.consumer_processed").fetchone()
            assert count == (len(handled),)
    finally:
        runner._stop_workers()
