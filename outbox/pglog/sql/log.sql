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

-- name: log_append
-- Append a batch, in one statement (one round trip, its own transaction when the session is
-- in autocommit). First the counter rows of its partitions are locked in id order (`locked`),
-- so that two publishers whose batches share partitions never deadlock. Then, all or nothing:
-- only if every partition the publisher names (`expected_ids`, distinct) still exists and is
-- still the topic and partition number it thinks (`expected_topics`, `expected_partitions`; a
-- topic or partition deleted or recreated by hand is not), gapless offsets are reserved per
-- partition through its counter row and the batch inserted there. The counter row stays locked
-- until commit, so a partition's offsets commit in order: a reader that sees offset n
-- committed sees every offset before it (no keyset trap). Within a partition the records keep
-- their order in the batch (`ord`). The records of one partition get one random append id
-- (docs/decisions/0019): with its offset it names a record for the readers, who check that the
-- record before their position is still the one they read. Wakes the subscribers that
-- announced a nap (log_members.sleeping), and the servers whose long polls wait for records
-- (log_listeners, `outbox serve`); the notification is delivered at commit. Returns how many
-- records it appended (the batch, or 0), and the (id, topic, partition) of the partitions it
-- found, for the publisher to say why it appended nothing.
WITH locked AS MATERIALIZED (
    SELECT p.id, t.name, p.partition
    FROM {schema}.log_partitions p JOIN {schema}.log_topics t ON t.id = p.topic_id
    WHERE p.id = ANY(%(expected_ids)s::int[])
    ORDER BY p.id
    FOR UPDATE OF p
), intact AS MATERIALIZED (
    SELECT count(*) = cardinality(%(expected_ids)s::int[]) AS ok
    FROM locked l
    JOIN unnest(
        %(expected_ids)s::int[], %(expected_topics)s::text[], %(expected_partitions)s::int[]
    ) AS e(id, topic, partition)
        ON e.id = l.id AND e.topic = l.name AND e.partition = l.partition
), batch AS (
    SELECT *
    FROM unnest(
        %(partition_ids)s::int[], %(keys)s::bytea[], %(values)s::bytea[], %(headers)s::bytea[]
    ) WITH ORDINALITY AS b(partition_id, key, value, headers, ord)
), counts AS (
    SELECT partition_id, count(*) AS n FROM batch GROUP BY partition_id
), reserved AS (
    UPDATE {schema}.log_partitions p SET next_offset = p.next_offset + c.n
    FROM counts c WHERE p.id = c.partition_id AND (SELECT ok FROM intact)
    RETURNING p.id, p.next_offset - c.n AS first_offset, (random() * 9.2e18)::bigint AS append_id
), appended AS (
    INSERT INTO {schema}.log_records (partition_id, log_offset, key, value, headers, append_id)
    SELECT b.partition_id,
           r.first_offset + row_number() OVER (PARTITION BY b.partition_id ORDER BY b.ord) - 1,
           b.key, b.value, b.headers, r.append_id
    FROM batch b JOIN reserved r ON r.id = b.partition_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM appended),
       (SELECT pg_notify(%(channel)s, '')
        WHERE (SELECT ok FROM intact)
          AND (EXISTS (SELECT 1 FROM {schema}.log_members WHERE sleeping)
               OR EXISTS (SELECT 1 FROM {schema}.log_listeners))) IS NOT NULL,
       (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM locked),
       (SELECT coalesce(array_agg(name ORDER BY id), '{}') FROM locked),
       (SELECT coalesce(array_agg(partition ORDER BY id), '{}') FROM locked);

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
--
-- The log going back under the member (a backup restored, the newest records deleted by
-- hand and the counter set back; docs/decisions/0019) is checked in the same statement: a
-- partition whose end is below the member's position, or whose record before the position
-- is there with another append id than the one the member read (`append_ids`; NULL: not
-- known, only the end is checked), returns no records but one row with a NULL offset and the
-- partition's end, first. A record missing there (retention, deleted by hand) is no sign.
WITH held AS (
    SELECT h.partition_id, h.position, h.ord, lp.next_offset AS end_offset,
           lp.next_offset < h.position OR (h.append_id IS NOT NULL AND EXISTS (
               SELECT 1 FROM {schema}.log_records x
               WHERE x.partition_id = h.partition_id AND x.log_offset = h.position - 1
                 AND x.append_id IS DISTINCT FROM h.append_id
           )) AS went_back
    FROM unnest(%(partition_ids)s::int[], %(positions)s::bigint[], %(append_ids)s::bigint[])
         WITH ORDINALITY AS h(partition_id, position, append_id, ord)
    JOIN {schema}.log_partitions lp ON lp.id = h.partition_id
)
SELECT h.partition_id, r.log_offset, r.key, r.value, r.headers,
       CASE WHEN isfinite(r.created_at)
            THEN CAST(floor(extract(epoch FROM r.created_at) * 1000) AS bigint) END,
       r.append_id,
       CASE WHEN h.went_back THEN h.end_offset END
