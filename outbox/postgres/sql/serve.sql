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
