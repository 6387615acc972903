-- The statements of the operator commands (`outbox status`, `outbox dead-letters`), by name.
-- `{schema}` is replaced by the quoted schema name; parameters use psycopg's %(name)s style
-- and are always bound, never interpolated. Every name starts with `ops_`.
--
-- Row states, as the operator commands define them:
--   producer_queue: pending (attempts = 0), retrying (attempts > 0); a dead producer row
--                   (it can never be delivered) is in producer_dead, moved there by the
--                   relay, and requeue moves it back with its id.
--   consumer_queue: pending, retrying, dead as above; a handled message leaves it and is
--                   recorded in consumer_processed (migration 0007): processed, kept for the
--                   dedup window.
-- A processed message is the dedup record of a message that was handled: requeue and purge
-- never touch consumer_processed. (A consumer_queue row with processed_at set, left by a
-- release before 0007, counts as processed too.)

-- name: ops_status_producer
-- Per topic and state: rows and the age (seconds) of the oldest by created_at. (A row of
-- producer_queue with dead_at set would be one a relay older than migration 0004 marked.)
SELECT topic, state, count(*) AS rows,
       GREATEST(0, EXTRACT(EPOCH FROM now() - min(created_at)))::float8 AS oldest_age
FROM (
    SELECT topic, created_at,
           CASE WHEN dead_at IS NOT NULL THEN 'dead'
                WHEN attempts > 0 THEN 'retrying'
                ELSE 'pending' END AS state
    FROM {schema}.producer_queue
    UNION ALL
    SELECT topic, created_at, 'dead' FROM {schema}.producer_dead
) AS rows_
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: ops_status_scheduled
-- Messages due later (producer_scheduled, migration 0008) per topic: how many, how many are
-- due already but not yet moved to producer_queue by a relay (overdue: none runs, or it is
-- behind), the next due time and the seconds until it (negative: overdue). Due times are
-- clamped to years 1 and 9999: one of `infinity` (before migration 0013's constraint) can be
-- neither subtracted nor read by Python.
SELECT topic, rows, overdue, next_due_at,
       EXTRACT(EPOCH FROM next_due_at - now())::float8 AS next_due_in
FROM (
    SELECT topic, count(*) AS rows,
           count(*) FILTER (WHERE deliver_at <= now()) AS overdue,
           LEAST(GREATEST(min(deliver_at), timestamptz '0001-01-02Z'),
                 timestamptz '9999-12-30Z') AS next_due_at
    FROM {schema}.producer_scheduled
    GROUP BY topic
) AS per_topic
ORDER BY topic;

-- name: ops_status_consumer
-- Per topic and state: rows and the age (seconds) of the oldest by received_at (processed
-- messages: by processed_at, when they were handled).
SELECT topic, state, count(*) AS rows,
       GREATEST(0, EXTRACT(EPOCH FROM now() - min(at)))::float8 AS oldest_age
FROM (
    SELECT topic, received_at AS at,
           CASE WHEN processed_at IS NOT NULL THEN 'processed'
                WHEN dead_at IS NOT NULL THEN 'dead'
                WHEN attempts > 0 THEN 'retrying'
                ELSE 'pending' END AS state
    FROM {schema}.consumer_queue
    UNION ALL
    SELECT topic, processed_at, 'processed' FROM {schema}.consumer_processed
) AS rows_
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: ops_status_processes
-- The relay and handler processes that registered themselves. `alive` is false for a row left
-- behind by a process whose database session is gone (the daemons clean those up themselves),
-- by the rule of relay_forget_dead: its pid connected to this database, with its
-- backend_start when both are known.
-- updated_at changes when a process registers, goes to sleep or wakes up: it is not a
-- heartbeat, so a busy process can show a large age. A parked relay (parked_at: since when;
-- idle, --idle-disconnect) has no session: it is alive while its looks keep its row
-- (relay_forget_dead), and its updated_at is its last look's, at most a minute or so old.
SELECT r.relay_id,
       r.queue,
       r.backend_pid,
       r.sleeping,
       r.parked_at IS NOT NULL OR EXISTS (SELECT 1 FROM pg_stat_activity a
               WHERE a.pid = r.backend_pid
                 AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND (r.backend_start IS NULL OR a.backend_start IS NULL
                      OR a.backend_start = r.backend_start)) AS alive,
       GREATEST(0, EXTRACT(EPOCH FROM now() - r.updated_at))::float8 AS since_update,
       (SELECT count(*) FROM pg_locks l
        WHERE l.pid = r.backend_pid AND l.locktype = 'advisory' AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       ) AS lanes,
       r.parked_at
FROM {schema}.relay_state r
ORDER BY r.queue, r.relay_id;

-- name: ops_status_connections
-- Who holds this database's connections: outbox's sessions by application name (each daemon
-- names its connections `outbox-...`), this database's client sessions in all, the server's,
-- and its max_connections. Only the sessions this role may see are counted (a role without
-- pg_read_all_stats sees the others' as connected, with their application names).
SELECT (SELECT COALESCE(json_object_agg(application_name, n), '{}'::json)
        FROM (SELECT application_name, count(*) AS n FROM pg_stat_activity
              WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND starts_with(application_name, 'outbox')
              GROUP BY application_name ORDER BY application_name) AS named),
       (SELECT count(*) FROM pg_stat_activity
        WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND backend_type = 'client backend')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int,
       current_setting('max_connections')::int;

-- name: ops_lock_timeout
-- How long this session waits for a row lock before it fails (`SET lock_timeout`, for the
-- session), e.g. '10s'.
SELECT set_config('lock_timeout', %(timeout)s, false);

-- name: ops_statement_timeout
-- How long each statement of this session may run before it is cancelled (`SET
-- statement_timeout`, for the session), in milliseconds, e.g. '1500'.
SELECT set_config('statement_timeout', %(timeout)s, false);

-- name: ops_now
SELECT now();

-- name: ops_producer_dead_list
-- Dead rows, oldest id first; `total` counts every match before the LIMIT. %(text)s, when not
-- NULL, keeps the rows whose id, message id, key or error contains it (case-insensitive). An
-- error longer than 8,192 characters is read as its first 4,096 and its last whole lines up to
-- 4,096 characters (a Python traceback ends with the line naming its exception, which the list
-- shows), so that a page of 5 MB errors is not read whole.
SELECT id, message_id, topic, key, attempts, dead_at,
       CASE WHEN length(last_error) > 8192
            THEN left(last_error, 4096) || E'\n' ||
                 regexp_replace(right(last_error, 4096), '^[^\n]*\n', '')
            ELSE last_error END,
       count(*) OVER () AS total
FROM {schema}.producer_dead
WHERE (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
  AND (CAST(%(text)s AS text) IS NULL
       OR strpos(lower(concat_ws(' ', id::text, message_id::text, encode(key, 'escape'),
                                 last_error)), lower(%(text)s)) > 0)
ORDER BY id
LIMIT %(limit)s;

-- name: ops_consumer_dead_list
-- As ops_producer_dead_list (a long error cut alike), with `quarantined`: the record could not be stored as an ordinary
-- row (raw_headers holds its headers as received).
SELECT id, message_id, topic, key, attempts, dead_at,
       CASE WHEN length(last_error) > 8192
            THEN left(last_error, 4096) || E'\n' ||
                 regexp_replace(right(last_error, 4096), '^[^\n]*\n', '')
            ELSE last_error END,
       raw_headers IS NOT NULL AS quarantined, count(*) OVER () AS total
FROM {schema}.consumer_queue
WHERE dead_at IS NOT NULL AND processed_at IS NULL
  AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
  AND (CAST(%(text)s AS text) IS NULL
       OR strpos(lower(concat_ws(' ', id::text, message_id::text, encode(key, 'escape'),
                                 last_error)), lower(%(text)s)) > 0)
ORDER BY id
LIMIT %(limit)s;

-- name: ops_producer_show
-- One row by id or message id (whichever parameter is not NULL), in any state: from
-- producer_queue, else from producer_dead.
SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at, attempts,
       next_attempt_at, last_error, dead_at,
       CASE WHEN dead_at IS NOT NULL THEN 'dead'
            WHEN attempts > 0 THEN 'retrying'
            ELSE 'pending' END AS state
FROM {schema}.producer_queue
WHERE id = CAST(%(id)s AS bigint) OR message_id = CAST(%(message_id)s AS uuid)
UNION ALL
SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at, attempts,
       next_attempt_at, last_error, dead_at, 'dead'
FROM {schema}.producer_dead
WHERE id = CAST(%(id)s AS bigint) OR message_id = CAST(%(message_id)s AS uuid)
LIMIT 1;

-- name: ops_consumer_show
-- One row by id or message id: from consumer_queue, else a handled message from
-- consumer_processed (its payload and headers are gone: empty; attempts: those it took;
-- received_at and next_attempt_at: its processed_at). By message id it reads the primary key;
-- by id alone consumer_processed is scanned (it has no index on id).
SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at, attempts,
       next_attempt_at, last_error, dead_at,
       CASE WHEN processed_at IS NOT NULL THEN 'processed'
            WHEN dead_at IS NOT NULL THEN 'dead'
            WHEN attempts > 0 THEN 'retrying'
            ELSE 'pending' END AS state,
       source_partition, source_offset, received_at, processed_at, raw_headers
FROM {schema}.consumer_queue
WHERE id = CAST(%(id)s AS bigint) OR message_id = CAST(%(message_id)s AS uuid)
UNION ALL
SELECT * FROM (
    SELECT id, message_id, topic, key, ''::bytea, '{}'::jsonb, 'application/octet-stream', lane,
           created_at, attempts, processed_at, NULL::text, NULL::timestamptz, 'processed',
           NULL::integer, NULL::bigint, processed_at, processed_at, NULL::jsonb
    FROM {schema}.consumer_processed
    WHERE message_id = CAST(%(message_id)s AS uuid)
    UNION ALL
    SELECT id, message_id, topic, key, ''::bytea, '{}'::jsonb, 'application/octet-stream', lane,
           created_at, attempts, processed_at, NULL::text, NULL::timestamptz, 'processed',
           NULL::integer, NULL::bigint, processed_at, processed_at, NULL::jsonb
    FROM {schema}.consumer_processed
    WHERE CAST(%(message_id)s AS uuid) IS NULL AND id = CAST(%(id)s AS bigint)
) AS processed
LIMIT 1;

-- name: ops_producer_lock
-- The rows named by id or message id, with whether each is dead; requeue and purge check every
-- named row before changing any. The dead ones (of producer_dead) are locked until the end of
-- the transaction; the others are only reported.
WITH dead AS (
    SELECT id, message_id FROM {schema}.producer_dead
    WHERE id = ANY(CAST(%(ids)s AS bigint[]))
       OR message_id = ANY(CAST(%(message_ids)s AS uuid[]))
    FOR UPDATE
)
SELECT id, message_id, 'dead' AS state FROM dead
UNION ALL
SELECT id, message_id, CASE WHEN attempts > 0 THEN 'retrying' ELSE 'pending' END
FROM {schema}.producer_queue
WHERE id = ANY(CAST(%(ids)s AS bigint[]))
   OR message_id = ANY(CAST(%(message_ids)s AS uuid[]))
ORDER BY id;

-- name: ops_consumer_lock
-- The rows named by id or message id with their state, those of consumer_queue locked until
-- the end of the transaction; handled messages (consumer_processed) are only reported, as
-- 'processed' (named by id, consumer_processed is scanned: it has no index on id).
WITH queued AS (
    SELECT id, message_id,
           CASE WHEN processed_at IS NOT NULL THEN 'processed'
                WHEN dead_at IS NOT NULL THEN 'dead'
                WHEN attempts > 0 THEN 'retrying'
                ELSE 'pending' END AS state
    FROM {schema}.consumer_queue
    WHERE id = ANY(CAST(%(ids)s AS bigint[]))
       OR message_id = ANY(CAST(%(message_ids)s AS uuid[]))
    FOR UPDATE
)
SELECT id, message_id, state FROM queued
UNION
SELECT id, message_id, 'processed' FROM {schema}.consumer_processed
WHERE message_id = ANY(CAST(%(message_ids)s AS uuid[]))
UNION
SELECT id, message_id, 'processed' FROM {schema}.consumer_processed
WHERE cardinality(CAST(%(ids)s AS bigint[])) > 0 AND id = ANY(CAST(%(ids)s AS bigint[]))
ORDER BY id;

-- name: ops_producer_requeue_clashes
-- Dead rows, selected as for requeue, that cannot go back to producer_queue because a row
-- there has their message id (sent again meanwhile) or their id: (id, message_id, clashing
-- row's id).
SELECT d.id, d.message_id, q.id
FROM {schema}.producer_dead d
JOIN {schema}.producer_queue q ON q.message_id = d.message_id OR q.id = d.id
WHERE (CAST(%(ids)s AS bigint[]) IS NULL OR d.id = ANY(CAST(%(ids)s AS bigint[])))
  AND (CAST(%(topic)s AS text) IS NULL OR d.topic = %(topic)s)
ORDER BY d.id;

-- name: ops_producer_requeue
-- Give dead rows a fresh start: move them from producer_dead back to producer_queue with their
-- id, so each keeps its place among its key's rows (ids are the send order). The dead rows are
-- narrowed to %(ids)s and to %(topic)s, each when not NULL; with both NULL every dead row
-- matches. Only dead rows ever match.
WITH moved AS (
    DELETE FROM {schema}.producer_dead
    WHERE (CAST(%(ids)s AS bigint[]) IS NULL OR id = ANY(CAST(%(ids)s AS bigint[])))
      AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
    RETURNING id, message_id, topic, key, payload, headers, content_type, lane, created_at
)
INSERT INTO {schema}.producer_queue
    (id, message_id, topic, key, payload, headers, content_type, lane, created_at, attempts,
     next_attempt_at, last_error, dead_at)
SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at, 0, now(),
       NULL, NULL
FROM moved;

-- name: ops_consumer_requeue
UPDATE {schema}.consumer_queue
SET dead_at = NULL, attempts = 0, next_attempt_at = now(), last_error = NULL
WHERE dead_at IS NOT NULL AND processed_at IS NULL
  AND (CAST(%(ids)s AS bigint[]) IS NULL OR id = ANY(CAST(%(ids)s AS bigint[])))
  AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s);

-- name: ops_consumer_overtaken
-- For each of the dead rows %(ids)s (as requeue selects them, before it changes them): how
-- many later rows of the same key (id greater, any topic) were already handled. The Handler
-- holds a key back only behind a message that waits for a retry, never behind a dead one, so
-- these ran before the requeued message will. Handled messages older than the dedup window
-- are forgotten: the count is a lower bound then. Rows without a key have no order. Reads
-- consumer_processed whole (an operator's command; no index on key).
SELECT d.id, d.key, count(*) AS later
FROM {schema}.consumer_queue d
JOIN {schema}.consumer_processed l
  ON l.lane = d.lane AND l.key = d.key AND l.id > d.id
WHERE d.dead_at IS NOT NULL AND d.processed_at IS NULL AND d.key IS NOT NULL
  AND (CAST(%(ids)s AS bigint[]) IS NULL OR d.id = ANY(CAST(%(ids)s AS bigint[])))
  AND (CAST(%(topic)s AS text) IS NULL OR d.topic = %(topic)s)
GROUP BY d.id, d.key
ORDER BY d.id;

-- name: ops_producer_purge
-- Delete dead rows, selected as for requeue. Only dead rows ever match.
DELETE FROM {schema}.producer_dead
WHERE (CAST(%(ids)s AS bigint[]) IS NULL OR id = ANY(CAST(%(ids)s AS bigint[])))
  AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s);

-- name: ops_consumer_purge
-- Only dead rows of consumer_queue: a handled message's record (consumer_processed) is never
-- deleted here.
DELETE FROM {schema}.consumer_queue
WHERE dead_at IS NOT NULL AND processed_at IS NULL
  AND (CAST(%(ids)s AS bigint[]) IS NULL OR id = ANY(CAST(%(ids)s AS bigint[])))
  AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s);

-- name: ops_notify
-- Wake the daemon of a queue at once (delivered at commit, with the change it announces).
SELECT pg_notify(%(channel)s, '');

-- name: ops_status_claims
-- Handler transactions in flight: each holds the row lock of the message it is handling, and
-- its age shows a callback approaching its lease (after which the Handler terminates it).
-- Only those of this schema: a transaction that holds a lock on this schema's consumer_queue
-- (handlers of other schemas of the same database lock their own).
SELECT a.pid,
       a.state,
       GREATEST(0, EXTRACT(EPOCH FROM now() - a.xact_start))::float8 AS age
FROM pg_stat_activity a
WHERE a.datname = current_database()
  AND a.application_name = 'outbox-handler'
  AND a.xact_start IS NOT NULL
  AND a.pid <> pg_backend_pid()
  AND EXISTS (SELECT 1 FROM pg_locks l
              WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.granted
                AND l.relation = to_regclass('{schema}.consumer_queue'))
ORDER BY a.xact_start;
