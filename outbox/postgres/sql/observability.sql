-- The statements of the daemons' metrics (`outbox.observability`), by name; every name starts
-- with `obs_`. Each runs every `stats_interval` seconds (15 by default) in a probe thread of a
-- daemon serving metrics, never per message.

-- name: obs_producer_queue_stats
-- Rows waiting to be relayed (pending or retrying, not dead) and the age in seconds of the
-- oldest, 0 when none waits; reads the partial index of waiting rows. Then the dead rows,
-- which producer_fail moved to producer_dead (a small table: an operator empties it). Then
-- the messages due later (producer_scheduled, migration 0008): how many, how many are due but
-- not yet taken by a relay (overdue), and how long past its due time the most overdue is (0
-- when none is): the first and the last read the index of due times from its start only.
SELECT count(*),
       COALESCE(GREATEST(0, EXTRACT(EPOCH FROM now() - min(created_at))), 0)::float8,
       (SELECT count(*) FROM {schema}.producer_dead),
       (SELECT count(*) FROM {schema}.producer_scheduled),
       (SELECT count(*) FROM {schema}.producer_scheduled WHERE deliver_at <= now()),
       -- (clamped: a due time of -infinity, before migration 0013, cannot be subtracted)
       (SELECT COALESCE(GREATEST(0, EXTRACT(EPOCH FROM
                   now() - GREATEST(min(deliver_at), timestamptz '0001-01-02Z'))), 0)::float8
        FROM {schema}.producer_scheduled)
FROM {schema}.producer_queue
WHERE dead_at IS NULL;

-- name: obs_consumer_queue_stats
-- Rows waiting to be handled (pending or retrying, not dead, not processed) and the age in
-- seconds of the oldest by received_at, 0 when none waits.
SELECT count(*),
       COALESCE(GREATEST(0, EXTRACT(EPOCH FROM now() - min(received_at))), 0)::float8
FROM {schema}.consumer_queue
WHERE processed_at IS NULL AND dead_at IS NULL;

-- name: obs_ping
-- The readiness probe's check that PostgreSQL answers.
SELECT 1;
