-- The statements of the Spark jobs (`outbox spark consumer`, `outbox spark replay`), by name.
-- `{schema}` is replaced by the quoted schema name; parameters use psycopg's named style and
-- are always bound, never interpolated. Every name starts with `spark_`.
--
-- A Spark task stores its share of a micro-batch in one transaction: create the staging table,
-- COPY the records into it, then `spark_inbox_merge`. The staging table is dropped at commit,
-- so the steps also work through a pooler in transaction mode.

-- name: spark_inbox_stage
-- The records of one transaction, as they will be stored; gone at commit.
CREATE TEMPORARY TABLE outbox_spark_inbox_stage (
    message_id uuid NOT NULL,
    topic text NOT NULL,
    key bytea,
    payload bytea NOT NULL,
    headers jsonb NOT NULL,
    content_type text NOT NULL,
    lane smallint NOT NULL,
    created_at timestamptz NOT NULL,
    source_partition integer,
    source_offset bigint
) ON COMMIT DROP;

-- name: spark_inbox_copy
COPY pg_temp.outbox_spark_inbox_stage
    (message_id, topic, key, payload, headers, content_type, lane, created_at,
     source_partition, source_offset)
FROM STDIN (FORMAT BINARY);

-- name: spark_inbox_merge
-- The staged records into the inbox, once per message id, exactly as `inbox_insert` does for
-- the Consumer daemon: a record already there, pending (consumer_queue) or handled within the
-- dedup window (consumer_processed), is skipped. Rows get their ids in Kafka order, so a key keeps its order for the Handler.
-- Then wake a sleeping Handler, under the same condition as the daemon.
WITH inserted AS (
    INSERT INTO {schema}.consumer_queue
        (message_id, topic, key, payload, headers, content_type, lane, created_at,
         source_partition, source_offset)
    SELECT message_id, topic, key, payload, headers, content_type, lane, created_at,
           source_partition, source_offset
    FROM pg_temp.outbox_spark_inbox_stage s
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.consumer_processed p
                      WHERE p.message_id = s.message_id)
    ORDER BY topic, source_partition, source_offset
    ON CONFLICT (message_id) DO NOTHING
    RETURNING 1
), woken AS (
    SELECT pg_notify(%(channel)s, '')
    FROM {schema}.relay_state
    WHERE queue IN ('handler', 'serve') AND sleeping
    LIMIT 1
)
SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM woken);
