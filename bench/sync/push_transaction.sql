-- pgbench: the server's push without the server (informational reference): begin, scope,
-- one statement that moves the user's cursor (the row lock) and inserts 100 rows into
-- events itself (the users check, a trigger run once per statement since migration 0011,
-- row-level security, 100 distinct jsonb values to parse),
-- commit, then the notification in its own transaction; one pipeline, as trunk_sync_app.
-- One user per client (no lock waits), like the push measurement. Users
-- 00000000-0000-4000-8000-0000000000NN exist.
\set u :client_id % :users + 1
\startpipeline
begin;
select set_config('app.user_id', '00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'), true);
with cursor as (
  update users
     set last_seq = last_seq + 100,
         last_event_at = greatest(date_trunc('milliseconds', clock_timestamp()),
                                  coalesce(last_event_at + interval '1 millisecond', '-infinity'::timestamptz))
                         + 99 * interval '1 millisecond'
   where id = ('00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'))::uuid
  returning id, last_seq - 100 as base_seq, last_event_at - 99 * interval '1 millisecond' as base_at
), stored as (
  insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
  select cursor.id, cursor.base_seq + n, 'sprout_planted',
         ('{"plant":"fern","bed":3,"x":12.5,"y":7,"tags":["shade","wet"],"note":"watered after the rain ' || n || '"}')::jsonb,
         gen_random_uuid(), timestamptz '2026-11-22 04:10:02.123+00',
         cursor.base_at + (n - 1) * interval '1 millisecond'
  from cursor, generate_series(1, 100) n
)
select base_seq from cursor;
commit;
select set_config('synchronous_commit', 'off', true), pg_notify('trunk_sync_events', '00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'));
\endpipeline
