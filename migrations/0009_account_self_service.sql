-- Account self-service: a signed-in user confirms with a mailed code and deletes their account.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- POST /auth/v1/reauthenticate mails a fresh 6-digit code to the signed-in user; DELETE
-- /sync/v1/account takes it. The codes follow the sign-in codes' rules (HMAC only, expiry,
-- single use, wrong guesses per code and per hour, lock) but live apart from them, keyed by
-- the user, so that asking for a sign-in code on another device does not replace the
-- confirmation the user is about to type, and a sign-in code never confirms a deletion.
create table reauthentication_codes (
  user_id        uuid primary key references users (id) on delete cascade,
  code_hash      bytea not null,              -- HMAC-SHA-256 of the code with a server key
  created_at     timestamptz not null default now(),
  expires_at     timestamptz not null,
  attempts       integer not null default 0,  -- wrong guesses at this code
  consumed_at    timestamptz,
  failures       integer not null default 0,  -- refused confirmations in the window, across codes
  failures_since timestamptz,
  locked_until   timestamptz
);

alter table reauthentication_codes enable row level security;
alter table reauthentication_codes force row level security;
create policy reauthentication_codes_owner on reauthentication_codes
  using (user_id = nullif(current_setting('app.user_id', true), '')::uuid)
  with check (user_id = nullif(current_setting('app.user_id', true), '')::uuid);
create policy reauthentication_codes_admin on reauthentication_codes to trunk_sync_admin using (true) with check (true);
grant select, insert, update, delete on reauthentication_codes to trunk_sync_app;

-- The server deletes the account of the user its transaction names (the users_owner policy
-- of 0005 limits it to that row). Sessions, refresh tokens, events and the confirmation code
-- go by cascade: foreign-key actions run as the tables' owner, so the server's role still
-- cannot delete an event itself (the log stays append-only for it), and the sessions'
-- delete trigger (0004) records and announces every session the deletion ends.
grant delete on users to trunk_sync_app;

-- At most one export per user at a time, across instances: a lease the exporting instance
-- renews with every page it reads and removes at the end; a lease not renewed for a minute
-- (its instance died) may be taken over.
create table account_exports (
  user_id     uuid primary key references users (id) on delete cascade,
  lease       uuid not null,
  renewed_at  timestamptz not null default now()
);
alter table account_exports enable row level security;
alter table account_exports force row level security;
create policy account_exports_owner on account_exports
  using (user_id = nullif(current_setting('app.user_id', true), '')::uuid)
  with check (user_id = nullif(current_setting('app.user_id', true), '')::uuid);
create policy account_exports_admin on account_exports to trunk_sync_admin using (true) with check (true);
grant select, insert, update, delete on account_exports to trunk_sync_app;
