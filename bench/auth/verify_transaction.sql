-- bench/auth's reference for POST /auth/v1/verify: the statements the route runs for a
-- right code of a new address (AuthRoutes.verify: the per-client limit, the per-address
-- limit, then AuthService.verify: OneTimeCodes.check, the users upsert, the session and its
-- refresh token), in the same three transactions, run by pgbench as trunk_sync_app.
-- Variables: -D clients=C -D base=B -D i=0 -D expires=EPOCH (the access token's expiry);
-- each client takes the addresses pgv<base + client_id + k * clients>@bench.example, whose
-- codes run.sh stored beforehand. Differences from the server as in otp_transaction.sql.
\set i :i + 1
\set n :base + :client_id + :i * :clients
BEGIN;
with window_start as (
  select to_timestamp(floor(extract(epoch from now()) / 300::int8) * 300::int8) as at
)
insert into rate_limits (bucket, window_start, hits)
select 'ip:' || 'verify:127.0.0.' || (2 + :client_id::int % 50), at, 1 from window_start
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
select 'email:' || 'verify:' || lpad(to_hex(:n::int8), 64, '0'), at, 1 from window_start
on conflict (bucket, window_start) do update set hits = rate_limits.hits + 1
returning hits, ceil(extract(epoch from window_start + make_interval(secs => 3600::int8) - now()))::int8 as remaining
\gset
\if :hits % 100 = 0
delete from rate_limits where window_start < now() - interval '1 day';
\endif
COMMIT;
BEGIN;
select set_config('app.email', 'pgv' || :n::int8 || '@bench.example', true);
select code_hash, expires_at > now(), attempts, consumed_at is null,
       coalesce(locked_until > now(), false), locked_until is not null,
       failures, failures_since is null or failures_since <= now() - make_interval(secs => 3600::int8)
from otp_codes where email = 'pgv' || :n::int8 || '@bench.example' for update;
update otp_codes set consumed_at = now(), failures = 0, failures_since = null, locked_until = null
where email = 'pgv' || :n::int8 || '@bench.example';
insert into users (email, email_confirmed_at, last_sign_in_at) values ('pgv' || :n::int8 || '@bench.example', now(), now())
on conflict ((lower(email))) do update set last_sign_in_at = now(), updated_at = now(),
  email_confirmed_at = coalesce(users.email_confirmed_at, now())
returning id as user_id, email, created_at, updated_at, email_confirmed_at, last_sign_in_at, full_name, user_metadata
\gset
select set_config('app.user_id', :user_id, true);
insert into sessions (user_id, ip, user_agent, access_expires_at)
values (:user_id, '127.0.0.' || (2 + :client_id::int % 50), 'trunk-sync-bench-auth', to_timestamp(:expires::int8))
returning id as session_id
\gset
insert into refresh_tokens (session_id, user_id, token_hash)
values (:session_id, :user_id, decode('ff' || lpad(to_hex(:n::int8), 62, '0'), 'hex'));
COMMIT;
