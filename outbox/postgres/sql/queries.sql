-- Every statement outbox runs, by name. `{schema}` is replaced by the quoted schema name;
-- parameters use psycopg's %(name)s style and are always bound, never interpolated.

-- name: send_one
-- One message: plain VALUES, which costs the server far less than unnest() over arrays.
-- Otherwise the same as `send`.
WITH inserted AS (
    INSERT INTO {schema}.producer_queue
        (message_id, topic, key, payload, headers, content_type, lane)
    SELECT * FROM (VALUES (CAST(%(message_id)s AS uuid), CAST(%(topic)s AS text),
                           CAST(%(key)s AS bytea), CAST(%(payload)s AS bytea),
                           CAST(%(headers)s AS jsonb), CAST(%(content_type)s AS text),
                           CAST(%(lane)s AS smallint))) AS m
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.producer_scheduled s
                      WHERE s.message_id = CAST(%(message_id)s AS uuid))
    ON CONFLICT (message_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM inserted) AS inserted,
       (SELECT pg_notify(%(channel)s, '')
        FROM {schema}.relay_state
        WHERE queue = 'producer' AND sleeping
        LIMIT 1) IS NOT NULL AS notified;

-- name: send
-- Insert a batch of messages and, in the same statement, wake a sleeping relay. NOTIFY takes a
-- cluster-wide lock at commit, so it is issued only when some producer relay is sleeping; a
-- busy relay will find the rows on its next fetch anyway. A message id that a row of the
-- queue has (committed, or inserted by a transaction that then commits: ON CONFLICT waits
-- for it) is skipped rather than violating the unique index, which would abort the caller's
-- transaction: the statement returns how many it inserted and, when that is not all of them,
-- their ids, which the caller deletes again before raising DuplicateMessageId. An id that a
-- message due later has (producer_scheduled) is skipped too, as `send_later` skips one of the
-- queue's.
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
    ) AS m(message_id, topic, key, payload, headers, content_type, lane)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.producer_scheduled s
                      WHERE s.message_id = m.message_id)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
)
SELECT count(*) AS inserted,
       CASE WHEN count(*) < cardinality(CAST(%(message_ids)s AS uuid[]))
            THEN array_agg(message_id) END AS inserted_ids,
       (SELECT pg_notify(%(channel)s, '')
        FROM {schema}.relay_state
        WHERE queue = 'producer' AND sleeping
        LIMIT 1) IS NOT NULL AS notified
FROM inserted;

-- name: send_one_generated
-- One message whose id `compose` generated (a new UUIDv7: no row can have it), so without the
-- conflict check: ON CONFLICT's speculative insertion costs the server a second pass over the
-- row and the unique index, the most of what `send_one` costs beyond a plain INSERT. Were the
-- id ever taken, the unique index refuses it and the caller's transaction is aborted: nothing
-- is written twice. Wakes a sleeping relay as `send` does, without returning a row: the
-- sender needs no count (the row is inserted or the statement fails), and a result row costs
-- the client more than the join of the one-row wake-up costs the server. `woken` is a volatile
-- subquery of the FROM list, which the planner neither drops nor runs more than once for
-- one message. The channel is a literal (`{channel}`, fixed per schema), not a parameter.
INSERT INTO {schema}.producer_queue
    (message_id, topic, key, payload, headers, content_type, lane)
SELECT m.*
FROM (VALUES (CAST(%(message_id)s AS uuid), CAST(%(topic)s AS text), CAST(%(key)s AS bytea),
              CAST(%(payload)s AS bytea), CAST(%(headers)s AS jsonb),
              CAST(%(content_type)s AS text), CAST(%(lane)s AS smallint))) AS m,
     (SELECT count(*) FROM (SELECT pg_notify({channel}, '')
                            FROM {schema}.relay_state
                            WHERE queue = 'producer' AND sleeping
                            LIMIT 1) AS w) AS woken;

-- name: send_one_generated_no_headers
-- `send_one_generated` for a message without headers (the common one): `headers` takes its
-- default ('{}'), one parameter fewer to bind and no jsonb to parse.
INSERT INTO {schema}.producer_queue
    (message_id, topic, key, payload, content_type, lane)
SELECT m.*
FROM (VALUES (CAST(%(message_id)s AS uuid), CAST(%(topic)s AS text), CAST(%(key)s AS bytea),
              CAST(%(payload)s AS bytea), CAST(%(content_type)s AS text),
              CAST(%(lane)s AS smallint))) AS m,
     (SELECT count(*) FROM (SELECT pg_notify({channel}, '')
                            FROM {schema}.relay_state
                            WHERE queue = 'producer' AND sleeping
                            LIMIT 1) AS w) AS woken;

