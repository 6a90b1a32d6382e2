-- A Supabase-shaped source for bench/import: Supabase Auth's tables as far as the import
-- reads them, the cloud-sync plan's events (with its row-level security) and profiles.
-- psql variables: users, events (how many of each).
create schema auth;
create type auth.aal_level as enum ('aal1', 'aal2', 'aal3');
create function auth.uid() returns uuid language sql stable
  as $$ select nullif(current_setting('request.jwt.claim.sub', true), '')::uuid $$;
create table auth.users (
  instance_id uuid, id uuid not null primary key, aud varchar(255), role varchar(255), email varchar(255),
  encrypted_password varchar(255), email_confirmed_at timestamptz, last_sign_in_at timestamptz,
  raw_app_meta_data jsonb, raw_user_meta_data jsonb, created_at timestamptz, updated_at timestamptz,
  is_anonymous boolean not null default false);
alter table auth.users enable row level security;
create table auth.sessions (
  id uuid not null primary key, user_id uuid not null references auth.users (id) on delete cascade,
  created_at timestamptz, updated_at timestamptz, factor_id uuid, aal auth.aal_level, not_after timestamptz,
  refreshed_at timestamp, user_agent text, ip inet, tag text, refresh_token_hmac_key text, refresh_token_counter bigint);
create table auth.refresh_tokens (
  instance_id uuid, id bigserial primary key, token varchar(255) unique, user_id varchar(255), revoked bool,
  created_at timestamptz, updated_at timestamptz, parent varchar(255),
  session_id uuid references auth.sessions (id) on delete cascade);
create table public.profiles (id uuid primary key references auth.users (id) on delete cascade, full_name text);
alter table public.profiles enable row level security;
create table public.events (
  id uuid primary key default gen_random_uuid(),
  user_id uuid not null references auth.users (id) on delete cascade,
  type text not null, payload jsonb not null default '{}', client_id uuid not null,
  client_timestamp timestamptz not null, created_at timestamptz not null default now(),
  unique (user_id, client_id));
create index events_user_created on public.events (user_id, created_at);
alter table public.events enable row level security;
create policy "own events" on public.events for all using (auth.uid() = user_id) with check (auth.uid() = user_id);

insert into auth.users (id, aud, role, email, email_confirmed_at, last_sign_in_at, raw_app_meta_data, raw_user_meta_data,
                        created_at, updated_at)
select ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'authenticated', 'authenticated',
       'user' || g || '@bench.example', '2026-01-01', '2026-06-01', '{"provider":"email","providers":["email"]}',
       jsonb_build_object('full_name', 'User ' || g), '2026-01-01', '2026-01-01'
from generate_series(1, :users) g;
insert into public.profiles (id, full_name)
select id, 'Profile ' || substr(id::text, 25) from auth.users where substr(id::text, 36) in ('1', '3', '5');
insert into auth.sessions (id, user_id, created_at, updated_at, aal)
select gen_random_uuid(), id, '2026-06-01', '2026-06-01', 'aal1' from auth.users;
insert into auth.refresh_tokens (token, user_id, revoked, created_at, updated_at, session_id)
select substr(md5(s.id::text), 1, 12), s.user_id::text, false, now(), now(), s.id from auth.sessions s;
-- Journal-like events: a small object payload, spread over the users, a microsecond clock.
insert into public.events (user_id, type, payload, client_id, client_timestamp, created_at)
select ('00000000-0000-4000-8000-' || lpad(to_hex(1 + g % :users), 12, '0'))::uuid,
       (array['sprout_planted', 'sprout_watered', 'leaf_grown', 'note_written'])[1 + g % 4],
       jsonb_build_object('plant', 'p' || (g % 97), 'amount', g % 13, 'note', repeat('x', g % 40)),
       gen_random_uuid(),
       '2026-01-01'::timestamptz + g * interval '1.000123 second',
       '2026-01-01'::timestamptz + g * interval '1.000123 second'
from generate_series(1, :events) g;
vacuum analyze;
