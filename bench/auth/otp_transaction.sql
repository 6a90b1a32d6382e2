-- bench/auth's reference for POST /auth/v1/otp: the statements the route runs for a new
-- address (AuthRoutes.otp: the per-client limit, the per-address limit, then
-- AuthService.requestCode with OneTimeCodes and RateLimiter), in the same three
-- transactions, run by pgbench as trunk_sync_app (PGOPTIONS=-c role=trunk_sync_app).
-- Variables: -D clients=C -D base=B -D i=0 -D expires=EPOCH (unused here); each client takes
-- the addresses pgo<base + client_id + k * clients>@bench.example, k = 1, 2, …, and its
-- per-client bucket is the loopback address the driver's connection of that number uses.
-- What differs from the server: values are text parameters cast in SQL instead of binary
-- binds, the code's HMAC is 32 bytes made from the number, and no mail is handed over.
\set i :i + 1
\set n :base + :client_id + :i * :clients
BEGIN;
with window_start as (
  select to_timestamp(floor(extract(epoch from now()) / 300::int8) * 300::int8) as at
)
insert into rate_limits (bucket, window_start, hits)
select 'ip:' || 'otp:127.0.0.' || (2 + :client_id::int % 50), at, 1 from window_start
on conflict (bucket, window_start) do update set hits = rate_limits.hits + 1
returning hits, ceil(extract(epoch from window_start + make_interval(secs => 300::int8) - now()))::int8 as remaining
\gset
\if :hits % 100 = 0
delete from rate_limits where window_start < now() - interval '1 day';
\endif
COMMIT;
BEGIN;
with window_start as (
  select to_timestamp(floor(extract(epoch from now()) / 3600::int8) * 3600::int8) as at
)
insert into rate_limits (bucket, window_start, hits)
select 'email:' || 'otp:' || lpad(to_hex(:n::int8), 64, '0'), at, 1 from window_start
on conflict (bucket, window_start) do update set hits = rate_limits.hits + 1
returning hits, ceil(extract(epoch from window_start + make_interval(secs => 3600::int8) - now()))::int8 as remaining
\gset
\if :hits % 100 = 0
delete from rate_limits where window_start < now() - interval '1 day';
\endif
COMMIT;
BEGIN;
select set_config('app.email', 'pgo' || :n::int8 || '@bench.example', true);
select ceil(extract(epoch from created_at + make_interval(secs => 60::int8) - now()))::int8 from otp_codes
where email = 'pgo' || :n::int8 || '@bench.example' and created_at > now() - make_interval(secs => 60::int8);
select id from users where email = 'pgo' || :n::int8 || '@bench.example';
with window_start as (
  select to_timestamp(floor(extract(epoch from now()) / 3600::int8) * 3600::int8) as at
)
insert into rate_limits (bucket, window_start, hits)
select 'mail:' || 'global', at, 1 from window_start
on conflict (bucket, window_start) do update set hits = rate_limits.hits + 1
returning hits, ceil(extract(epoch from window_start + make_interval(secs => 3600::int8) - now()))::int8 as remaining
\gset
\if :hits % 100 = 0
delete from rate_limits where window_start < now() - interval '1 day';
\endif
insert into otp_codes (email, code_hash, created_at, expires_at, attempts, consumed_at)
values ('pgo' || :n::int8 || '@bench.example', decode(lpad(to_hex(:n::int8), 64, '0'), 'hex'), now(),
        now() + make_interval(secs => 3600::int8), 0, null)
on conflict (email) do update set code_hash = excluded.code_hash, created_at = excluded.created_at,
  expires_at = excluded.expires_at, attempts = 0, consumed_at = null;
COMMIT;