-- name: send_generated
-- A batch of messages whose ids `compose` generated: `send` without the conflict check, as
-- `send_one_generated` says.
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
SELECT count(*) AS inserted,
       (SELECT pg_notify(%(channel)s, '')
        FROM {schema}.relay_state
        WHERE queue = 'producer' AND sleeping
        LIMIT 1) IS NOT NULL AS notified
FROM inserted;

-- name: send_later
-- A batch of which some messages have a due time (`Broker.send(..., deliver_at=, delay=)`;
-- migration 0008, decision 21). A message's due time is its `deliver_at` as given, else now()
-- plus its delay: the database's clock, never the client's. A message due later goes to
-- producer_scheduled, where the relay's fetch never reads it, and wakes no relay (the relay
-- looks at the next due time itself, at least every poll interval); one due now (no due time,
-- or a deliver_at already past) goes to producer_queue and wakes a sleeping relay as `send`
-- does. An id that a row of either table has is skipped, as `send` says, and the statement
-- returns how many it inserted and, when that is not all of them, their ids, which the caller
-- deletes again (`send_later_undo`) before raising DuplicateMessageId.
WITH m AS (
    SELECT r.message_id, r.topic, r.key, r.payload, r.headers, r.content_type, r.lane,
           COALESCE(r.at, now() + r.delay) AS due
    FROM unnest(
        CAST(%(message_ids)s AS uuid[]),
        CAST(%(topics)s AS text[]),
        CAST(%(keys)s AS bytea[]),
        CAST(%(payloads)s AS bytea[]),
        CAST(%(headers)s AS jsonb[]),
        CAST(%(content_types)s AS text[]),
        CAST(%(lanes)s AS smallint[]),
        CAST(%(deliver_ats)s AS timestamptz[]),
        CAST(%(delays)s AS interval[])
    ) AS r(message_id, topic, key, payload, headers, content_type, lane, at, delay)
), now_rows AS (
    INSERT INTO {schema}.producer_queue
        (message_id, topic, key, payload, headers, content_type, lane)
    SELECT message_id, topic, key, payload, headers, content_type, lane
    FROM m
    WHERE (m.due IS NULL OR m.due <= now())
      AND NOT EXISTS (SELECT 1 FROM {schema}.producer_scheduled s
                      WHERE s.message_id = m.message_id)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
), later_rows AS (
    INSERT INTO {schema}.producer_scheduled
        (message_id, topic, key, payload, headers, content_type, lane, deliver_at)
    SELECT message_id, topic, key, payload, headers, content_type, lane, due
    FROM m
    WHERE m.due > now()
      AND NOT EXISTS (SELECT 1 FROM {schema}.producer_queue q WHERE q.message_id = m.message_id)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
), ids AS (
    SELECT message_id FROM now_rows UNION ALL SELECT message_id FROM later_rows
)
SELECT (SELECT count(*) FROM ids) AS inserted,
       CASE WHEN (SELECT count(*) FROM ids) < cardinality(CAST(%(message_ids)s AS uuid[]))
            THEN ARRAY(SELECT message_id FROM ids) END AS inserted_ids,
       (SELECT pg_notify(%(channel)s, '')
        FROM {schema}.relay_state
        WHERE queue = 'producer' AND sleeping AND EXISTS (SELECT 1 FROM now_rows)
        LIMIT 1) IS NOT NULL AS notified;

-- name: send_later_undo
-- The rows a `send_later` of which some ids were taken did insert, deleted again.
WITH q AS (
    DELETE FROM {schema}.producer_queue WHERE message_id = ANY(CAST(%(message_ids)s AS uuid[]))
)
DELETE FROM {schema}.producer_scheduled
WHERE message_id = ANY(CAST(%(message_ids)s AS uuid[]));

