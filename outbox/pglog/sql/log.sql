-- The statements of the PostgreSQL log transport (outbox.pglog); `{schema}` is the log schema.
-- docs/decisions/0009-postgres-log.md explains the tables.

-- name: log_schema_version
SELECT version_num FROM {schema}.log_alembic_version;

-- name: log_topics
-- Every topic with its partitions: (topic, partition, partition id), for the clients' caches.
SELECT t.name, p.partition, p.id
FROM {schema}.log_topics t JOIN {schema}.log_partitions p ON p.topic_id = t.id
WHERE t.name = ANY(%(names)s)
ORDER BY t.name, p.partition;

-- name: log_create_topic
-- Create a topic and its partitions unless it exists (as Kafka's auto-create); a concurrent
-- creator wins, and both then read the same partitions.
WITH topic AS (
    INSERT INTO {schema}.log_topics (name, partitions) VALUES (%(name)s, %(partitions)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING id, partitions
)
INSERT INTO {schema}.log_partitions (topic_id, partition)
SELECT topic.id, p FROM topic, generate_series(0, topic.partitions - 1) AS p;

-- name: log_lock_partitions
-- The counter rows of a batch's partitions, locked in id order, so that two publishers whose
-- batches share partitions never deadlock (log_append then updates them). Returns (id, topic,
-- partition) of each one found: the publisher checks that every partition it chose still
-- exists and is still the one it thinks (a topic or partition deleted or recreated by hand).
SELECT p.id, t.name, p.partition
FROM {schema}.log_partitions p JOIN {schema}.log_topics t ON t.id = p.topic_id
WHERE p.id = ANY(%(partition_ids)s)
ORDER BY p.id
FOR UPDATE OF p;

-- name: log_append
-- Reserve gapless offsets per partition through its counter row and insert the batch there.
-- The counter row stays locked until commit, so a partition's offsets commit in order: a
-- reader that sees offset n committed sees every offset before it (no keyset trap). Within a
-- partition the records keep their order in the batch (`ord`). Wakes the subscribers that
-- announced a nap (log_members.sleeping); the notification is delivered at commit. Returns
-- how many records it appended: fewer than the batch when a partition's counter row is gone,
-- which the publisher checks before it commits.
WITH batch AS (
    SELECT *
    FROM unnest(
        %(partition_ids)s::int[], %(keys)s::bytea[], %(values)s::bytea[], %(headers)s::bytea[]
    ) WITH ORDINALITY AS b(partition_id, key, value, headers, ord)
), counts AS (
    SELECT partition_id, count(*) AS n FROM batch GROUP BY partition_id
), reserved AS (
    UPDATE {schema}.log_partitions p SET next_offset = p.next_offset + c.n
    FROM counts c WHERE p.id = c.partition_id
    RETURNING p.id, p.next_offset - c.n AS first_offset
), appended AS (
    INSERT INTO {schema}.log_records (partition_id, log_offset, key, value, headers)
    SELECT b.partition_id,
           r.first_offset + row_number() OVER (PARTITION BY b.partition_id ORDER BY b.ord) - 1,
           b.key, b.value, b.headers
    FROM batch b JOIN reserved r ON r.id = b.partition_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM appended),
       (SELECT pg_notify(%(channel)s, '')
        WHERE EXISTS (SELECT 1 FROM {schema}.log_members WHERE sleeping)) IS NOT NULL;

-- name: log_repair_counters
-- Move the counters of partitions past the highest offset they hold, never backwards: a record
-- written there by hand (not through log_append) would otherwise make every append to the
-- partition fail with a unique violation. Returns (id, next offset before, after) of each
-- counter moved. The counter rows are locked first, so no append runs meanwhile.
WITH locked AS (
    SELECT id, next_offset FROM {schema}.log_partitions
    WHERE id = ANY(%(partition_ids)s) ORDER BY id FOR UPDATE
), top AS (
    SELECT l.id, l.next_offset AS was,
           (SELECT max(r.log_offset) FROM {schema}.log_records r WHERE r.partition_id = l.id)
           AS highest
    FROM locked l
)
UPDATE {schema}.log_partitions p SET next_offset = top.highest + 1
FROM top WHERE p.id = top.id AND top.highest >= top.was
RETURNING p.id, top.was, p.next_offset;

-- name: log_publisher_session
-- The publisher's session limits (milliseconds, 0 for none): a publisher frozen inside an
-- append (SIGSTOP, a stalled VM) holds its partitions' counter rows, and every other
-- publisher of them waits; the server ends such a session, which rolls the append back.
SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, false),
       set_config('lock_timeout', %(lock)s, false);

-- name: log_topic_list
-- Topics (those in `names`, or every topic when it is NULL) with their partitions: (topic,
-- partition, next offset, earliest offset kept), in topic and partition order; a topic
-- without partitions has one row with NULLs. The earliest offset is the partition's end when
-- it keeps no record below it.
SELECT t.name, p.partition, p.next_offset,
       LEAST(p.next_offset,
             (SELECT min(r.log_offset) FROM {schema}.log_records r WHERE r.partition_id = p.id))
FROM {schema}.log_topics t LEFT JOIN {schema}.log_partitions p ON p.topic_id = t.id
WHERE %(names)s::text[] IS NULL OR t.name = ANY(%(names)s::text[])
ORDER BY t.name, p.partition;

-- name: log_topic_lock
-- A topic's id, its row locked until the transaction ends (two alters of one topic wait for
-- each other). No row: no such topic.
SELECT id FROM {schema}.log_topics WHERE name = %(name)s FOR UPDATE;

