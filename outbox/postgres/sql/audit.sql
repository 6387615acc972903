-- The statements of the delivery audit (`outbox spark audit`): read-only, never the payloads.

-- name: audit_inbox_bounds
-- The id range of consumer_queue, split by the audit into ranges read in parallel. Both ends
-- come from the primary key index.
SELECT min(id), max(id) FROM {schema}.consumer_queue;

-- name: audit_inbox_read
-- The audit's columns of the inbox rows in one id range, for the audited topics and created
-- times. Read through a server-side cursor.
SELECT message_id::text, topic, created_at, processed_at, dead_at, handled_count
FROM {schema}.consumer_queue
WHERE id BETWEEN %(first_id)s AND %(last_id)s
  AND topic = ANY(%(topics)s)
  AND created_at >= %(since)s AND created_at < %(until)s;