-- name: cancel
-- Take back a message that has not left, in the caller's transaction: delete it from
-- producer_scheduled; or from producer_queue when no relay can be sending it: never attempted,
-- and its lane's advisory lock (the relays' lock class, its lane) free, which this transaction
-- then holds until it ends, so no relay takes the lane meanwhile (a relay holds its lanes'
-- locks for as long as it owns them: while one runs, a due message cannot be taken back; the
-- statement says 0 then, decision 21). A relay that moves a scheduled row at the same moment
-- (`producer_promote`, SKIP LOCKED) either skips it, while this transaction holds it, or has
-- moved it first: the first DELETE then waits for it and deletes nothing.
WITH scheduled AS (
    DELETE FROM {schema}.producer_scheduled WHERE message_id = %(message_id)s RETURNING 1
), candidate AS (
    -- OFFSET 0 keeps the lock function from running on any other row than this one.
    SELECT id, lane FROM {schema}.producer_queue
    WHERE message_id = %(message_id)s AND attempts = 0
    OFFSET 0
), queued AS (
    DELETE FROM {schema}.producer_queue
    WHERE id IN (
        SELECT id FROM candidate
        WHERE NOT EXISTS (SELECT 1 FROM scheduled)
          AND pg_try_advisory_xact_lock(CAST(%(lock_class)s AS int), CAST(lane AS int))
    )
    RETURNING 1
)
SELECT (SELECT count(*) FROM scheduled) + (SELECT count(*) FROM queued);

-- name: send_undo
-- The rows a `send` of which some ids were taken did insert: deleted again in the caller's
-- transaction, so that the refused send wrote nothing.
DELETE FROM {schema}.producer_queue WHERE message_id = ANY(CAST(%(message_ids)s AS uuid[]));

-- name: schema_version
SELECT version_num FROM {schema}.alembic_version;

-- name: relay_register
-- backend_start with backend_pid names this session exactly (a pid may be reused later); a
-- session always sees its own backend_start.
INSERT INTO {schema}.relay_state (relay_id, queue, backend_pid, sleeping, backend_start)
VALUES (%(relay_id)s, %(queue)s, pg_backend_pid(), false,
        (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()))
ON CONFLICT (relay_id) DO UPDATE SET backend_pid = EXCLUDED.backend_pid, sleeping = false,
    backend_start = EXCLUDED.backend_start, updated_at = now(), parked_at = NULL;

-- name: relay_forget_dead
-- Relays whose database session is gone (killed, crashed) leave their row behind; drop it so
-- that a dead relay neither keeps a share of the lanes nor, if it was sleeping, makes every
-- send pay for a NOTIFY. A row is alive only while pg_stat_activity shows its pid connected
-- to this database with its backend_start. A NULL backend_start on either side means unknown,
-- never dead: rows registered before migration 0004 have none, and pg_stat_activity hides it
-- for sessions of other roles unless this role has pg_read_all_stats; then the pid and the
-- database decide.
-- A parked relay (parked_at set: idle, no session of its own) is alive while it keeps looking:
-- its looks refresh updated_at (`relay_parked_seen`); one not seen for 10 minutes is gone.
DELETE FROM {schema}.relay_state r
WHERE CASE WHEN r.parked_at IS NOT NULL THEN r.updated_at < now() - interval '10 minutes'
      ELSE NOT EXISTS (
          SELECT 1 FROM pg_stat_activity a
          WHERE a.pid = r.backend_pid
            AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND (r.backend_start IS NULL OR a.backend_start IS NULL
                 OR a.backend_start = r.backend_start))
      END;

-- name: relay_lanes_held
-- Lanes of one lock class held by any session of this database. Advisory locks belong to a
-- database (pg_locks.database), but pg_locks lists those of the whole cluster: without the
-- filter a relay in another database on the same cluster seemed to hold every lane.
SELECT objid::int FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = CAST(%(lock_class)s AS bigint)::oid;

-- name: relay_lane_lock
-- Take a lane for this session, without waiting: true if it was free.
SELECT pg_try_advisory_lock(CAST(%(lock_class)s AS int), CAST(%(lane)s AS int));

-- name: relay_lanes_lock
-- Take each of these lanes for this session, without waiting: those taken, in the order given.
SELECT t.lane FROM unnest(CAST(%(lanes)s AS int[])) WITH ORDINALITY AS t(lane, n)
WHERE pg_try_advisory_lock(CAST(%(lock_class)s AS int), t.lane)
ORDER BY t.n;

-- name: relay_lane_unlock
SELECT pg_advisory_unlock(CAST(%(lock_class)s AS int), CAST(%(lane)s AS int));

-- name: relay_queue_tables
-- Every queue table of this database, in any schema: (schema, table), for the check that no
-- two of them share a lane lock class (LaneRelay.check_lock_class).
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname IN ('producer_queue', 'consumer_queue') AND c.relkind IN ('r', 'p');

-- name: relay_unregister
DELETE FROM {schema}.relay_state WHERE relay_id = %(relay_id)s;

-- name: relay_park
-- The relay parks (idle for --idle-disconnect seconds): its row stays, as parked since now,
-- counted by no relay sharing lanes and woken by no writer (not sleeping).
UPDATE {schema}.relay_state SET parked_at = COALESCE(parked_at, now()), sleeping = false,
    updated_at = now()
