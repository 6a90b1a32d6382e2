-- pgbench: the write ceiling. One 100-row insert (its own transaction, so one commit and
-- WAL flush per 100 rows, like a push) into a copy of events with the same indexes
-- (primary key, (user_id, client_id), (user_id, seq), (user_id, created_at)). No foreign
-- key, no row-level security, no user row lock: those belong to the push being measured.
-- Each row's payload is a text parsed into jsonb for that row, as each of a push's 100
-- payloads is: until session 20 it was one constant, parsed once when the statement was
-- prepared, so the ceiling stored 100 copies of a value it never had to read
-- (bench/README.md, "the push ceiling parses each row's payload").
\set u random(1, :users)
insert into bench_events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
select ('00000000-0000-4000-8000-' || lpad(:u::text, 12, '0'))::uuid, nextval('bench_seq'), 'sprout_planted',
       ('{"plant":"fern","bed":3,"x":12.5,"y":7,"tags":["shade","wet"],"note":"watered after the rain ' || n || '"}')::jsonb,
       gen_random_uuid(), timestamptz '2026-11-22 04:10:02.123+00',
       date_trunc('milliseconds', clock_timestamp()) + n * interval '1 millisecond'
from generate_series(1, 100) n;
