-- trunk-sync initial schema: users, sign-in codes, sessions and refresh tokens, rate-limit
-- counters, events, and the restricted role the server's queries run as.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.

-- The role the server switches to (SET ROLE) for every query. It is not a superuser and
-- owns no table, so row-level security applies to it. Roles are cluster-wide: several
-- databases in one cluster share it.
do $$
begin
  if not exists (select from pg_roles where rolname = 'trunk_sync_app') then
    create role trunk_sync_app nologin noinherit;
  end if;
end
$$;
-- The migrating user must be able to SET ROLE to it (a no-op for superusers).
do $$
begin
  if not pg_has_role(current_user, 'trunk_sync_app', 'MEMBER') then
    execute format('grant trunk_sync_app to %I', current_user);
  end if;
end
$$;

create table users (
  id                 uuid primary key default gen_random_uuid(),
  email              text not null check (email = lower(email) and length(email) between 3 and 320),
  created_at         timestamptz not null default now(),
  updated_at         timestamptz not null default now(),
  email_confirmed_at timestamptz,
  last_sign_in_at    timestamptz,
  full_name          text,
  user_metadata      jsonb not null default '{}'::jsonb check (jsonb_typeof(user_metadata) = 'object'),
  -- Per-user cursor state: the last assigned seq and created_at, advanced under this row's
  -- lock by every push so each user's events are numbered in commit order.
  last_seq           bigint not null default 0,
  last_event_at      timestamptz
);
create unique index users_email_key on users (lower(email));

-- One live sign-in code per address; a new code replaces the previous one.
create table otp_codes (
  email       text primary key,
  code_hash   bytea not null,              -- HMAC-SHA-256 of the code with a server key
  created_at  timestamptz not null default now(),
  expires_at  timestamptz not null,
  attempts    integer not null default 0,  -- wrong guesses so far
  consumed_at timestamptz
);

create table sessions (
  id           uuid primary key default gen_random_uuid(),
  user_id      uuid not null references users (id) on delete cascade,
  created_at   timestamptz not null default now(),
  updated_at   timestamptz not null default now(),
  refreshed_at timestamptz,
  revoked_at   timestamptz,
  user_agent   text,
  ip           text,
  aal          text not null default 'aal1'
);
create index sessions_user_id_idx on sessions (user_id);

create table refresh_tokens (
  id          bigserial primary key,
  session_id  uuid not null references sessions (id) on delete cascade,
  user_id     uuid not null references users (id) on delete cascade,
  token_hash  bytea not null unique,       -- SHA-256 of the opaque token
  parent_id   bigint references refresh_tokens (id) on delete set null,
  created_at  timestamptz not null default now(),
  rotated_at  timestamptz,                 -- when it was exchanged for its successor
  revoked_at  timestamptz
);
create index refresh_tokens_session_id_idx on refresh_tokens (session_id);

-- Fixed-window counters shared by every server instance (per-IP and global limits).
create table rate_limits (
  bucket       text not null,
  window_start timestamptz not null,
  hits         integer not null default 0,
  primary key (bucket, window_start)
);

create table events (
  id               uuid primary key default gen_random_uuid(),
  user_id          uuid not null references users (id) on delete cascade,
  seq              bigint not null check (seq > 0),
  type             text not null check (length(type) between 1 and 128),
  payload          jsonb not null default '{}'::jsonb,
  client_id        uuid not null,
  client_timestamp timestamptz not null,
  created_at       timestamptz not null,
  constraint events_user_id_client_id_key unique (user_id, client_id),
  -- Also the pull index: rows come out in seq order for `seq > $cursor ... limit n`.
  constraint events_user_id_seq_key unique (user_id, seq)
);
-- For Supabase-style pulls: created_at > lastSync order by created_at.
create index events_user_id_created_at_idx on events (user_id, created_at);

-- Row-level security: a row is visible and writable only when app.user_id, set per
-- transaction by the server (set_config('app.user_id', …, true)), names its owner. Unset, it
-- matches nothing. Forced, so it holds for the table owner too (superusers still bypass it,
-- which is why the server runs as trunk_sync_app).
alter table events enable row level security;
alter table events force row level security;
create policy events_owner on events
  using (user_id = nullif(current_setting('app.user_id', true), '')::uuid)
  with check (user_id = nullif(current_setting('app.user_id', true), '')::uuid);

grant usage on schema public to trunk_sync_app;
-- /readyz compares applied migrations with the files it ships with.
grant select on schema_migrations to trunk_sync_app;
grant select, insert, update on users to trunk_sync_app;
grant select, insert, update, delete on otp_codes, sessions, refresh_tokens, rate_limits to trunk_sync_app;
grant usage, select on sequence refresh_tokens_id_seq to trunk_sync_app;
-- The log is append-only for the server: no update, no delete.
grant select, insert on events to trunk_sync_app;
