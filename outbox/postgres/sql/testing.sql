-- The read-only statements of `outbox.testing.sent` (what a block of a test's code wrote to
-- producer_queue); they never lock or change a row. `{schema}` is the quoted outbox schema.
-- Every name starts with `sent_`.

-- name: sent_mark
-- The last id producer_queue's sequence gave out (0 before the first), and
-- producer_scheduled's, read when the block starts: a row the block then writes has a greater
-- id. A sequence is not transactional, so ids given to transactions still open do not hide
-- below the mark.
SELECT COALESCE(pg_sequence_last_value(
           pg_get_serial_sequence(%(table)s, 'id')::regclass), 0),
       COALESCE(pg_sequence_last_value(
           pg_get_serial_sequence(%(scheduled)s, 'id')::regclass), 0)

-- name: sent_rows
-- The rows of producer_queue written since the mark, as the reading transaction sees them, in
-- the order they were written, then those of producer_scheduled (messages due later), with
-- their due time.
SELECT message_id, topic, key, payload, headers, content_type, deliver_at
FROM (
    SELECT 0 AS kind, id, message_id, topic, key, payload, headers, content_type,
           NULL::timestamptz AS deliver_at
    FROM {schema}.producer_queue WHERE id > %(after)s
    UNION ALL
    SELECT 1, id, message_id, topic, key, payload, headers, content_type,
           LEAST(GREATEST(deliver_at, timestamptz '0001-01-02Z'), timestamptz '9999-12-30Z')
    FROM {schema}.producer_scheduled WHERE id > %(after_scheduled)s
) AS rows
ORDER BY kind, id
