-- The read-only statements of `outbox.testing.drain` (the test helper that runs the daemons
-- until every message sent is handled); they never lock or change a row. `{schema}` is the
-- quoted outbox schema. Every name starts with `drain_`.
--
-- A row counts as "now" when its relay would take it now: due, and not behind a retrying row
-- of its key (as in producer_fetch and handler_fetch); otherwise as "later".

-- name: drain_producer_state
-- (rows to send now, rows to send later) of producer_queue.
WITH retrying AS (
    SELECT lane, key, min(id) AS first_id FROM {schema}.producer_queue
    WHERE attempts > 0 AND dead_at IS NULL AND key IS NOT NULL
    GROUP BY lane, key
)
SELECT count(*) FILTER (WHERE now_), count(*) FILTER (WHERE NOT now_)
FROM (
    SELECT q.next_attempt_at <= now() AND NOT COALESCE(r.first_id < q.id, false) AS now_
    FROM {schema}.producer_queue q
    LEFT JOIN retrying r ON r.lane = q.lane AND r.key = q.key
    WHERE q.dead_at IS NULL
) AS rows_

-- name: drain_consumer_state
-- (rows to handle now, rows to handle later) of consumer_queue; the topics of unordered
-- handlers are never held back by a retrying row of their key.
WITH blocked AS (
    SELECT DISTINCT lane, key FROM {schema}.consumer_queue
    WHERE attempts > 0 AND processed_at IS NULL AND dead_at IS NULL AND next_attempt_at > now()
)
SELECT count(*) FILTER (WHERE now_), count(*) FILTER (WHERE NOT now_)
FROM (
    SELECT q.next_attempt_at <= now() AND (b.lane IS NULL OR q.topic = ANY(%(unordered)s)) AS now_
    FROM {schema}.consumer_queue q
    LEFT JOIN blocked b ON b.lane = q.lane AND b.key = q.key
    WHERE q.processed_at IS NULL AND q.dead_at IS NULL
) AS rows_

-- name: drain_pending_samples
-- The first rows of consumer_queue still to handle, for the drain's timeout message.
SELECT message_id, topic, attempts, next_attempt_at <= now(), last_error
FROM {schema}.consumer_queue WHERE processed_at IS NULL AND dead_at IS NULL
ORDER BY id LIMIT %(limit)s

-- name: drain_producer_dead
-- The dead rows of the producer (every row of producer_dead is dead).
SELECT message_id, topic, last_error FROM {schema}.producer_dead
WHERE dead_at IS NOT NULL ORDER BY id

-- name: drain_consumer_dead
-- The dead rows of the consumer queue.
SELECT message_id, topic, last_error FROM {schema}.consumer_queue
WHERE dead_at IS NOT NULL ORDER BY id