-- name: log_topic_partition_numbers
SELECT partition FROM {schema}.log_partitions WHERE topic_id = %(topic_id)s ORDER BY partition;

-- name: log_add_partitions
-- Add partitions `numbers` to a topic, and record its new count.
WITH added AS (
    INSERT INTO {schema}.log_partitions (topic_id, partition)
    SELECT %(topic_id)s, n FROM unnest(%(numbers)s::int[]) AS n
)
UPDATE {schema}.log_topics SET partitions = %(count)s WHERE id = %(topic_id)s;

-- name: log_fetch
-- The next records of the partitions a member reads, from its positions, in offset order per
-- partition, at most `limit` in all (the partitions in the order given). Only offsets below the
-- partition's counter (`next_offset`) are records: a row at or past it was not appended by a
-- publisher (planted by hand) and is never read, so it cannot make a group jump past the
-- records appended later; a partition whose row is gone has no records. The creation time in
-- milliseconds, NULL when infinite: a time written by hand past year 9999 or before year 1
-- cannot be loaded as a Python datetime, and would stop the fetch of every record after it
-- (the reader falls back to the time it reads the record, as for a Kafka record's timestamp).
SELECT p.partition_id, r.log_offset, r.key, r.value, r.headers,
       CASE WHEN isfinite(r.created_at)
            THEN CAST(floor(extract(epoch FROM r.created_at) * 1000) AS bigint) END
FROM unnest(%(partition_ids)s::int[], %(positions)s::bigint[]) WITH ORDINALITY
     AS p(partition_id, position, ord)
JOIN {schema}.log_partitions lp ON lp.id = p.partition_id
CROSS JOIN LATERAL (
    SELECT log_offset, key, value, headers, created_at
    FROM {schema}.log_records r
    WHERE r.partition_id = p.partition_id AND r.log_offset >= p.position
      AND r.log_offset < lp.next_offset
    ORDER BY r.log_offset
    LIMIT %(limit)s
) r
ORDER BY p.ord, r.log_offset
LIMIT %(limit)s;

-- name: log_group
-- The id of a consumer group, created on first use.
WITH created AS (
    INSERT INTO {schema}.log_groups (name) VALUES (%(name)s)
    ON CONFLICT (name) DO NOTHING RETURNING id
)
SELECT id FROM created UNION ALL SELECT id FROM {schema}.log_groups WHERE name = %(name)s;

-- name: log_member_register
-- backend_start with backend_pid names this session exactly (as relay_register). updated_at is
-- the member's heartbeat (log_member_heartbeat), session_timeout how old it may get before the
-- other members evict this one (log_member_evict).
INSERT INTO {schema}.log_members
    (member_id, group_id, topics, backend_pid, backend_start, sleeping, session_timeout)
VALUES (%(member_id)s, %(group_id)s, %(topics)s, pg_backend_pid(),
        (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()),
        %(sleeping)s, %(session_timeout)s)
ON CONFLICT (member_id) DO UPDATE SET group_id = EXCLUDED.group_id, topics = EXCLUDED.topics,
    backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
    sleeping = EXCLUDED.sleeping, session_timeout = EXCLUDED.session_timeout, updated_at = now();

-- name: log_member_heartbeat
-- The member's proof of life; no row: its registration is gone (the member registers again).
UPDATE {schema}.log_members SET updated_at = now()
WHERE member_id = %(member_id)s AND backend_pid = pg_backend_pid()
RETURNING 1;

-- name: log_members_stale
-- The other members of a group whose heartbeat is older than their own session timeout (none
-- for a member without one: an older outbox's, which does not heartbeat).
SELECT member_id, backend_pid FROM {schema}.log_members
WHERE group_id = %(group_id)s AND member_id <> %(member_id)s
  AND updated_at < now() - make_interval(secs => session_timeout)
ORDER BY member_id;

-- name: log_member_evict
-- Evict one stale member (run in a transaction): end its session, so that its advisory locks,
-- its partitions, go to the others (and a commit it sends when it wakes up fails: the session
-- it would commit in is gone), then drop its row. Its row is locked and its staleness checked
-- again first, so a member that beat meanwhile is left alone. Needs the member's role, or
-- pg_signal_backend (else insufficient_privilege, and nothing changes). Returns the backend pid
-- ended, no row when the member was not stale or its session already gone. (backend_start is
-- NULL in pg_stat_activity for another role's session unless this role has pg_read_all_stats.)
WITH stale AS (
    SELECT m.member_id, m.backend_pid, m.backend_start
    FROM {schema}.log_members m
    WHERE m.member_id = %(member_id)s AND m.group_id = %(group_id)s
      AND m.updated_at < now() - make_interval(secs => m.session_timeout)
    FOR UPDATE
), session AS (
    SELECT s.member_id, a.pid
    FROM stale s JOIN pg_stat_activity a ON a.pid = s.backend_pid
    WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND (a.backend_start = s.backend_start OR a.backend_start IS NULL
           OR s.backend_start IS NULL)
      AND a.application_name = 'outbox-log-subscriber' AND a.pid <> pg_backend_pid()
    OFFSET 0  -- the session is found before anything is ended
), ended AS (
    SELECT member_id, pid FROM session WHERE pg_terminate_backend(pid)
), dropped AS (
    DELETE FROM {schema}.log_members m USING ended WHERE m.member_id = ended.member_id
)
SELECT pid FROM ended;

-- name: log_member_unregister
DELETE FROM {schema}.log_members WHERE member_id = %(member_id)s;

-- name: log_member_sleeping
UPDATE {schema}.log_members SET sleeping = %(sleeping)s, updated_at = now()
WHERE member_id = %(member_id)s;

-- name: log_members_forget_dead
-- Members whose session is gone (killed, crashed) leave their row behind: drop it, so that it
-- neither keeps a share of the partitions nor makes every publish NOTIFY (as relay_forget_dead).
DELETE FROM {schema}.log_members m
WHERE NOT EXISTS (
    SELECT 1 FROM pg_stat_activity a
    WHERE a.pid = m.backend_pid
      AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND (a.backend_start = m.backend_start OR a.backend_start IS NULL
           OR m.backend_start IS NULL)
);

-- name: log_members_per_topic
-- How many live members of a group read each topic.
SELECT topic, count(*) FROM {schema}.log_members, unnest(topics) AS topic
WHERE group_id = %(group_id)s GROUP BY topic;

-- name: log_partitions_held
-- Partition ids of one group held by any session of this database: the advisory locks whose
-- bigint key has the group's upper half (pg_locks shows a bigint key as classid = upper 32
-- bits, objid = lower 32 bits, objsubid = 1).
SELECT objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = CAST(%(lock_class)s AS bigint)::oid;

-- name: log_partition_lock
SELECT pg_try_advisory_lock(%(key)s::bigint);

-- name: log_partition_unlock
SELECT pg_advisory_unlock(%(key)s::bigint);

-- name: log_start_position
-- Where the group reads a partition it just took: after its last committed record, else (a
-- new group) at the earliest record retained, else after the last record ever (all deleted).
-- A new group's start is committed at once, so retention never deletes what it has not read.
-- A committed offset past the partition's end (`next_offset`; written by hand, or left from a
-- partition recreated) is reset to the end, a negative one to 0, and the reset is stored (a
-- commit never moves a group back, so the group would otherwise stay past the end): returns
-- the start, the committed offset found (NULL: none) and the end. No row: no such partition.
WITH part AS (
    SELECT p.id, p.next_offset AS end_offset,
           (SELECT o.next_offset FROM {schema}.log_group_offsets o
            WHERE o.group_id = %(group_id)s AND o.partition_id = p.id) AS committed
    FROM {schema}.log_partitions p WHERE p.id = %(partition_id)s
), start AS (
    SELECT id AS partition_id, committed, end_offset, CASE
        WHEN committed IS NOT NULL THEN LEAST(GREATEST(committed, 0), end_offset)
        ELSE COALESCE(
            (SELECT min(r.log_offset) FROM {schema}.log_records r
             WHERE r.partition_id = part.id AND r.log_offset < part.end_offset),
            end_offset)
        END AS next_offset
    FROM part
), registered AS (
    INSERT INTO {schema}.log_group_offsets (group_id, partition_id, next_offset)
    SELECT %(group_id)s, partition_id, next_offset FROM start
    ON CONFLICT (group_id, partition_id) DO UPDATE
    SET next_offset = EXCLUDED.next_offset, updated_at = now()
    WHERE {schema}.log_group_offsets.next_offset <> EXCLUDED.next_offset
)
SELECT next_offset, committed, end_offset FROM start;

-- name: log_commit
-- Store a group's next offsets; never backwards (a late commit of a member that lost the
-- partition meanwhile must not make the group read again what its successor stored). The
-- subscriber commits only partitions whose lock its session holds; a partition whose row is
-- gone is skipped.
INSERT INTO {schema}.log_group_offsets (group_id, partition_id, next_offset)
SELECT %(group_id)s, c.partition_id, c.next_offset
FROM unnest(%(partition_ids)s::int[], %(next_offsets)s::bigint[]) AS c(partition_id, next_offset)
JOIN {schema}.log_partitions p ON p.id = c.partition_id
ON CONFLICT (group_id, partition_id) DO UPDATE
SET next_offset = GREATEST({schema}.log_group_offsets.next_offset, EXCLUDED.next_offset),
    updated_at = now();

