"""send(): a message id waiting in either queue is refused, due now or later

The SQL send of 0012 looked for a duplicate id only in the table it wrote: a message due now
whose id a message due later had (waiting in `producer_scheduled`), or one due later whose id
a message waiting in `producer_queue` had, was written a second time, and both were relayed.
That happens to a client retrying a send with a due time that has passed meanwhile (a fixed
`deliver_at`, or `now() + interval` after the first was moved into the queue). Python's
`Broker.send` refuses both (`DuplicateMessageId`); the function now does too, with the same
SQLSTATE 23505 and message, before writing anything. The function is replaced in place (the
same signature and rights).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from types import ModuleType

from alembic import op

from outbox.postgres.migrate import sibling_migration
from outbox.postgres.queries import quote_ident

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _previous() -> ModuleType:
    """Migration 0012, whose function this one changes (its body is written there and in 0008)."""
    return sibling_migration(__file__, "0012_sql_send_deliver_at.py")


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"migration 0014: 0012's function changed near {old!r}"
    return text.replace(old, new)


def _duplicate(q: str, other: str) -> str:
    return f"""IF EXISTS (SELECT 1 FROM {q}.{other} WHERE message_id = mid) THEN
            RAISE EXCEPTION USING ERRCODE = '23505', DETAIL = 'DuplicateMessageId',
                MESSAGE = 'message id ' || mid || ' is already in producer_queue or '
                    || 'producer_scheduled (sent and not yet relayed): each message needs an '
                    || 'id of its own; nothing of this send was written';
        END IF;
"""


def function_sql(schema: str) -> str:
    """0012's function, each branch refusing an id the other table has."""
    previous = _previous()
    q = quote_ident(schema)
    text = previous._with_pythons_duplicate_message(previous.function_sql(schema))
    text = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    text = _replace(
        text,
        f"""wakes no relay (decision 21).
        INSERT INTO {q}.producer_scheduled""",
        f"""wakes no relay (decision 21).
        {_duplicate(q, "producer_queue")}        INSERT INTO {q}.producer_scheduled""",
    )
    return _replace(
        text,
        f"""    END IF;
    INSERT INTO {q}.producer_queue (message_id""",
        f"""    END IF;
    IF send.message_id IS NOT NULL THEN
        {_duplicate(q, "producer_scheduled")}    END IF;
    INSERT INTO {q}.producer_queue (message_id""",
    )


def upgrade(schema: str) -> None:
    op.execute(function_sql(schema))


def downgrade(schema: str) -> None:
    previous = _previous()
    text = previous._with_pythons_duplicate_message(previous.function_sql(schema))
    op.execute(text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
