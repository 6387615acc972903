"""send(): the outbox's send as a SQL function, for services in any language

`<schema>.send(topic text, payload jsonb, key text DEFAULT NULL, headers jsonb DEFAULT NULL,
message_id uuid DEFAULT NULL, tenant text DEFAULT NULL) RETURNS uuid` writes one message to
`producer_queue` in the caller's transaction, as `Broker().send` of the same arguments does: the
same checks with the same messages (SQLSTATE 22023, the Python error's class name as DETAIL),
raised before anything is written; the same row (payload as compact JSON, key as UTF-8, lane,
headers, content type, the tenant header), which the Producer relays as any other; the same
wake-up (NOTIFY only while a producer relay sleeps). A message id that a row waiting in the
queue already has raises 23505 (unique_violation) naming it, as `DuplicateMessageId`; the
caller's statement fails, so nothing of it is written. The record limit is the Broker's
default, or the setting `outbox.max_message_bytes` when set (SET LOCAL ...). A plain PL/pgSQL
function with the caller's rights (not SECURITY DEFINER): the caller needs INSERT on
`producer_queue` and SELECT on `relay_state`. See docs/decisions/0024-sql-send-and-push.md.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

from outbox.core.envelope import (
    CREATED_AT_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    HEADER_OVERHEAD_BYTES,
)
from outbox.core.headers import CONTENT_TYPE, CREATED_AT, MESSAGE_ID, TENANT_HEADER
from outbox.core.lanes import LANES
from outbox.core.topics import MAX_TOPIC_LENGTH
from outbox.postgres.queries import channel, quote_ident

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SIGNATURE = "send(text, jsonb, text, jsonb, uuid, text)"


def _crc32_table() -> str:
    """zlib's CRC-32 table (reflected 0xEDB88320), as a bigint[] literal: the lane of a key is
    `zlib.crc32(key) % LANES` (outbox.core.lanes), which PostgreSQL 15 has no function for."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(str(c))
    return "ARRAY[" + ",".join(table) + "]::bigint[]"


def _own_header_bytes() -> int:
    """What `record_size` counts for outbox's own headers but the content type's value."""
    return (
        3 * HEADER_OVERHEAD_BYTES
        + len(MESSAGE_ID.encode())
        + 36
        + len(CREATED_AT.encode())
        + CREATED_AT_BYTES
        + len(CONTENT_TYPE.encode())
    )


