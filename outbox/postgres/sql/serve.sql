-- The statements of `outbox serve` on an outbox database (docs/http.md).

-- name: serve_claim_ids
-- Record the message ids a publish over HTTP gave, in the transaction that writes the
-- messages; returns those not recorded before. A concurrent request with the same id waits
-- for this one's transaction (ON CONFLICT), then finds the id if it committed.
INSERT INTO {schema}.http_published (message_id)
SELECT unnest(CAST(%(message_ids)s AS uuid[]))
ON CONFLICT (message_id) DO NOTHING
RETURNING message_id;

-- name: serve_forget_ids
-- Forget at most `batch` ids recorded more than `window` seconds ago; how many.
WITH old AS (
    SELECT message_id FROM {schema}.http_published
    WHERE published_at < now() - make_interval(secs => %(window)s)
    ORDER BY published_at
    LIMIT %(batch)s
), deleted AS (
    DELETE FROM {schema}.http_published h USING old
    WHERE h.message_id = old.message_id
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: serve_inbox_lock
-- Serialize the HTTP leases of one schema's inbox (until the transaction ends): two at once
-- could each take a row of one key. The key: the schema's OID above, 2^31 - 1 below, which
-- no log partition lock (below 2^30) and no migration lock (0x74626F78 below) has.
SELECT pg_advisory_xact_lock(
    (SELECT oid FROM pg_namespace WHERE nspname = %(schema)s)::bigint << 32 | 2147483647);

-- name: serve_inbox_lease
-- Lease the next pending rows of `topics` to an HTTP client for `lease` seconds, in id order,
-- at most one row per key: a key's next row waits while an earlier one is leased or waits for
-- a retry (as handler_fetch holds it). A lease counts as an attempt; one not acknowledged in
-- time makes the row due again (at least once). Rows whose message was handled already (a
-- redelivery stored meanwhile) are left for the Handler's claim, which drops them.
WITH blocked AS (
    SELECT DISTINCT lane, key
    FROM {schema}.consumer_queue
    WHERE attempts > 0 AND processed_at IS NULL AND dead_at IS NULL
      AND next_attempt_at > now()
), candidates AS (
    SELECT q.id, q.lane, q.key
    FROM {schema}.consumer_queue q
    WHERE q.topic = ANY(%(topics)s)
      AND q.processed_at IS NULL AND q.dead_at IS NULL AND q.next_attempt_at <= now()
      AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.lane = q.lane AND b.key = q.key)
      AND NOT EXISTS (SELECT 1 FROM {schema}.consumer_processed p
                      WHERE p.message_id = q.message_id)
), firsts AS (
    SELECT min(id) AS id FROM candidates WHERE key IS NOT NULL GROUP BY lane, key
    UNION ALL
    SELECT id FROM candidates WHERE key IS NULL
), chosen AS (
    SELECT id FROM firsts ORDER BY id LIMIT %(limit)s
)
UPDATE {schema}.consumer_queue q
SET attempts = q.attempts + 1,
    next_attempt_at = now() + make_interval(secs => %(lease)s)
FROM chosen
WHERE q.id = chosen.id
RETURNING q.id, q.message_id, q.topic, q.key, q.payload, NULLIF(q.headers, '{}'::jsonb),
          q.content_type, q.attempts, q.created_at;

-- name: serve_inbox_nack
-- A leased row's attempt failed: due again after `delay` seconds, or dead (kept for an
-- operator, `outbox dead-letters`). Only a row still leased (not yet due again, not handled)
-- is changed; returns it with its attempts.
UPDATE {schema}.consumer_queue
SET last_error = %(error)s,
    next_attempt_at = CASE WHEN %(dead)s THEN next_attempt_at
                           ELSE now() + make_interval(secs => %(delay)s) END,
    dead_at = CASE WHEN %(dead)s THEN now() ELSE NULL END
WHERE id = %(id)s AND processed_at IS NULL AND dead_at IS NULL AND attempts > 0
RETURNING id, attempts;

-- name: serve_inbox_attempts
-- A pending row's topic and attempts (no row: handled, dead or unknown).
SELECT topic, attempts FROM {schema}.consumer_queue
WHERE id = %(id)s AND processed_at IS NULL AND dead_at IS NULL;

-- name: serve_inbox_done
-- Mark leased rows handled, as handler_done_many does (they leave consumer_queue; their message
-- ids are kept in consumer_processed for the dedup window), and return the ids marked: a row
-- dead, unknown, or handled meanwhile by another client's ack (which this one waited for) is
-- not. Its attempts are those counted already: each lease counted one, the handling's own
-- among them (handler_done_many adds the attempt its claim did not count).
WITH handled AS (
    DELETE FROM {schema}.consumer_queue
    WHERE id = ANY(CAST(%(ids)s AS bigint[])) AND dead_at IS NULL
    RETURNING message_id, id, topic, key, lane, created_at, attempts
), kept AS (
    INSERT INTO {schema}.consumer_processed AS p
        (message_id, id, topic, key, lane, created_at, attempts)
    SELECT message_id, id, topic, key, lane, created_at, attempts FROM handled
    ON CONFLICT (message_id) DO UPDATE
    SET handled_count = p.handled_count + 1, processed_at = now(),
        attempts = p.attempts + excluded.attempts
)
SELECT id FROM handled;

-- name: serve_listener_register
-- `outbox serve` waits for inbox rows of this schema on this session: listed as a process of
-- kind 'serve', always sleeping, so that the Consumer's store NOTIFYs while it waits
-- (inbox_insert); it shares no lanes (only the Handler's rows count for those). Dropped as a
-- dead relay's row when its session goes (relay_forget_dead).
INSERT INTO {schema}.relay_state (relay_id, queue, backend_pid, sleeping, backend_start)
VALUES (%(relay_id)s, 'serve', pg_backend_pid(), true,
        (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()))
ON CONFLICT (relay_id) DO UPDATE SET backend_pid = EXCLUDED.backend_pid, sleeping = true,
    backend_start = EXCLUDED.backend_start, updated_at = now(), parked_at = NULL;