-- name: log_partition_ids
SELECT id FROM {schema}.log_partitions ORDER BY id;

-- name: log_retention
-- Delete the oldest records of one partition, a prefix of at most `batch` of them: those
-- older than `retention` seconds and read by every group that reads the partition (below the
-- least committed offset). Returns how many were deleted. A prefix keeps the rule "a new group
-- starts at the least offset retained".
WITH head AS (
    SELECT log_offset, created_at FROM {schema}.log_records
    WHERE partition_id = %(partition_id)s ORDER BY log_offset LIMIT %(batch)s
), read_by_all AS (
    SELECT COALESCE(
        (SELECT min(next_offset) FROM {schema}.log_group_offsets
         WHERE partition_id = %(partition_id)s),
        (SELECT next_offset FROM {schema}.log_partitions WHERE id = %(partition_id)s)
    ) AS bound
), stop AS (
    SELECT COALESCE(
        (SELECT min(h.log_offset) FROM head h, read_by_all b
         WHERE h.created_at >= now() - make_interval(secs => %(retention)s)
            OR h.log_offset >= b.bound),
        (SELECT max(log_offset) + 1 FROM head)
    ) AS upto
), deleted AS (
    DELETE FROM {schema}.log_records r USING stop
    WHERE r.partition_id = %(partition_id)s AND r.log_offset < stop.upto
    RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: log_group_lag
-- The lag of consumer groups (those named in `names`, or every group when it is NULL): per
-- group, each partition it has a committed offset in, that offset (the next one it reads) and
-- the partition's end (the next one a publisher writes), in group, topic, partition order. A
-- group with no committed offset yet has one row of NULLs. One statement: one snapshot.
SELECT g.name, t.name, p.partition, o.next_offset, p.next_offset
FROM {schema}.log_groups g
LEFT JOIN ({schema}.log_group_offsets o
           JOIN {schema}.log_partitions p ON p.id = o.partition_id
           JOIN {schema}.log_topics t ON t.id = p.topic_id) ON o.group_id = g.id
WHERE %(names)s::text[] IS NULL OR g.name = ANY(%(names)s::text[])
ORDER BY g.name, t.name, p.partition;

-- name: log_group_lock
-- A consumer group's id, its row locked until the transaction ends: a consumer joining the
-- group meanwhile (log_member_register) or committing (log_commit) waits for it, through their
-- foreign keys. No row: the log has no such group.
SELECT id FROM {schema}.log_groups WHERE name = %(name)s FOR UPDATE;

-- name: log_group_members
-- The backend pids of a group's members (live ones, after log_members_forget_dead).
SELECT backend_pid FROM {schema}.log_members WHERE group_id = %(group_id)s ORDER BY backend_pid;

-- name: log_forget_group
-- Forget a consumer group: its offsets (and member rows) go with it, and no longer hold back
-- retention.
DELETE FROM {schema}.log_groups WHERE name = %(name)s RETURNING id;

-- name: log_count
-- How many records the log keeps, in all topics.
SELECT count(*) FROM {schema}.log_records;

-- name: log_count_topic
-- How many records the log keeps of one topic.
SELECT count(*) FROM {schema}.log_records r JOIN {schema}.log_partitions p
ON p.id = r.partition_id JOIN {schema}.log_topics t ON t.id = p.topic_id
WHERE t.name = %(topic)s;
