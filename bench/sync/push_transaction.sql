-- pgbench: the server's push transaction without the server (informational reference):
-- begin, scope, user row lock, a 100-row insert into events itself (foreign key, row-level
-- security, on conflict arbiter, 100 distinct jsonb values to parse), cursor update,
-- notification, commit, in one pipeline, as trunk_sync_app. One user per client (no lock
-- waits), like the push measurement. Users 00000000-0000-4000-8000-0000000000NN exist.
\set u :client_id % :users + 1
\startpipeline
begin;
select set_config('app.user_id', '00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'), true);
select last_seq, greatest(date_trunc('milliseconds', clock_timestamp()),
                          coalesce(last_event_at + interval '1 millisecond', '-infinity'::timestamptz))
from users where id = ('00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'))::uuid for update;
insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
select u.id, u.last_seq + n, 'sprout_planted',
       ('{"plant":"fern","bed":3,"x":12.5,"y":7,"tags":["shade","wet"],"note":"watered after the rain ' || n || '"}')::jsonb,
       gen_random_uuid(), timestamptz '2026-11-22 04:10:02.123+00',
       greatest(date_trunc('milliseconds', clock_timestamp()), u.last_event_at + interval '1 millisecond')
         + (n - 1) * interval '1 millisecond'
from users u, generate_series(1, 100) n
where u.id = ('00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'))::uuid
on conflict (user_id, client_id) do nothing
returning 1;
update users set last_seq = last_seq + 100,
       last_event_at = greatest(date_trunc('milliseconds', clock_timestamp()), last_event_at + interval '100 milliseconds')
where id = ('00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'))::uuid;
select pg_notify('trunk_sync_events', '00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'));
commit;
\endpipeline