WHERE relay_id = %(relay_id)s;

-- name: relay_parked_seen
-- A parked relay's look: it is still there (its row is not forgotten as gone). The row comes
-- back, parked since now, if a relay forgot it meanwhile.
INSERT INTO {schema}.relay_state (relay_id, queue, backend_pid, sleeping, parked_at)
VALUES (%(relay_id)s, %(queue)s, pg_backend_pid(), false, now())
ON CONFLICT (relay_id) DO UPDATE SET updated_at = now()
    WHERE {schema}.relay_state.parked_at IS NOT NULL;

-- name: relay_set_sleeping
UPDATE {schema}.relay_state SET sleeping = %(sleeping)s, updated_at = now()
WHERE relay_id = %(relay_id)s;

-- name: relay_count
SELECT count(*) FROM {schema}.relay_state WHERE queue = %(queue)s AND parked_at IS NULL;

-- name: producer_fetch
-- The next rows of the lanes this relay owns, in id order, that may go out now:
--   * due (next_attempt_at <= now()), and
--   * not behind a retrying row of their key: while a key (lane, key) has rows that failed
--     retriably (attempts > 0), only the earliest of them (the lowest id) is fetched, once it
--     is due; the key's later rows wait until it is delivered. Rows of the key before it (a
--     requeued row keeps its old id) go first, in id order. Rows without a key have no order
--     and are never held.
-- Dead rows are not here (producer_fail moves them to producer_dead), so they hold nothing.
-- That a key's rows of one batch go to one topic is the relay's part (Producer.fetch). `exclude`
-- holds the ids of the batch still on its way to Kafka (the relay fetches the next batch
-- meanwhile; those rows are not deleted yet, so a retrying row in flight still holds its key),
-- or nothing.
WITH retrying AS (
    -- One row per key in retry: a hash table the scan below probes (the relay plans without
    -- sorts). Reads the partial index of retrying rows.
    SELECT lane, key, min(id) AS first_id
    FROM {schema}.producer_queue
    WHERE attempts > 0 AND dead_at IS NULL AND lane = ANY(%(lanes)s) AND key IS NOT NULL
    GROUP BY lane, key
)
-- The columns of outbox.core.batches.OutgoingRecord. The server formats what goes into the
-- wire headers (the message id's text, the creation time in ISO 8601, UTC), so the relay converts
-- nothing per row; user headers come as JSON text, NULL when there are none (the usual case).
SELECT id, topic, key, payload, message_id::text,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
       content_type, NULLIF(headers, '{}'::jsonb)::text, attempts
FROM {schema}.producer_queue q
WHERE q.lane = ANY(%(lanes)s)
  AND q.dead_at IS NULL
  AND q.next_attempt_at <= now()
  AND NOT EXISTS (
      SELECT 1 FROM retrying r WHERE r.lane = q.lane AND r.key = q.key AND r.first_id < q.id
  )
  -- A filter, not an anti-join: it keeps the scan in id order, and PostgreSQL 15+ hashes the
  -- array when it is a constant of the plan (the relay plans each execution: Producer.
  -- planner_settings). The cast matters: psycopg sends small ints as int2[], and a cross-type
  -- comparison is not hashed.
  AND q.id <> ALL(CAST(%(exclude)t AS bigint[]))
ORDER BY q.id
LIMIT %(limit)s;

-- name: producer_next_retry
-- Seconds until the earliest moment a row of the owned lanes that waits for a retry can be
-- fetched (see producer_fetch), or NULL when none waits: per key, only its earliest retrying
-- row counts, since the key's later rows wait for that one whatever their own time says. A
-- negative value means due already.
SELECT EXTRACT(EPOCH FROM min(q.next_attempt_at) - now())
FROM {schema}.producer_queue q
WHERE q.attempts > 0 AND q.dead_at IS NULL AND q.lane = ANY(%(lanes)s)
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.producer_queue e
      WHERE e.lane = q.lane AND e.key = q.key AND e.attempts > 0 AND e.dead_at IS NULL
        AND e.id < q.id
  );

