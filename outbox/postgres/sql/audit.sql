-- The statements of the delivery audit (`outbox spark audit`): read-only, never the payloads.

-- name: audit_inbox_bounds
-- The id range of the inbox (consumer_queue and the handled messages of consumer_processed),
-- split by the audit into ranges read in parallel. consumer_queue's ends come from its
-- primary key index; consumer_processed's from a scan of it (no index on id).
SELECT min(id), max(id)
FROM (SELECT min(id) AS id FROM {schema}.consumer_queue
      UNION ALL SELECT max(id) FROM {schema}.consumer_queue
      UNION ALL SELECT min(id) FROM {schema}.consumer_processed
      UNION ALL SELECT max(id) FROM {schema}.consumer_processed) AS ends;

-- name: audit_inbox_read
-- The audit's columns of the inbox rows in one id range, for the audited topics and created
-- times. Read through a server-side cursor.
-- The handled messages (consumer_processed, migration 0007) carry their inbox row's id, so the
-- same ranges read them; consumer_processed has no index on id: each range scans it.
SELECT message_id::text, topic, created_at, processed_at, dead_at, handled_count
FROM {schema}.consumer_queue
WHERE id BETWEEN %(first_id)s AND %(last_id)s
  AND topic = ANY(%(topics)s)
  AND created_at >= %(since)s AND created_at < %(until)s
UNION ALL
SELECT message_id::text, topic, created_at, processed_at, NULL, handled_count
FROM {schema}.consumer_processed
WHERE id BETWEEN %(first_id)s AND %(last_id)s
  AND topic = ANY(%(topics)s)
  AND created_at >= %(since)s AND created_at < %(until)s;
