-- Revoked sessions, so that their access tokens stop working on every instance at once.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- Access tokens are verified without the database. Each server keeps the sessions revoked
-- while their tokens may still be valid in memory, fed by notifications on
-- `trunk_sync_revocations` and reloaded from `session_revocations` whenever its listener
-- (re)connects. Triggers write both, so every way a session ends — sign-out, refresh token
-- reuse, `trunk-sync users delete` (sessions go by cascade), an operator's SQL — counts.

-- The expiry of the newest access token issued for the session (written with each one): a
-- revocation matters until then, and no longer.
alter table sessions add column access_expires_at timestamptz;

create table session_revocations (
  session_id uuid primary key,
  user_id    uuid not null,
  revoked_at timestamptz not null default now(),
  expires_at timestamptz not null  -- the session's last access token expires then; the row is kept a little longer
);
create index session_revocations_expires_at_idx on session_revocations (expires_at);

-- Security definer, so the server's role needs no write access to the table: it cannot
-- forge or remove revocations. Fixed search path, objects qualified.
create function trunk_sync_session_revoked() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  ended public.sessions;
  expires timestamptz;
begin
  if tg_op = 'DELETE' then ended := old; else ended := new; end if;
  -- Sessions from before this migration have no recorded expiry: their tokens were issued
  -- at the last refresh at the latest, and live at most 7 days (the longest JWT expiry).
  expires := coalesce(ended.access_expires_at, coalesce(ended.refreshed_at, ended.created_at) + interval '7 days');
  insert into public.session_revocations (session_id, user_id, expires_at)
  values (ended.id, ended.user_id, expires)
  on conflict (session_id) do nothing;
  -- Delivered at commit: "<session id> <user id> <expiry, Unix seconds>".
  perform pg_notify('trunk_sync_revocations',
    ended.id::text || ' ' || ended.user_id::text || ' ' || floor(extract(epoch from expires))::bigint::text);
  -- Rows whose tokens are long dead serve nothing (the index keeps this cheap).
  delete from public.session_revocations where expires_at < now() - interval '1 hour';
  return null;
end
$$;

create trigger sessions_revoked after update of revoked_at on sessions for each row
  when (old.revoked_at is null and new.revoked_at is not null)
  execute function trunk_sync_session_revoked();
create trigger sessions_deleted after delete on sessions for each row
  when (old.revoked_at is null)
  execute function trunk_sync_session_revoked();

-- The server reads revocations (at start and after reconnecting); only the trigger writes.
grant select on session_revocations to trunk_sync_app;
