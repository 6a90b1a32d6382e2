-- The operator console (GET /console/ and /admin/v1 on the admin listener): its sessions,
-- and what the server's role may read and change while an operator uses it.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- Console sessions are not app sessions: an operator signs in with a code mailed to an
-- address in TRUNK_SYNC_ADMIN_EMAILS and gets an opaque token (stored here as its SHA-256)
-- that only /admin/v1 accepts; app routes accept only access tokens (JWTs), and /admin/v1
-- refuses those. Sessions are short-lived (expires_at) and ended by sign-out (revoked_at).
-- Rows past their expiry are deleted at each console sign-in, so the table stays small.
create table console_sessions (
  id          uuid primary key default gen_random_uuid(),
  email       text not null check (email = lower(email) and length(email) between 3 and 320),
  token_hash  bytea not null unique,
  created_at  timestamptz not null default now(),
  expires_at  timestamptz not null,
  revoked_at  timestamptz,
  ip          text,
  user_agent  text
);
create index console_sessions_expires_at_idx on console_sessions (expires_at);

-- No user's rows, and nothing an app user wrote: like rate_limits, without row-level
-- security. The app routes never touch it.
grant select, insert, update, delete on console_sessions to trunk_sync_app;

-- Reading across users (the user list, the overview's counts) needs a live console session:
-- the console's handlers set app.console_token_hash (hex SHA-256 of the operator's token)
-- for their transaction, and these policies let the server's role read every row of
-- users, sessions and events only while that hash names a session that is neither expired
-- nor revoked. Read only: changes to a user (revoking a session, deleting the account) run
-- scoped to that one user by app.user_id / app.email, through the owner policies of 0005.
-- Unset (every app route), the condition is false and nothing changes for the app.
create policy users_console on users for select to trunk_sync_app
  using (exists (select 1 from public.console_sessions c
                 where c.token_hash = decode(nullif(current_setting('app.console_token_hash', true), ''), 'hex')
                   and c.revoked_at is null and c.expires_at > now()));
create policy sessions_console on sessions for select to trunk_sync_app
  using (exists (select 1 from public.console_sessions c
                 where c.token_hash = decode(nullif(current_setting('app.console_token_hash', true), ''), 'hex')
                   and c.revoked_at is null and c.expires_at > now()));
create policy events_console on events for select to trunk_sync_app
  using (exists (select 1 from public.console_sessions c
                 where c.token_hash = decode(nullif(current_setting('app.console_token_hash', true), ''), 'hex')
                   and c.revoked_at is null and c.expires_at > now()));

-- Deleting an account from the console: the users row, scoped by app.user_id (policy
-- users_owner); its sessions, refresh tokens and events go by cascade, and the sessions'
-- trigger (0004) records each one as revoked and tells every instance.
grant delete on users to trunk_sync_app;