FROM held h
LEFT JOIN LATERAL (
    SELECT log_offset, key, value, headers, created_at, append_id
    FROM {schema}.log_records r
    WHERE r.partition_id = h.partition_id AND r.log_offset >= h.position
      AND r.log_offset < h.end_offset AND NOT h.went_back
    ORDER BY r.log_offset
    LIMIT %(limit)s
) r ON true
WHERE h.went_back OR r.log_offset IS NOT NULL
ORDER BY h.went_back DESC, h.ord, r.log_offset
LIMIT %(limit)s;

-- name: log_went_back
-- Where a member reads again a partition that went back under it (log_fetch), and the note of
-- it for `outbox status`. The latest offset known to be the same record in the member's
-- history and in the log's: the last record it read that is still there with the append id it
-- read (`marks`: the member's last appends, as (append id, first and last offset read)), or
-- the group's committed record, when it is still there with the append id stored beside it.
-- The member reads again after it; with neither (records without append ids, or gone further
-- back than the member remembers), from the earliest record kept, as a new group starts. The
-- committed offset is set back to there when it is past it (a commit never moves a group
-- back), never forward (the member may not have stored what it read before). Returns where
-- to read from, the partition's end, the append id of the record before (NULL: none, or not
-- known), how it was found ('read', 'committed' or 'earliest') and the committed offset now.
-- No row: the partition is gone.
WITH part AS (
    SELECT id, next_offset AS end_offset FROM {schema}.log_partitions WHERE id = %(partition_id)s
), read AS (
    SELECT max(r.log_offset) AS kept
    FROM part
    CROSS JOIN unnest(%(append_ids)s::bigint[], %(firsts)s::bigint[], %(lasts)s::bigint[])
         AS m(append_id, first_offset, last_offset)
    JOIN {schema}.log_records r
      ON r.partition_id = part.id AND r.log_offset BETWEEN m.first_offset AND m.last_offset
     AND r.append_id = m.append_id
    WHERE r.log_offset < part.end_offset
), committed AS (
    SELECT o.next_offset AS kept_to
    FROM part JOIN {schema}.log_group_offsets o
      ON o.group_id = %(group_id)s AND o.partition_id = part.id
    WHERE o.last_offset = o.next_offset - 1 AND o.next_offset <= part.end_offset
      AND EXISTS (SELECT 1 FROM {schema}.log_records r
                  WHERE r.partition_id = part.id AND r.log_offset = o.last_offset
                    AND r.append_id = o.last_append_id)
), found AS (
    SELECT part.id AS partition_id, part.end_offset,
           (SELECT kept + 1 FROM read) AS after_read,
           (SELECT kept_to FROM committed) AS after_committed,
           (SELECT min(r.log_offset) FROM {schema}.log_records r
            WHERE r.partition_id = part.id AND r.log_offset < part.end_offset) AS earliest
    FROM part
), start AS (
    SELECT partition_id, end_offset,
           COALESCE(GREATEST(after_read, after_committed), earliest, end_offset) AS read_from,
           CASE WHEN after_read IS NOT NULL AND after_read >= COALESCE(after_committed, 0)
                THEN 'read'
                WHEN after_committed IS NOT NULL THEN 'committed'
                ELSE 'earliest' END AS how
    FROM found
), before AS (
    SELECT s.*,
           (SELECT r.append_id FROM {schema}.log_records r
            WHERE r.partition_id = s.partition_id AND r.log_offset = s.read_from - 1) AS append_id
    FROM start s
), noted AS (
    INSERT INTO {schema}.log_group_offsets AS o
        (group_id, partition_id, next_offset, last_offset, last_append_id, went_back,
         went_back_at, went_back_position, went_back_end, went_back_to)
    SELECT %(group_id)s, partition_id, read_from, read_from - 1, append_id, 1, now(),
           %(position)s, end_offset, read_from
    FROM before
    ON CONFLICT (group_id, partition_id) DO UPDATE
    SET next_offset = LEAST(o.next_offset, EXCLUDED.next_offset),
        last_offset = CASE WHEN EXCLUDED.next_offset < o.next_offset
                           THEN EXCLUDED.last_offset ELSE o.last_offset END,
        last_append_id = CASE WHEN EXCLUDED.next_offset < o.next_offset
                              THEN EXCLUDED.last_append_id ELSE o.last_append_id END,
        went_back = o.went_back + 1, went_back_at = now(),
        went_back_position = EXCLUDED.went_back_position,
        went_back_end = EXCLUDED.went_back_end, went_back_to = EXCLUDED.went_back_to,
        updated_at = now()
    RETURNING o.next_offset
)
SELECT read_from, end_offset, append_id, how, (SELECT next_offset FROM noted) FROM before;

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
-- other members evict this one (log_member_evict), protocol the partition locks it takes (2:
-- log_group_locks; NULL in the row of an older outbox's member, which may change it no more).
INSERT INTO {schema}.log_members
    (member_id, group_id, topics, backend_pid, backend_start, sleeping, session_timeout,
     protocol)
VALUES (%(member_id)s, %(group_id)s, %(topics)s, pg_backend_pid(),
        (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()),
        %(sleeping)s, %(session_timeout)s, %(protocol)s)
ON CONFLICT (member_id) DO UPDATE SET group_id = EXCLUDED.group_id, topics = EXCLUDED.topics,
    backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
    sleeping = EXCLUDED.sleeping, session_timeout = EXCLUDED.session_timeout,
    protocol = EXCLUDED.protocol, updated_at = now();

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

-- name: log_schema_oid
-- The log schema's OID: the upper half of the keys of its partition locks (one OID per schema
-- of a database, so two logs in one database never share a key). No such schema: an error
-- (invalid_schema_name), as any statement on the log would raise.
SELECT CAST('{schema}'::regnamespace AS oid)::bigint;

