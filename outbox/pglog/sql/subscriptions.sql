-- The subscriptions of `outbox serve` (docs/http.md, docs/decisions/0023): a named reader of
-- one topic, its position a consumer group's (log_groups, log_group_offsets), its clients
-- taking a partition's next records under a lease (log_subscription_leases).

-- name: sub_topic
-- A topic's id; no row: the log has no such topic.
SELECT id FROM {schema}.log_topics WHERE name = %(topic)s;

-- name: sub_find
-- The group of a topic's subscription; no row: none of that name.
SELECT s.group_id FROM {schema}.log_subscriptions s
JOIN {schema}.log_topics t ON t.id = s.topic_id
WHERE t.name = %(topic)s AND s.name = %(name)s;

-- name: sub_group_create
-- The group of a new subscription; no row: a group of that name exists already.
INSERT INTO {schema}.log_groups (name) VALUES (%(group)s)
ON CONFLICT (name) DO NOTHING
RETURNING id;

-- name: sub_create
-- The subscription's row, and its position in every partition of the topic: its end
-- (`earliest` false: from the point of subscription) or the earliest record kept. A position
-- is stored at once, so retention never deletes what the subscription has not read.
WITH sub AS (
    INSERT INTO {schema}.log_subscriptions (group_id, topic_id, name)
    VALUES (%(group_id)s, %(topic_id)s, %(name)s)
    RETURNING group_id, topic_id
)
INSERT INTO {schema}.log_group_offsets (group_id, partition_id, next_offset)
SELECT sub.group_id, p.id,
       CASE WHEN %(earliest)s
            THEN COALESCE((SELECT min(r.log_offset) FROM {schema}.log_records r
                           WHERE r.partition_id = p.id AND r.log_offset < p.next_offset),
                          p.next_offset)
            ELSE p.next_offset END
FROM sub JOIN {schema}.log_partitions p ON p.topic_id = sub.topic_id;

-- name: sub_delete
-- Forget a subscription: its group, position and leases go (the place is lost) and no longer
-- hold back retention.
DELETE FROM {schema}.log_groups
WHERE id = (SELECT s.group_id FROM {schema}.log_subscriptions s
            JOIN {schema}.log_topics t ON t.id = s.topic_id
            WHERE t.name = %(topic)s AND s.name = %(name)s)
RETURNING id;

-- name: sub_lease_lock
-- Lock the leases of a subscription (all, or those of one cursor), in partition order, before
-- an unsubscribe deletes its group or an acknowledgement updates them: a client holds the
-- leases it took while it writes rows that reference the group, so a delete that locked the
-- group first and then waited for a lease deadlocked with it, and two statements locking
-- leases in their scan's orders could too. Taking them in one order makes them wait instead.
SELECT 1 FROM {schema}.log_subscription_leases
WHERE group_id = %(group_id)s AND (CAST(%(cursor)s AS uuid) IS NULL OR cursor = %(cursor)s)
ORDER BY partition_id
FOR UPDATE;

-- name: sub_positions
-- A position at 0 in each partition of the subscription's topic it has none in (partitions
-- added after it was made), so that retention keeps their records for it too; then a free
-- lease row for each partition that has none (sub_lease_rows). Both insert only rows not seen, in partition
-- order: two clients inserting the same rows wait for each other in one order, never in a
-- cycle, and none waits for a row that exists (`sub_lease_take` locks those without waiting).
INSERT INTO {schema}.log_group_offsets (group_id, partition_id, next_offset)
SELECT s.group_id, p.id, 0
FROM {schema}.log_subscriptions s
JOIN {schema}.log_partitions p ON p.topic_id = s.topic_id
WHERE s.group_id = %(group_id)s
  AND NOT EXISTS (SELECT 1 FROM {schema}.log_group_offsets o
                  WHERE o.group_id = s.group_id AND o.partition_id = p.id)
ORDER BY p.id
ON CONFLICT (group_id, partition_id) DO NOTHING;

-- name: sub_lease_rows
-- (see sub_positions) A free lease row for each partition of the subscription that has none.
INSERT INTO {schema}.log_subscription_leases
    (group_id, partition_id, cursor, first_offset, next_offset, until)
SELECT s.group_id, p.id, gen_random_uuid(), 0, 0, '-infinity'
FROM {schema}.log_subscriptions s
JOIN {schema}.log_partitions p ON p.topic_id = s.topic_id
WHERE s.group_id = %(group_id)s
  AND NOT EXISTS (SELECT 1 FROM {schema}.log_subscription_leases l
                  WHERE l.group_id = s.group_id AND l.partition_id = p.id)
ORDER BY p.id
ON CONFLICT (group_id, partition_id) DO NOTHING;

-- name: sub_candidates
-- The partitions of a subscription with records past its position and no live lease, in a
-- random order (so that clients spread over them): (partition id, partition, position, end).
-- A partition added after the subscription was made has no position: it is read from 0.
SELECT p.id, p.partition, COALESCE(o.next_offset, 0), p.next_offset
FROM {schema}.log_subscriptions s
JOIN {schema}.log_partitions p ON p.topic_id = s.topic_id
LEFT JOIN {schema}.log_group_offsets o ON o.group_id = s.group_id AND o.partition_id = p.id
LEFT JOIN {schema}.log_subscription_leases l
  ON l.group_id = s.group_id AND l.partition_id = p.id
WHERE s.group_id = %(group_id)s AND COALESCE(o.next_offset, 0) < p.next_offset
  AND (l.until IS NULL OR l.until < now())
