-- bench/auth's reference for POST /auth/v1/token?grant_type=refresh_token: the statements
-- the route runs for a live token (AuthRoutes.token: the per-client limit, then
-- AuthService.refresh: the token's scope, the token and its session locked, the rotation,
-- the new token, the session's expiry, the user), in the same two transactions, run by
-- pgbench as trunk_sync_app. Variables: -D clients=C -D base=B -D i=0 -D expires=EPOCH.
-- Each client rotates one session's tokens as a client app does: token number
-- base + client_id + k * clients is exchanged for number base + client_id + (k + 1) * clients
-- (run.sh stores each client's first token, k = 0). A token's hash is its number, 32 bytes.
\set i :i + 1
\set n :base + :client_id + (:i - 1) * :clients
\set next :n + :clients
BEGIN;
with window_start as (
  select to_timestamp(floor(extract(epoch from now()) / 300::int8) * 300::int8) as at
)
insert into rate_limits (bucket, window_start, hits)
select 'ip:' || 'token:127.0.0.' || (2 + :client_id::int % 50), at, 1 from window_start
on conflict (bucket, window_start) do update set hits = rate_limits.hits + 1
returning hits, ceil(extract(epoch from window_start + make_interval(secs => 300::int8) - now()))::int8 as remaining
\gset
\if :hits % 100 = 0
delete from rate_limits where window_start < now() - interval '1 day';
\endif
COMMIT;
BEGIN;
select set_config('app.refresh_token_hash', lpad(to_hex(:n::int8), 64, '0'), true);
select set_config('app.user_id',
  coalesce((select user_id::text from refresh_tokens where token_hash = decode(lpad(to_hex(:n::int8), 64, '0'), 'hex')), ''), true);
select t.id as token_id, t.session_id, t.user_id, t.revoked_at is not null or s.revoked_at is not null as revoked,
       t.rotated_at is not null as rotated, coalesce(extract(epoch from now() - t.rotated_at), 0)::float8 as age
from refresh_tokens t join sessions s on s.id = t.session_id
where t.token_hash = decode(lpad(to_hex(:n::int8), 64, '0'), 'hex') for update of t, s
\gset
update refresh_tokens set rotated_at = now() where id = :token_id;
insert into refresh_tokens (session_id, user_id, token_hash, parent_id)
values (:session_id, :user_id, decode(lpad(to_hex(:next::int8), 64, '0'), 'hex'), :token_id);
update sessions set refreshed_at = now(), updated_at = now(),
  access_expires_at = greatest(access_expires_at, to_timestamp(:expires::int8))
where id = :session_id;
select id, email, created_at, updated_at, email_confirmed_at, last_sign_in_at, full_name, user_metadata
from users where id = :user_id;
COMMIT;