-- name: producer_promote
-- Move the scheduled messages of the owned lanes that fell due (producer_scheduled, migration
-- 0008) into producer_queue, at most `limit`, in due-time order (send order for the same due
-- time): each gets a new id there, so it joins its key's rows behind every one already
-- waiting, and ahead of every one sent later; a key in retry holds it as any other row
-- (decision 21). It keeps its created_at (when it was sent). SKIP LOCKED: a row a caller's
-- `cancel` holds is left to that transaction. An id that a row of producer_queue took
-- meanwhile (a send without a due time under the same message id) is not moved twice: the
-- inbox would drop it as a redelivery anyway. Returns the rows moved and the seconds until
-- the next one of the lanes falls due (NULL when none waits; negative: due already, left by
-- the limit). With a limit of 0 it moves nothing: the look of a parked relay.
WITH due AS (
    SELECT id
    FROM {schema}.producer_scheduled
    WHERE deliver_at <= now() AND lane = ANY(%(lanes)s)
    ORDER BY deliver_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    -- By id, looked up: a join with `due`, or `IN` its query, read the whole table when the
    -- statistics said it was small (the plans test).
    DELETE FROM {schema}.producer_scheduled s
    WHERE s.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING s.id, s.message_id, s.topic, s.key, s.payload, s.headers, s.content_type,
              s.lane, s.created_at, s.deliver_at
), inserted AS (
    INSERT INTO {schema}.producer_queue
        (message_id, topic, key, payload, headers, content_type, lane, created_at)
    SELECT message_id, topic, key, payload, headers, content_type, lane, created_at
    FROM moved
    ORDER BY deliver_at, id
    ON CONFLICT (message_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved),
       EXTRACT(EPOCH FROM (
           -- Clamped: a time of `infinity` (before migration 0013's constraint) cannot be
           -- subtracted from now().
           SELECT LEAST(GREATEST(s.deliver_at, timestamptz '0001-01-02Z'),
                        timestamptz '9999-12-30Z')
           FROM {schema}.producer_scheduled s
           WHERE s.lane = ANY(%(lanes)s) AND s.id NOT IN (SELECT id FROM due)
           ORDER BY s.deliver_at, s.id
           LIMIT 1
       ) - now());

-- name: producer_delete
-- The ids come as one bigint[] in text form (OutboxStore's Ids: built in one join).
DELETE FROM {schema}.producer_queue WHERE id = ANY(CAST(%(ids)t AS bigint[]));

-- name: producer_fail
-- Record failed deliveries in one statement: a row with a delay is counted, keeps its error
-- and is retried after `delay` seconds; a row with a NULL delay can never be delivered and is
-- moved to producer_dead (same id and columns, attempts counted, dead_at now) for an operator,
-- out of the way of the relay's fetch. The errors must be storable text (outbox.core.text).
WITH f AS (
    SELECT *
    FROM unnest(
        CAST(%(ids)s AS bigint[]),
        CAST(%(errors)s AS text[]),
        CAST(%(delays)s AS float8[])
    ) AS f(id, error, delay)
), retried AS (
    UPDATE {schema}.producer_queue AS q
    SET attempts = q.attempts + 1,
        last_error = f.error,
        next_attempt_at = now() + make_interval(secs => f.delay)
    FROM f
    WHERE q.id = f.id AND f.delay IS NOT NULL
), moved AS (
    DELETE FROM {schema}.producer_queue AS q
    USING f
    WHERE q.id = f.id AND f.delay IS NULL
    RETURNING q.id, q.message_id, q.topic, q.key, q.payload, q.headers, q.content_type, q.lane,
              q.created_at, q.attempts, q.next_attempt_at, f.error
)
INSERT INTO {schema}.producer_dead
    (id, message_id, topic, key, payload, headers, content_type, lane, created_at, attempts,
     next_attempt_at, last_error, dead_at)
SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at,
       attempts + 1, next_attempt_at, error, now()
FROM moved;

-- name: inbox_insert
-- Store a batch of Kafka records, once per message id: a record delivered again (by Kafka, by a
-- relay that re-sent it, or by a replay) is skipped when its id is pending (the unique
-- message_id of consumer_queue) or handled within the dedup window (consumer_processed). A
-- redelivery that passes the second check while its first copy's handling commits is caught
-- by the Handler's claim (handler_claim_many). Then wake a sleeping Handler (or an `outbox serve`
-- waiting to lease inbox rows over HTTP: serve_listener_register). The arrays are
-- bound in binary form (the b placeholders): building their text form was most of the
-- Consumer's time.
WITH inserted AS (
    INSERT INTO {schema}.consumer_queue
        (message_id, topic, key, payload, headers, content_type, lane, created_at,
         source_partition, source_offset)
    SELECT * FROM unnest(
        CAST(%(message_ids)b AS uuid[]),
        CAST(%(topics)b AS text[]),
        CAST(%(keys)b AS bytea[]),
        CAST(%(payloads)b AS bytea[]),
        CAST(%(headers)b AS jsonb[]),
        CAST(%(content_types)b AS text[]),
        CAST(%(lanes)b AS smallint[]),
        CAST(%(created_ats)b AS timestamptz[]),
        CAST(%(partitions)b AS integer[]),
        CAST(%(offsets)b AS bigint[])
    ) AS r(message_id, topic, key, payload, headers, content_type, lane, created_at,
           source_partition, source_offset)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.consumer_processed p
                      WHERE p.message_id = r.message_id)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING topic
), woken AS (
    SELECT pg_notify(%(channel)s, '')
    FROM {schema}.relay_state
    WHERE queue IN ('handler', 'serve') AND sleeping
    LIMIT 1
)
-- rows stored, relays woken, and rows stored per topic ({"topic": n}, NULL when none; metrics)
SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM woken),
       (SELECT json_object_agg(topic, n)
        FROM (SELECT topic, count(*) AS n FROM inserted GROUP BY topic) AS per_topic);

