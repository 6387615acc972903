-- Every statement outbox runs, by name. `{schema}` is replaced by the quoted schema name;
-- parameters use psycopg's %(name)s style and are always bound, never interpolated.

-- name: send
-- Insert a batch of messages and, in the same statement, wake a sleeping relay. NOTIFY takes a
-- cluster-wide lock at commit, so it is issued only when some producer relay is sleeping; a
-- busy relay will find the rows on its next fetch anyway.
WITH inserted AS (
    INSERT INTO {schema}.producer_queue
        (message_id, topic, key, payload, headers, content_type, lane)
    SELECT * FROM unnest(
        CAST(%(message_ids)s AS uuid[]),
        CAST(%(topics)s AS text[]),
        CAST(%(keys)s AS bytea[]),
        CAST(%(payloads)s AS bytea[]),
        CAST(%(headers)s AS jsonb[]),
        CAST(%(content_types)s AS text[]),
        CAST(%(lanes)s AS smallint[])
    )
    RETURNING 1
)
SELECT pg_notify(%(channel)s, '')
FROM {schema}.relay_state
WHERE queue = 'producer' AND sleeping
LIMIT 1;

-- name: schema_version
SELECT version_num FROM {schema}.alembic_version;

-- name: relay_register
INSERT INTO {schema}.relay_state (relay_id, queue, backend_pid, sleeping)
VALUES (%(relay_id)s, %(queue)s, pg_backend_pid(), false)
ON CONFLICT (relay_id) DO UPDATE SET backend_pid = pg_backend_pid(), sleeping = false,
    updated_at = now();

-- name: relay_forget_dead
-- Relays whose database session is gone (killed, crashed) leave their row behind; drop it so
-- that a dead relay that was sleeping does not make every send pay for a NOTIFY.
DELETE FROM {schema}.relay_state
WHERE backend_pid NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL);

-- name: relay_unregister
DELETE FROM {schema}.relay_state WHERE relay_id = %(relay_id)s;

-- name: relay_set_sleeping
UPDATE {schema}.relay_state SET sleeping = %(sleeping)s, updated_at = now()
WHERE relay_id = %(relay_id)s;

-- name: relay_count
SELECT count(*) FROM {schema}.relay_state WHERE queue = %(queue)s;

-- name: producer_fetch
-- The next rows of the lanes this relay owns, in id order. A key with a row waiting for a
-- retry is held back entirely, so that no later message of that key overtakes it.
WITH blocked AS (
    SELECT DISTINCT lane, key
    FROM {schema}.producer_queue
    WHERE attempts > 0 AND dead_at IS NULL AND next_attempt_at > now()
      AND lane = ANY(%(lanes)s)
)
SELECT id, message_id, topic, key, payload, headers, content_type, created_at, attempts
FROM {schema}.producer_queue q
WHERE q.lane = ANY(%(lanes)s)
  AND q.dead_at IS NULL
  AND q.next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.lane = q.lane AND b.key = q.key)
ORDER BY q.id
LIMIT %(limit)s;

-- name: producer_next_retry
-- Seconds until the earliest scheduled retry in the owned lanes, or NULL when none waits.
SELECT EXTRACT(EPOCH FROM min(next_attempt_at) - now())
FROM {schema}.producer_queue
WHERE attempts > 0 AND dead_at IS NULL AND lane = ANY(%(lanes)s);

-- name: producer_delete
DELETE FROM {schema}.producer_queue WHERE id = ANY(%(ids)s);

-- name: producer_fail
-- Record a failed delivery: count it, keep the error, and schedule the next attempt (or, with
-- a NULL delay, mark the row dead so it stays for an operator).
UPDATE {schema}.producer_queue AS q
SET attempts = q.attempts + 1,
    last_error = f.error,
    next_attempt_at = CASE WHEN f.delay IS NULL THEN q.next_attempt_at
                           ELSE now() + make_interval(secs => f.delay) END,
    dead_at = CASE WHEN f.delay IS NULL THEN now() ELSE NULL END
FROM unnest(
    CAST(%(ids)s AS bigint[]),
    CAST(%(errors)s AS text[]),
    CAST(%(delays)s AS float8[])
) AS f(id, error, delay)
WHERE q.id = f.id;
