-- Row-level security on every table that holds a user's rows: users, sessions,
-- refresh_tokens, otp_codes (events has had it since 0001).
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- The server's role (trunk_sync_app, or the login role `migrate` makes a member of it) sees
-- a row only when its transaction names the row's owner. The server sets these per
-- transaction with set_config(…, true), so they end with it; unset, they match nothing:
--
--   app.user_id             a user's id: their users row, sessions, refresh tokens, events.
--                           Every route that has a signed-in caller scopes by it.
--   app.email               a normalised address: that address's users row and sign-in code.
--                           Sign-in (POST /otp, /verify, `trunk-sync token`) must find a user
--                           by address before it knows the id; it then scopes by the id too.
--   app.refresh_token_hash  hex SHA-256 of a refresh token: that one token row. POST /token
--                           knows only the token; it reads the token's user_id through this,
--                           then scopes by that id (the session, the new token, the user).
--
-- So a query of the server that forgot its own filter, or a session with nothing set, reads
-- and writes nothing of anyone; with a user's id set, only that user's rows. The server's
-- queries still filter by user themselves: this is the second wall.
--
-- Query by query (what each needs, and which setting gives it):
--   /otp     otp_codes by email, users by lower(email), upsert otp_codes     app.email
--   /verify  otp_codes by email (for update), upsert users by lower(email)   app.email
--            then insert sessions, refresh_tokens for the user's id          app.user_id
--   /token   refresh_tokens by token_hash                                    app.refresh_token_hash
--            then sessions, refresh_tokens, users of that user               app.user_id
--   /logout, /user, PUT /user, /sync/v1, /rest/v1 (events, profiles = users) app.user_id
--   /readyz  schema_migrations (no user rows)
--   rate limits: rate_limits holds counters per IP and deployment, no user's rows and
--   nothing a user wrote, shared by every request: it stays without row-level security.
--
-- Forced, so the policies hold for the tables' owner as well; superusers (and BYPASSRLS
-- roles) always bypass them, which is why the server must not log in as one (serve warns).
-- The owner's own tools (`trunk-sync users`, run with the migration URL) read everything
-- through the role trunk_sync_admin, which `migrate` grants to the migrating user.

do $$
begin
  if not exists (select from pg_roles where rolname = 'trunk_sync_admin') then
    create role trunk_sync_admin nologin;
  end if;
end
$$;
do $$
begin
  if not pg_has_role(current_user, 'trunk_sync_admin', 'MEMBER') then
    execute format('grant trunk_sync_admin to %I', current_user);
  end if;
end
$$;

alter table users enable row level security;
alter table users force row level security;
create policy users_owner on users
  using (id = nullif(current_setting('app.user_id', true), '')::uuid
         or lower(email) = nullif(current_setting('app.email', true), ''))
  with check (id = nullif(current_setting('app.user_id', true), '')::uuid
              or lower(email) = nullif(current_setting('app.email', true), ''));

alter table sessions enable row level security;
alter table sessions force row level security;
create policy sessions_owner on sessions
  using (user_id = nullif(current_setting('app.user_id', true), '')::uuid)
  with check (user_id = nullif(current_setting('app.user_id', true), '')::uuid);

alter table refresh_tokens enable row level security;
alter table refresh_tokens force row level security;
-- Found by its hash alone (to learn whose it is), but written only for the scoped user.
create policy refresh_tokens_owner on refresh_tokens
  using (user_id = nullif(current_setting('app.user_id', true), '')::uuid
         or token_hash = decode(nullif(current_setting('app.refresh_token_hash', true), ''), 'hex'))
  with check (user_id = nullif(current_setting('app.user_id', true), '')::uuid);

-- Codes belong to an address, not (yet) to a user: a first sign-in has no user row.
alter table otp_codes enable row level security;
alter table otp_codes force row level security;
create policy otp_codes_address on otp_codes
  using (email = nullif(current_setting('app.email', true), ''))
  with check (email = nullif(current_setting('app.email', true), ''));

-- The owner's tools see and change every row (listing, exporting and deleting users).
create policy users_admin on users to trunk_sync_admin using (true) with check (true);
create policy sessions_admin on sessions to trunk_sync_admin using (true) with check (true);
create policy refresh_tokens_admin on refresh_tokens to trunk_sync_admin using (true) with check (true);
create policy otp_codes_admin on otp_codes to trunk_sync_admin using (true) with check (true);
create policy events_admin on events to trunk_sync_admin using (true) with check (true);
