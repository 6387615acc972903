"""send(..., deliver_at): the SQL send function writes a message due later as Broker.send does

`<schema>.send(topic, payload, key, headers, message_id, tenant, deliver_at timestamptz DEFAULT
NULL)`: with a `deliver_at` still to come (after the transaction's `now()`), the message is
written to `producer_scheduled` with that due time and wakes no relay, exactly as
`Broker.send(..., deliver_at=...)` writes it; without one, or with one already past, to
`producer_queue`, as before. A due time relative to now is the caller's `now() + interval
'...'`: the database's clock. The function of 0008 (six arguments) is replaced by this one
(seven, the last with a default), so calls with six arguments or fewer keep working.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from types import ModuleType

from alembic import op

from outbox.postgres.migrate import sibling_migration
from outbox.postgres.queries import quote_ident

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SIGNATURE = "send(text, jsonb, text, jsonb, uuid, text, timestamptz)"


def _sql_send() -> ModuleType:
    """Migration 0008, whose function this one extends (its body is written once, there)."""
    return sibling_migration(__file__, "0008_sql_send.py")


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"migration 0012: 0008's function changed near {old!r}"
    return text.replace(old, new)


def function_sql(schema: str) -> str:
    """0008's CREATE FUNCTION with the `deliver_at` argument and the scheduled branch."""
    q = quote_ident(schema)
    text: str = _sql_send().function_sql(schema)
    text = _replace(
        text,
        "    tenant text DEFAULT NULL\n) RETURNS uuid",
        "    tenant text DEFAULT NULL,\n    deliver_at timestamptz DEFAULT NULL\n) RETURNS uuid",
    )
    return _replace(
        text,
        f"    INSERT INTO {q}.producer_queue (message_id, topic, key, payload, headers, "
        "content_type, lane)\n",
        f"""    IF send.deliver_at IS NOT NULL AND send.deliver_at > now() THEN
        -- Due later: it waits in producer_scheduled, which the relay moves from when it falls
        -- due; a send due later wakes no relay (decision 21).
        INSERT INTO {q}.producer_scheduled
            (message_id, topic, key, payload, headers, content_type, lane, deliver_at)
        VALUES (mid, send.topic, raw_key, data, stored, 'application/json', lane, send.deliver_at)
        ON CONFLICT (message_id) DO NOTHING
        RETURNING message_id INTO inserted;
        IF inserted IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '23505', DETAIL = 'DuplicateMessageId',
                MESSAGE = 'message id ' || mid || ' is already in producer_queue or '
                    || 'producer_scheduled (sent and not yet relayed): each message needs an '
                    || 'id of its own; nothing of this send was written';
        END IF;
        RETURN mid;
    END IF;
    INSERT INTO {q}.producer_queue (message_id, topic, key, payload, headers, content_type, lane)
""",
    )


def _with_pythons_duplicate_message(text: str) -> str:
    """Both branches refuse a duplicate id with Broker.send's words (outbox/postgres/writer.py)."""
    return _replace(
        text,
        "' is already in producer_queue (sent and not yet '",
        "' is already in producer_queue or producer_scheduled (sent and not yet '",
    )


def upgrade(schema: str) -> None:
    q = quote_ident(schema)
    op.execute(f"DROP FUNCTION {q}.{_sql_send().SIGNATURE}")
    op.execute(_with_pythons_duplicate_message(function_sql(schema)))
    op.execute(
        f"COMMENT ON FUNCTION {q}.{SIGNATURE} IS 'Write one message to producer_queue (or, due "
        "later, to producer_scheduled) in the caller''s transaction, as outbox''s Broker.send "
        "does; returns its id.'"
    )


def downgrade(schema: str) -> None:
    op.execute(f"DROP FUNCTION {quote_ident(schema)}.{SIGNATURE}")
    _sql_send().upgrade(schema)