-- name: inbox_quarantine
-- Store records that cannot be ordinary rows (outbox.core.batches.Quarantined) as dead
-- rows, once per message id: key and payload as received, every header base64-encoded in
-- raw_headers, no user headers, the raw-bytes content type, the reason in last_error and
-- attempts 0. Only uuid, bytea, base64 and `storable` text are bound: PostgreSQL cannot refuse
-- it for its data. Returns the rows stored per topic ({"topic": n}, NULL when none; metrics).
WITH inserted AS (
    INSERT INTO {schema}.consumer_queue
        (message_id, topic, key, payload, headers, content_type, lane, created_at,
         source_partition, source_offset, raw_headers, last_error, attempts, dead_at)
    SELECT m, t, k, p, '{}'::jsonb, 'application/octet-stream', l, c, sp, so, r, e, 0, now()
    FROM unnest(
        CAST(%(message_ids)s AS uuid[]),
        CAST(%(topics)s AS text[]),
        CAST(%(keys)s AS bytea[]),
        CAST(%(payloads)s AS bytea[]),
        CAST(%(lanes)s AS smallint[]),
        CAST(%(created_ats)s AS timestamptz[]),
        CAST(%(partitions)s AS integer[]),
        CAST(%(offsets)s AS bigint[]),
        CAST(%(raw_headers)s AS jsonb[]),
        CAST(%(errors)s AS text[])
    ) AS q(m, t, k, p, l, c, sp, so, r, e)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.consumer_processed d WHERE d.message_id = q.m)
    ON CONFLICT (message_id) DO NOTHING
    RETURNING topic
)
SELECT json_object_agg(topic, n)
FROM (SELECT topic, count(*) AS n FROM inserted GROUP BY topic) AS per_topic;

-- name: handler_fetch
-- The next pending rows of the owned lanes, in id order; a key whose earlier row waits for a
-- retry is held back, so a handler sees each key's messages in order (except on the topics
-- whose handler was declared ordered=False). Reads the pending index in id order, the lanes a
-- filter (migration 0005). The keys in retry are read for every lane, not only the owned ones:
-- with a lane condition the planner, whose statistics often still say the table is empty,
-- preferred reading every pending row to the small retry index (11 ms instead of 0.01 at
-- 60,000 pending rows); keys of other lanes match no row here.
WITH blocked AS (
    SELECT DISTINCT lane, key
    FROM {schema}.consumer_queue
    WHERE attempts > 0 AND processed_at IS NULL AND dead_at IS NULL
      AND next_attempt_at > now()
)
SELECT id, lane, key, topic
FROM {schema}.consumer_queue q
WHERE q.lane = ANY(%(lanes)s)
  AND q.processed_at IS NULL
  AND q.dead_at IS NULL
  AND q.next_attempt_at <= now()
  AND (q.topic = ANY(%(unordered)s)
       OR NOT EXISTS (SELECT 1 FROM blocked b WHERE b.lane = q.lane AND b.key = q.key))
ORDER BY q.id
LIMIT %(limit)s;