def function_sql(schema: str) -> str:
    """The CREATE FUNCTION statement of `schema`'s send (no `%` and no `:name`, which the
    driver or SQLAlchemy's text() would read as parameters)."""
    q = quote_ident(schema)
    wake = channel(schema, "producer_queue").replace("'", "''")
    tenant_header = TENANT_HEADER
    return rf"""
CREATE FUNCTION {q}.send(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    message_id uuid DEFAULT NULL,
    tenant text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $send$
#variable_conflict use_column
DECLARE
    crc_table constant bigint[] := {_crc32_table()};
    setting text := current_setting('outbox.max_message_bytes', true);
    limit_bytes bigint := {DEFAULT_MAX_MESSAGE_BYTES};
    stored jsonb := '{{}}'::jsonb;
    header record;
    bad text;
    shown text;
    data bytea;
    raw_key bytea;
    header_bytes bigint := {_own_header_bytes()} + octet_length('application/json');
    size bigint;
    mid uuid := send.message_id;
    crc bigint;
    lane smallint;
    inserted uuid;
BEGIN
    IF setting IS NOT NULL AND setting <> '' THEN
        IF setting !~ '^[0-9]{{1,12}}$' OR setting::bigint < 1 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'ConfigurationError',
                MESSAGE = 'outbox.max_message_bytes is ' || quote_literal(setting)
                    || ': give a whole number of bytes of at least 1';
        END IF;
        limit_bytes := setting::bigint;
    END IF;
    IF send.tenant IS NOT NULL AND send.tenant !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{{0,62}}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidHeaders',
            MESSAGE = 'tenant ''' || send.tenant || ''' is not valid: a tenant is a database '
                || 'NAME (1-63 letters, digits, ''_'', ''.'' or ''-'', starting with a letter '
                || 'or digit); nothing was written';
    END IF;
    IF send.topic IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidTopic',
            MESSAGE = 'topic must be text, got NULL';
    ELSIF send.topic = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidTopic',
            MESSAGE = 'topic must not be empty';
    ELSIF length(send.topic) > {MAX_TOPIC_LENGTH} THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidTopic',
            MESSAGE = 'topic is ' || length(send.topic) || ' characters long; Kafka allows at '
                || 'most {MAX_TOPIC_LENGTH}';
    ELSIF send.topic IN ('.', '..') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidTopic',
            MESSAGE = 'topic ''' || send.topic || ''' is reserved by Kafka';
    ELSIF send.topic !~ '^[a-zA-Z0-9._-]+$' THEN
        -- The topic and each bad character as Python's repr shows them (quotes chosen alike).
        shown := CASE WHEN strpos(send.topic, '''') > 0 AND strpos(send.topic, '"') = 0
                      THEN '"' || send.topic || '"' ELSE '''' || send.topic || '''' END;
        SELECT string_agg(CASE WHEN c = '''' THEN '"''"' ELSE '''' || c || '''' END, ', '
                          ORDER BY c COLLATE "C") INTO bad
        FROM (SELECT DISTINCT c FROM regexp_split_to_table(send.topic, '') AS c
              WHERE c !~ '^[a-zA-Z0-9._-]$') AS chars;
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidTopic',
            MESSAGE = 'topic ' || shown || ' contains ' || bad || '; only ASCII '
                || 'letters, digits, ''.'', ''_'' and ''-'' are allowed';
    END IF;
    IF send.payload IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'SerializationError',
            MESSAGE = 'payload for topic ''' || send.topic || ''' is SQL NULL: give '
                || '''null''::jsonb for a JSON null';
    END IF;
    IF send.headers IS NOT NULL AND jsonb_typeof(send.headers) <> 'null' THEN
        IF jsonb_typeof(send.headers) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidHeaders',
                MESSAGE = 'headers must be a mapping (a JSON object) of names to string '
                    || 'values, got ' || jsonb_typeof(send.headers);
        END IF;
        FOR header IN SELECT * FROM jsonb_each(send.headers) LOOP
            IF header.key = '' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidHeaders',
                    MESSAGE = 'header name must be a non-empty str, got ''''';
            END IF;
            IF left(lower(header.key), 7) = 'outbox-' OR lower(header.key) = 'content-type'
            THEN
                RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidHeaders',
                    MESSAGE = 'header name ''' || header.key || ''' is reserved by outbox';
            END IF;
            IF jsonb_typeof(header.value) <> 'string' THEN
                RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'InvalidHeaders',
                    MESSAGE = 'header ''' || header.key || ''' must be str or bytes (a JSON '
                        || 'string), got ' || jsonb_typeof(header.value);
            END IF;
            header_bytes := header_bytes + {HEADER_OVERHEAD_BYTES} + octet_length(header.key)
                + octet_length(header.value #>> '{{}}');
        END LOOP;
        stored := send.headers;
    END IF;
    IF send.tenant IS NOT NULL THEN
        stored := stored || jsonb_build_object('{tenant_header}', send.tenant);
        header_bytes := header_bytes + {HEADER_OVERHEAD_BYTES}
            + octet_length('{tenant_header}') + octet_length(send.tenant);
    END IF;
    -- Compact JSON as Python writes it (separators "," and ":"): jsonb's text puts ", " and
    -- ": " between items and nowhere else outside strings; strings are kept as they are.
    data := convert_to(
        regexp_replace(send.payload::text, '("(?:[^"\\]|\\.)*")|([,:]) ', '\1\2', 'g'), 'UTF8');
    raw_key := convert_to(send.key, 'UTF8');
    size := coalesce(octet_length(raw_key), 0) + octet_length(data) + header_bytes;
    IF size > limit_bytes THEN
        RAISE EXCEPTION USING ERRCODE = '22023', DETAIL = 'PayloadTooLarge',
            MESSAGE = 'message for topic ''' || send.topic || ''' would be a ' || size
                || '-byte Kafka record (payload ' || octet_length(data) || ' bytes encoded, '
                || 'key ' || coalesce(octet_length(raw_key), 0) || ' bytes, headers with '
                || 'outbox''s own ' || header_bytes || ' bytes); the limit is ' || limit_bytes
                || ' bytes (the setting outbox.max_message_bytes)';
    END IF;
    IF mid IS NULL THEN
        -- A UUIDv7 as outbox.core.ids makes: 48 bits of Unix milliseconds, version 7, then
        -- gen_random_uuid's random bits and variant.
        mid := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
            PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)
                ::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid;
    END IF;
    IF raw_key IS NULL THEN
        lane := mod(get_byte(uuid_send(mid), 15), {LANES});
    ELSE
        crc := 4294967295;
        FOR i IN 0 .. octet_length(raw_key) - 1 LOOP
            crc := (crc >> 8) # crc_table[((crc # get_byte(raw_key, i)) & 255) + 1];
        END LOOP;
        lane := mod(crc # 4294967295, {LANES});
    END IF;
    INSERT INTO {q}.producer_queue (message_id, topic, key, payload, headers, content_type, lane)
    VALUES (mid, send.topic, raw_key, data, stored, 'application/json', lane)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id INTO inserted;
    IF inserted IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '23505', DETAIL = 'DuplicateMessageId',
            MESSAGE = 'message id ' || mid || ' is already in producer_queue (sent and not yet '
                || 'relayed): each message needs an id of its own; nothing of this send was '
                || 'written';
    END IF;
    -- NOTIFY takes a cluster-wide lock at commit: only while some producer relay sleeps.
    PERFORM pg_notify('{wake}', '')
    FROM {q}.relay_state WHERE queue = 'producer' AND sleeping LIMIT 1;
    RETURN mid;
END
$send$
"""


def upgrade(schema: str) -> None:
    op.execute(function_sql(schema))
    q = quote_ident(schema)
    op.execute(
        f"COMMENT ON FUNCTION {q}.{SIGNATURE} IS 'Write one message to producer_queue in the "
        "caller''s transaction, as outbox''s Broker.send does; returns its id.'"
    )


def downgrade(schema: str) -> None:
    op.execute(f"DROP FUNCTION {quote_ident(schema)}.{SIGNATURE}")