-- name: log_group_lock_ids
-- The lock ids of a group's partitions (the lower half of their lock keys; log_group_locks),
-- each made on first use: (partition id, lock id). Only missing pairs are inserted, so the
-- sequence is not spent at each look; a pair made by another member meanwhile (after this
-- statement's snapshot) is left out, and asked for again at the next look. A partition or
-- group gone has none.
WITH wanted AS (
    SELECT DISTINCT partition_id FROM unnest(%(partition_ids)s::int[]) AS w(partition_id)
), known AS (
    SELECT k.partition_id, k.lock_id
    FROM {schema}.log_group_locks k JOIN wanted w ON w.partition_id = k.partition_id
    WHERE k.group_id = %(group_id)s
), made AS (
    INSERT INTO {schema}.log_group_locks (group_id, partition_id)
    SELECT %(group_id)s, w.partition_id FROM wanted w
    WHERE w.partition_id NOT IN (SELECT partition_id FROM known)
      AND EXISTS (SELECT 1 FROM {schema}.log_partitions p WHERE p.id = w.partition_id)
      AND EXISTS (SELECT 1 FROM {schema}.log_groups g WHERE g.id = %(group_id)s)
    ON CONFLICT (group_id, partition_id) DO NOTHING
    RETURNING partition_id, lock_id
)
SELECT partition_id, lock_id FROM known
UNION ALL
SELECT partition_id, lock_id FROM made;

-- name: log_partitions_held
-- Partition ids of one group held by any session of this database: the advisory locks whose
-- bigint key (pg_locks shows it as classid = upper 32 bits, objid = lower 32 bits,
-- objsubid = 1) is the log schema's OID and a lock id of the group (log_group_locks). Also,
-- while a member of an outbox before log0004 still runs (its row has no protocol), the
-- partitions it holds by the keys of then (7 bits of the schema's crc32 and the group id
-- above, the partition id below: `old_class`, NULL when the group id cannot have one): only
-- the locks of that group's members' sessions count, so another log's keys that happen to be
-- equal do not.
WITH locks AS (
    SELECT classid::bigint AS upper_half, objid::bigint AS lower_half, pid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT k.partition_id FROM locks l
JOIN {schema}.log_group_locks k ON k.lock_id = l.lower_half AND k.group_id = %(group_id)s
WHERE l.upper_half = %(space)s
UNION
SELECT l.lower_half FROM locks l
WHERE l.upper_half = %(old_class)s
  AND l.pid IN (SELECT m.backend_pid FROM {schema}.log_members m
                WHERE m.group_id = %(group_id)s AND m.protocol IS NULL);

-- name: log_partition_lock
SELECT pg_try_advisory_lock(%(key)s::bigint);

-- name: log_partition_unlock
SELECT pg_advisory_unlock(%(key)s::bigint);

-- name: log_start_position
-- Where the group reads a partition it just took: after its last committed record, else (a
-- new group) at the earliest record retained, else after the last record ever (all deleted).
-- A new group's start is committed at once, so retention never deletes what it has not read.
-- The log may have gone back while no member held the partition (docs/decisions/0019): the
-- committed offset, as a member stored it (last_offset just before it), is past the end, or
-- the record before it is there with another append id than the one stored (if one was: NULL
-- when the member did not know it); the group then reads the partition again from the
-- earliest record retained, as a new group starts. A committed offset written by hand past
-- the end (or left from a partition recreated, or by an outbox before log0003) is reset to
-- the end, a negative one to 0. A reset is stored (a commit never moves a group
-- back, so the group would otherwise stay past the end), with the note `outbox status`
-- shows when the log was behind the group. Returns the start, the committed offset found
-- (NULL: none), the end, whether the log went back, and the append id of the record before
-- the start (NULL: none, or not known). No row: no such partition.
WITH part AS (
    SELECT p.id, p.next_offset AS end_offset, o.next_offset AS committed,
           o.last_offset = o.next_offset - 1 AS stored_by_member, o.last_append_id
    FROM {schema}.log_partitions p
    LEFT JOIN {schema}.log_group_offsets o
      ON o.group_id = %(group_id)s AND o.partition_id = p.id
    WHERE p.id = %(partition_id)s
), judged AS (
    SELECT part.*, COALESCE(stored_by_member AND (committed > end_offset OR (
               last_append_id IS NOT NULL AND EXISTS (
                   SELECT 1 FROM {schema}.log_records r
                   WHERE r.partition_id = part.id AND r.log_offset = part.committed - 1
                     AND r.append_id IS DISTINCT FROM part.last_append_id))), false)
           AS went_back
    FROM part
), start AS (
    SELECT id AS partition_id, committed, end_offset, went_back, CASE
        WHEN committed IS NOT NULL AND NOT went_back
            THEN LEAST(GREATEST(committed, 0), end_offset)
        ELSE COALESCE(
            (SELECT min(r.log_offset) FROM {schema}.log_records r
             WHERE r.partition_id = judged.id AND r.log_offset < judged.end_offset),
            end_offset)
        END AS next_offset
    FROM judged
), before AS (
    SELECT s.*,
           (SELECT r.append_id FROM {schema}.log_records r
            WHERE r.partition_id = s.partition_id AND r.log_offset = s.next_offset - 1
              AND r.log_offset < s.end_offset) AS append_id,
           went_back OR committed > end_offset AS behind
    FROM start s
), registered AS (
    INSERT INTO {schema}.log_group_offsets AS o
        (group_id, partition_id, next_offset, last_offset, last_append_id, went_back,
         went_back_at, went_back_position, went_back_end, went_back_to)
    SELECT %(group_id)s, partition_id, next_offset, next_offset - 1, append_id,
           CASE WHEN behind THEN 1 ELSE 0 END, CASE WHEN behind THEN now() END,
           CASE WHEN behind THEN committed END, CASE WHEN behind THEN end_offset END,
           CASE WHEN behind THEN next_offset END
    FROM before
    ON CONFLICT (group_id, partition_id) DO UPDATE
    SET next_offset = EXCLUDED.next_offset, last_offset = EXCLUDED.last_offset,
        last_append_id = EXCLUDED.last_append_id, updated_at = now(),
        went_back = o.went_back + EXCLUDED.went_back,
        went_back_at = COALESCE(EXCLUDED.went_back_at, o.went_back_at),
        went_back_position = COALESCE(EXCLUDED.went_back_position, o.went_back_position),
        went_back_end = COALESCE(EXCLUDED.went_back_end, o.went_back_end),
        went_back_to = COALESCE(EXCLUDED.went_back_to, o.went_back_to)
    WHERE o.next_offset <> EXCLUDED.next_offset
)
SELECT next_offset, committed, end_offset, went_back, append_id FROM before;

-- name: log_commit
-- Store a group's next offsets; never backwards (a late commit of a member that lost the
-- partition meanwhile must not make the group read again what its successor stored). The
-- subscriber commits only partitions whose lock its session holds; a partition whose row is
-- gone is skipped. Beside each offset, the append id of the record before it as the member
-- read it (NULL: not known), which the next member to take the partition checks
-- (log_start_position).
INSERT INTO {schema}.log_group_offsets AS o
    (group_id, partition_id, next_offset, last_offset, last_append_id)
SELECT %(group_id)s, c.partition_id, c.next_offset, c.next_offset - 1, c.append_id
FROM unnest(%(partition_ids)s::int[], %(next_offsets)s::bigint[], %(append_ids)s::bigint[])
     AS c(partition_id, next_offset, append_id)
JOIN {schema}.log_partitions p ON p.id = c.partition_id
ON CONFLICT (group_id, partition_id) DO UPDATE
SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
    last_offset = CASE WHEN EXCLUDED.next_offset < o.next_offset
                       THEN o.last_offset ELSE EXCLUDED.last_offset END,
    last_append_id = CASE
        WHEN EXCLUDED.next_offset < o.next_offset THEN o.last_append_id
        WHEN EXCLUDED.next_offset = o.next_offset AND o.last_offset = EXCLUDED.last_offset
            THEN COALESCE(EXCLUDED.last_append_id, o.last_append_id)
        ELSE EXCLUDED.last_append_id END,
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
-- group with no committed offset yet has one row of NULLs. One statement: one snapshot. Then
-- how often the log was found behind the group's position there, and the last time: when,
-- the group's position, the partition's end, and where the group read it again from.
SELECT g.name, t.name, p.partition, o.next_offset, p.next_offset, o.went_back,
       o.went_back_at, o.went_back_position, o.went_back_end, o.went_back_to
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
