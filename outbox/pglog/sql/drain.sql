-- The read-only statement of `outbox.testing.drain` on the PostgreSQL log; `{schema}` is the
-- quoted log schema.

-- name: log_drain_lag
-- The group's lag on the handled topics of the log: records after its committed offset, or (a
-- partition it has not read yet) after the earliest record retained, which is where it will
-- start (log_start_position). As the readers do, records at or past a partition's counter
-- (written by hand) are not counted, and a committed offset past the end or below 0 counts as
-- the readers reset it (to the end, to 0).
SELECT COALESCE(sum(GREATEST(0, p.next_offset - GREATEST(0, COALESCE(
    o.next_offset,
    (SELECT min(r.log_offset) FROM {schema}.log_records r
     WHERE r.partition_id = p.id AND r.log_offset < p.next_offset),
    p.next_offset
)))), 0)
FROM {schema}.log_topics t
JOIN {schema}.log_partitions p ON p.topic_id = t.id
LEFT JOIN {schema}.log_groups g ON g.name = %(group)s
LEFT JOIN {schema}.log_group_offsets o ON o.group_id = g.id AND o.partition_id = p.id
WHERE t.name = ANY(%(topics)s)