ORDER BY random();

-- name: sub_lease_take
-- Take a partition's lease unless a client holds a live one, or another transaction is taking
-- or acknowledging it this moment (SKIP LOCKED): a client never waits for another here, so
-- clients taking partitions in different orders cannot deadlock. One row: taken.
UPDATE {schema}.log_subscription_leases l
SET cursor = %(cursor)s, first_offset = 0, next_offset = 0,
    until = now() + make_interval(secs => %(lease)s)
FROM (SELECT f.group_id, f.partition_id FROM {schema}.log_subscription_leases f
      WHERE f.group_id = %(group_id)s AND f.partition_id = %(partition_id)s
        AND f.until < now()
      FOR UPDATE SKIP LOCKED) free
WHERE l.group_id = free.group_id AND l.partition_id = free.partition_id
RETURNING 1;

-- name: sub_fetch
-- The next records of a partition from the subscription's position (read now: the client
-- that held the lease before may have acknowledged meanwhile), in offset order, at most
-- `limit`; only offsets below the partition's counter are records (as log_fetch).
SELECT r.log_offset, r.key, r.value, r.headers
FROM {schema}.log_records r
WHERE r.partition_id = %(partition_id)s
  AND r.log_offset >= COALESCE(
      (SELECT o.next_offset FROM {schema}.log_group_offsets o
       WHERE o.group_id = %(group_id)s AND o.partition_id = %(partition_id)s), 0)
  AND r.log_offset < (SELECT p.next_offset FROM {schema}.log_partitions p
                      WHERE p.id = %(partition_id)s)
ORDER BY r.log_offset
LIMIT %(limit)s;

-- name: sub_lease_set
-- What a lease handed out: the records [first_offset, next_offset).
UPDATE {schema}.log_subscription_leases
SET first_offset = %(first)s, next_offset = %(next)s
WHERE group_id = %(group_id)s AND partition_id = %(partition_id)s;

-- name: sub_lease_drop
-- Give a lease back unused (the partition had no record to hand out): free at once, under a
-- cursor no client has.
UPDATE {schema}.log_subscription_leases
SET cursor = gen_random_uuid(), until = '-infinity'
WHERE group_id = %(group_id)s AND partition_id = %(partition_id)s AND cursor = %(cursor)s;

-- name: sub_ack
-- Acknowledge the records handed out under `cursor`: the subscription's position moves past
-- them (never backwards) and the leases end. Returns how many leases it ended: none when the
-- cursor is unknown, or its lease ran out and the records were handed out again.
WITH acked AS (
    UPDATE {schema}.log_subscription_leases
    SET cursor = gen_random_uuid(), until = '-infinity'
    WHERE group_id = %(group_id)s AND cursor = %(cursor)s
    RETURNING partition_id, next_offset
), moved AS (
    INSERT INTO {schema}.log_group_offsets AS o (group_id, partition_id, next_offset)
    SELECT %(group_id)s, partition_id, next_offset FROM acked
    ON CONFLICT (group_id, partition_id) DO UPDATE
    SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset), updated_at = now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM acked), (SELECT count(*) FROM moved);

-- name: sub_lag
-- A subscription's position in each partition of its topic against the partition's end, and
-- whether a client holds a live lease there: (partition, position, end, leased).
SELECT p.partition, COALESCE(o.next_offset, 0), p.next_offset,
       COALESCE(l.until >= now(), false)
FROM {schema}.log_subscriptions s
JOIN {schema}.log_partitions p ON p.topic_id = s.topic_id
LEFT JOIN {schema}.log_group_offsets o ON o.group_id = s.group_id AND o.partition_id = p.id
LEFT JOIN {schema}.log_subscription_leases l
  ON l.group_id = s.group_id AND l.partition_id = p.id
WHERE s.group_id = %(group_id)s
ORDER BY p.partition;

-- name: sub_list
-- The subscriptions of a topic and the records each has yet to read: (name, lag).
SELECT s.name,
       COALESCE(sum(GREATEST(p.next_offset - COALESCE(o.next_offset, 0), 0)), 0)
FROM {schema}.log_subscriptions s
JOIN {schema}.log_topics t ON t.id = s.topic_id
LEFT JOIN {schema}.log_partitions p ON p.topic_id = s.topic_id
LEFT JOIN {schema}.log_group_offsets o ON o.group_id = s.group_id AND o.partition_id = p.id
WHERE t.name = %(topic)s
GROUP BY s.name
ORDER BY s.name;

-- name: sub_listeners_forget_dead
-- Listeners whose session is gone (a server killed) leave their row behind: drop it, so that
-- it does not make every append NOTIFY (as log_members_forget_dead).
DELETE FROM {schema}.log_listeners l
WHERE NOT EXISTS (
    SELECT 1 FROM pg_stat_activity a
    WHERE a.pid = l.backend_pid
      AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND (a.backend_start = l.backend_start OR a.backend_start IS NULL
           OR l.backend_start IS NULL)
);

-- name: sub_listener_register
-- This session listens for appends: publishers NOTIFY while its row is here.
INSERT INTO {schema}.log_listeners (backend_pid, backend_start)
SELECT pg_backend_pid(), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())
ON CONFLICT (backend_pid) DO UPDATE SET backend_start = EXCLUDED.backend_start, since = now();

-- name: sub_listener_unregister
DELETE FROM {schema}.log_listeners WHERE backend_pid = pg_backend_pid();
