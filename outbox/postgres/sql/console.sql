-- The statements of the operator's console (`outbox console`), by name. Every name starts with
-- `console_`. The console's answers are bounded whatever the rows hold: texts and bytes are cut
-- here, in PostgreSQL (left, substring), with their whole size (octet_length, which reads no
-- TOASTed value), so a 5 MB error or a 100 MB payload never reaches the console's process.
-- Row states are those of operations.sql.

-- name: console_producer_dead_page
-- A page of dead rows, in id order after %(after)s (NULL: from the first), at most %(limit)s;
-- the filters are those of ops_producer_dead_list. An error longer than %(error_chars)s bytes
-- is read as its first %(error_chars)s and its last %(tail_chars)s characters: a Python
-- traceback ends with the line that names its exception.
SELECT id, message_id, left(topic, %(topic_chars)s), substring(key from 1 for %(key_bytes)s),
       octet_length(key), attempts, dead_at, left(last_error, %(error_chars)s),
       octet_length(last_error), CASE WHEN octet_length(last_error) > %(error_chars)s
                THEN right(last_error, %(tail_chars)s) END, false AS quarantined
FROM {schema}.producer_dead
WHERE (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
  AND (CAST(%(text)s AS text) IS NULL
       OR strpos(lower(concat_ws(' ', id::text, message_id::text, encode(key, 'escape'),
                                 last_error)), lower(%(text)s)) > 0)
  AND (CAST(%(after)s AS bigint) IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s;

-- name: console_producer_dead_count
SELECT count(*)
FROM {schema}.producer_dead
WHERE (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
  AND (CAST(%(text)s AS text) IS NULL
       OR strpos(lower(concat_ws(' ', id::text, message_id::text, encode(key, 'escape'),
                                 last_error)), lower(%(text)s)) > 0);

-- name: console_consumer_dead_page
SELECT id, message_id, left(topic, %(topic_chars)s), substring(key from 1 for %(key_bytes)s),
       octet_length(key), attempts, dead_at, left(last_error, %(error_chars)s),
       octet_length(last_error), CASE WHEN octet_length(last_error) > %(error_chars)s
                THEN right(last_error, %(tail_chars)s) END,
       raw_headers IS NOT NULL AS quarantined
FROM {schema}.consumer_queue
WHERE dead_at IS NOT NULL AND processed_at IS NULL
  AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
  AND (CAST(%(text)s AS text) IS NULL
       OR strpos(lower(concat_ws(' ', id::text, message_id::text, encode(key, 'escape'),
                                 last_error)), lower(%(text)s)) > 0)
  AND (CAST(%(after)s AS bigint) IS NULL OR id > %(after)s)
ORDER BY id
LIMIT %(limit)s;

-- name: console_consumer_dead_count
SELECT count(*)
FROM {schema}.consumer_queue
WHERE dead_at IS NOT NULL AND processed_at IS NULL
  AND (CAST(%(topic)s AS text) IS NULL OR topic = %(topic)s)
  AND (CAST(%(text)s AS text) IS NULL
       OR strpos(lower(concat_ws(' ', id::text, message_id::text, encode(key, 'escape'),
                                 last_error)), lower(%(text)s)) > 0);

-- name: console_producer_show
-- One row by id or message id, in any state, as ops_producer_show, its long values cut: the
-- first bytes of key and payload, the first characters of topic and the first and last of the
-- error (as in console_producer_dead_page), the headers only when their text is at most
-- %(headers_bytes)s bytes; each with its whole size.
SELECT id, message_id, left(topic, %(topic_chars)s),
       substring(key from 1 for %(key_bytes)s), octet_length(key),
       substring(payload from 1 for %(payload_bytes)s), octet_length(payload),
       CASE WHEN octet_length(headers::text) <= %(headers_bytes)s THEN headers END,
       octet_length(headers::text),
       left(content_type, %(topic_chars)s), lane, created_at, attempts, next_attempt_at,
       left(last_error, %(error_chars)s), octet_length(last_error), dead_at, state,
       CASE WHEN octet_length(last_error) > %(error_chars)s
                THEN right(last_error, %(tail_chars)s) END
FROM (
    SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at,
           attempts, next_attempt_at, last_error, dead_at,
           CASE WHEN dead_at IS NOT NULL THEN 'dead'
                WHEN attempts > 0 THEN 'retrying'
                ELSE 'pending' END AS state
    FROM {schema}.producer_queue
    WHERE id = CAST(%(id)s AS bigint) OR message_id = CAST(%(message_id)s AS uuid)
    UNION ALL
    SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at,
           attempts, next_attempt_at, last_error, dead_at, 'dead'
    FROM {schema}.producer_dead
    WHERE id = CAST(%(id)s AS bigint) OR message_id = CAST(%(message_id)s AS uuid)
    LIMIT 1
) AS found;

-- name: console_consumer_show
SELECT id, message_id, left(topic, %(topic_chars)s),
       substring(key from 1 for %(key_bytes)s), octet_length(key),
       substring(payload from 1 for %(payload_bytes)s), octet_length(payload),
       CASE WHEN octet_length(headers::text) <= %(headers_bytes)s THEN headers END,
       octet_length(headers::text),
       left(content_type, %(topic_chars)s), lane, created_at, attempts, next_attempt_at,
       left(last_error, %(error_chars)s), octet_length(last_error), dead_at,
       CASE WHEN processed_at IS NOT NULL THEN 'processed'
            WHEN dead_at IS NOT NULL THEN 'dead'
            WHEN attempts > 0 THEN 'retrying'
            ELSE 'pending' END AS state,
       CASE WHEN octet_length(last_error) > %(error_chars)s
                THEN right(last_error, %(tail_chars)s) END,
       source_partition, source_offset, received_at, processed_at,
       CASE WHEN octet_length(raw_headers::text) <= %(headers_bytes)s THEN raw_headers END,
       octet_length(raw_headers::text)
FROM (
    SELECT id, message_id, topic, key, payload, headers, content_type, lane, created_at,
           attempts, next_attempt_at, last_error, dead_at, source_partition, source_offset,
           received_at, processed_at, raw_headers
    FROM {schema}.consumer_queue
    WHERE id = CAST(%(id)s AS bigint) OR message_id = CAST(%(message_id)s AS uuid)
    UNION ALL
    -- a handled message, as ops_consumer_show gives it
    SELECT id, message_id, topic, key, ''::bytea, '{}'::jsonb, 'application/octet-stream',
           lane, created_at, attempts, processed_at, NULL, NULL, NULL, NULL, processed_at,
           processed_at, NULL
    FROM {schema}.consumer_processed
    WHERE message_id = CAST(%(message_id)s AS uuid)
       OR (CAST(%(message_id)s AS uuid) IS NULL AND id = CAST(%(id)s AS bigint))
) AS found
LIMIT 1;

-- name: console_throughput
-- Counters the console samples to chart throughput, read in one snapshot:
--   written:  rows inserted into producer_queue, cumulative (PostgreSQL's statistics; a
--             requeued row too);
--   relayed:  rows deleted from producer_queue after an acknowledgement, cumulative: its
--             deletions less the rows moved to producer_dead (each such move is one deletion
--             and one insertion, made by the same statement);
--   received: rows stored into consumer_queue with an id greater than %(after)s, the highest
--             id of the previous sample (read through the primary key, not from the
--             statistics, which a session that went idle flushes only after 10 seconds); and
--             the highest id now;
--   handled:  messages handled since %(since)s (consumer_processed, through its processed_at
--             index). A handled row leaves consumer_queue, so the received ones are counted
--             in both tables, and the highest id is also looked for among the last handled.
-- The statistics count a row when its statement ran (a rolled-back send's rows too). A row
-- whose transaction commits after a sample that saw a greater id is not counted as received.
SELECT now(),
       COALESCE(sum(s.n_tup_ins) FILTER (WHERE s.relname = 'producer_queue'), 0)::bigint,
       GREATEST(0, COALESCE(sum(s.n_tup_del) FILTER (WHERE s.relname = 'producer_queue'), 0)
                   - COALESCE(sum(s.n_tup_ins) FILTER (WHERE s.relname = 'producer_dead'), 0)
       )::bigint,
       (SELECT count(*) FROM {schema}.consumer_queue
        WHERE id > COALESCE(CAST(%(after)s AS bigint), 9223372036854775807))
       + (SELECT count(*) FROM {schema}.consumer_processed
          WHERE processed_at > COALESCE(CAST(%(since)s AS timestamptz), 'infinity')
            AND id > COALESCE(CAST(%(after)s AS bigint), 9223372036854775807)),
       GREATEST((SELECT COALESCE(max(id), 0) FROM {schema}.consumer_queue),
                (SELECT COALESCE(max(id), 0)
                 FROM (SELECT id FROM {schema}.consumer_processed
                       ORDER BY processed_at DESC LIMIT 1000) AS last_handled)),
       (SELECT count(*) FROM {schema}.consumer_processed
        WHERE processed_at > COALESCE(CAST(%(since)s AS timestamptz), 'infinity'))
FROM pg_stat_user_tables s
WHERE s.schemaname = %(schema)s
  AND s.relname IN ('producer_queue', 'producer_dead');