-- name: handler_claim_next
-- Fetch and lock the next pending rows of a worker's lanes in one statement, for one handler
-- transaction: handler_fetch's rows (id order; a key waits behind its retrying row except on
-- the unordered topics) with what their messages are made of, locked as handler_claim_many
-- locks them. The lanes are the worker's alone (its process holds their advisory locks), so
-- SKIP LOCKED passes over a row only while a transaction ended for overrunning its lease
-- still holds it. Rows whose message id is already in consumer_processed are deleted, not
-- handled (see handler_claim_many): they come back marked `dropped`, and count as taken, so
-- that a batch cut short by them is not mistaken for the last rows of the lanes.
WITH blocked AS (
    SELECT DISTINCT lane, key
    FROM {schema}.consumer_queue
    WHERE attempts > 0 AND processed_at IS NULL AND dead_at IS NULL
      AND next_attempt_at > now()
), locked AS MATERIALIZED (
    SELECT q.id, q.message_id, q.topic, q.key, q.payload, q.headers, q.content_type,
           q.created_at, q.received_at, q.attempts, q.source_partition, q.source_offset, q.lane
    FROM {schema}.consumer_queue q
    WHERE q.lane = ANY(%(lanes)s)
      AND q.processed_at IS NULL
      AND q.dead_at IS NULL
      AND q.next_attempt_at <= now()
      AND (q.topic = ANY(%(unordered)s)
           OR NOT EXISTS (SELECT 1 FROM blocked b WHERE b.lane = q.lane AND b.key = q.key))
    ORDER BY q.id
    LIMIT %(limit)s
    FOR UPDATE OF q SKIP LOCKED
), handled AS MATERIALIZED (
    SELECT l.id FROM locked l
    WHERE EXISTS (SELECT 1 FROM {schema}.consumer_processed p WHERE p.message_id = l.message_id)
), dropped AS (
    DELETE FROM {schema}.consumer_queue WHERE id = ANY(ARRAY(SELECT id FROM handled))
)
SELECT id, message_id, topic, key, payload, NULLIF(headers, '{}'::jsonb) AS headers,
       content_type, created_at, received_at,
       attempts, source_partition, source_offset, lane,
       id IN (SELECT id FROM handled) AS dropped
FROM locked
ORDER BY id;

-- name: handler_next_retry
-- Seconds until the earliest moment a row of the owned lanes that waits for a retry can be
-- fetched, or NULL when none waits. handler_fetch holds a key while any of its retrying rows
-- is not due, so a key is free at the latest next_attempt_at of its retrying rows, not the
-- earliest (that row is due but held: waking for it fetched nothing, at once, in a loop). A
-- row without a key is never held: its own time counts. Rows of the topics whose handler is
-- unordered are not held either but count with their key here (the statement does not know
-- those topics): they wait at most for the Handler's next poll. Negative: due already.
SELECT EXTRACT(EPOCH FROM min(free_at) - now())
FROM (
    SELECT max(next_attempt_at) AS free_at
    FROM {schema}.consumer_queue
    WHERE attempts > 0 AND processed_at IS NULL AND dead_at IS NULL AND lane = ANY(%(lanes)s)
      AND key IS NOT NULL
    GROUP BY lane, key
    UNION ALL
    SELECT next_attempt_at
    FROM {schema}.consumer_queue
    WHERE attempts > 0 AND processed_at IS NULL AND dead_at IS NULL AND lane = ANY(%(lanes)s)
      AND key IS NULL
) AS keys;

-- name: handler_claim
-- Lock one pending row for the handler's transaction (see handler_claim_many). SKIP LOCKED: a
-- row another process is handling right now is left to it. The claims return empty headers as
-- NULL, which the Handler reads as no headers without parsing JSON.
WITH locked AS MATERIALIZED (
    SELECT id, message_id, topic, key, payload, headers, content_type, created_at, received_at,
           attempts, source_partition, source_offset, processed_at, dead_at
    FROM {schema}.consumer_queue
    WHERE id = %(id)s
    FOR UPDATE SKIP LOCKED
), handled AS MATERIALIZED (
    SELECT l.id FROM locked l
    WHERE EXISTS (SELECT 1 FROM {schema}.consumer_processed p WHERE p.message_id = l.message_id)
), dropped AS (
    DELETE FROM {schema}.consumer_queue WHERE id = ANY(ARRAY(SELECT id FROM handled))
)
SELECT id, message_id, topic, key, payload, NULLIF(headers, '{}'::jsonb) AS headers,
       content_type, created_at, received_at,
       attempts, source_partition, source_offset
FROM locked
WHERE processed_at IS NULL AND dead_at IS NULL AND id NOT IN (SELECT id FROM handled);

-- name: handler_claim_many
-- Lock a batch of pending rows for one handler transaction (see handler_claim). The rows are
-- found by id alone, and whether they are still pending is checked once they are locked: with
-- the pending conditions in the same WHERE, a planner that believes the table small (its
-- statistics are often stale) reads the whole pending index and tests each entry against the
-- ids, 50 ms per claim at 50,000 pending rows instead of 0.3.
-- A row whose message id is already in consumer_processed is a redelivery stored while its
-- first copy's handling committed (inbox_insert's check read a snapshot taken before): it is
-- deleted here, in the handler's transaction, and never handled.
WITH locked AS MATERIALIZED (
    SELECT id, message_id, topic, key, payload, headers, content_type, created_at, received_at,
           attempts, source_partition, source_offset, processed_at, dead_at
    FROM {schema}.consumer_queue
    WHERE id = ANY(CAST(%(ids)s AS bigint[]))
    ORDER BY id
    FOR UPDATE SKIP LOCKED
), handled AS MATERIALIZED (
    SELECT l.id FROM locked l
    WHERE EXISTS (SELECT 1 FROM {schema}.consumer_processed p WHERE p.message_id = l.message_id)
), dropped AS (
    DELETE FROM {schema}.consumer_queue WHERE id = ANY(ARRAY(SELECT id FROM handled))
)
SELECT id, message_id, topic, key, payload, NULLIF(headers, '{}'::jsonb) AS headers,
       content_type, created_at, received_at,
       attempts, source_partition, source_offset
FROM locked
WHERE processed_at IS NULL AND dead_at IS NULL AND id NOT IN (SELECT id FROM handled)
ORDER BY id;

-- name: handler_done_many
-- Mark a batch of rows processed (see handler_done).
WITH handled AS (
    DELETE FROM {schema}.consumer_queue
    WHERE id = ANY(CAST(%(ids)s AS bigint[]))
    RETURNING message_id, id, topic, key, lane, created_at, attempts
)
INSERT INTO {schema}.consumer_processed AS p
    (message_id, id, topic, key, lane, created_at, attempts)
SELECT message_id, id, topic, key, lane, created_at, attempts + 1 FROM handled
ON CONFLICT (message_id) DO UPDATE
SET handled_count = p.handled_count + 1, processed_at = now(),
    attempts = p.attempts + excluded.attempts;

-- name: handler_done
-- Mark a row processed in the handler's transaction: the row leaves consumer_queue and its
-- message is recorded in consumer_processed for the dedup window, so that a redelivery of the
-- same message id is not stored again (migration 0007). handled_count counts the committed
-- handlings: above 1 means handled twice (the audit's "duplicated"), which the claim's check
-- of consumer_processed should make impossible.
WITH handled AS (
    DELETE FROM {schema}.consumer_queue
    WHERE id = %(id)s
    RETURNING message_id, id, topic, key, lane, created_at, attempts
)
INSERT INTO {schema}.consumer_processed AS p
    (message_id, id, topic, key, lane, created_at, attempts)
SELECT message_id, id, topic, key, lane, created_at, attempts + 1 FROM handled
ON CONFLICT (message_id) DO UPDATE
SET handled_count = p.handled_count + 1, processed_at = now(),
    attempts = p.attempts + excluded.attempts;

-- name: handler_fail
-- Record a failed attempt: retry after `delay` seconds, or (dead) keep it for an operator.
UPDATE {schema}.consumer_queue
SET attempts = attempts + 1,
    last_error = %(error)s,
    next_attempt_at = CASE WHEN %(dead)s THEN next_attempt_at
                           ELSE now() + make_interval(secs => %(delay)s) END,
    dead_at = CASE WHEN %(dead)s THEN now() ELSE NULL END
WHERE id = %(id)s AND processed_at IS NULL;

-- name: handler_retention
-- Forget handled messages older than the dedup window, a bounded batch at a time.
DELETE FROM {schema}.consumer_processed
WHERE message_id IN (
    SELECT message_id FROM {schema}.consumer_processed
    WHERE processed_at < now() - make_interval(secs => %(window)s)
    LIMIT %(limit)s
);

-- name: handler_recent_topics
-- The topics of the last %(limit)s rows in consumer_queue (pending, retrying or dead), and
-- how many rows each: what the consumers have been storing. The primary key read backwards
-- and a bound: cheap at any table size (the Handler asks once, at start).
SELECT topic, count(*)
FROM (SELECT topic FROM {schema}.consumer_queue ORDER BY id DESC LIMIT %(limit)s) AS recent
GROUP BY topic
ORDER BY topic;

-- name: handler_attempts
SELECT attempts FROM {schema}.consumer_queue WHERE id = %(id)s;

-- name: handler_terminate
-- End the backend running a handler transaction that overran its lease: its transaction rolls
-- back and its row locks are released, so nothing it wrote can commit.
SELECT pg_terminate_backend(%(pid)s);
