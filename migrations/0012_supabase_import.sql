-- Verify-only public keys of another issuer (`trunk-sync keys import-jwks FILE`): a hosted
-- Supabase project on asymmetric keys publishes its JWKS; importing it keeps the access
-- tokens that project issued valid here until they expire, with TRUNK_SYNC_ACCEPTED_ISSUERS
-- naming its issuer. Public keys only: nothing here can sign. Servers re-read this table
-- with the signing keys, every 60 seconds.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
create table imported_keys (
  kid         text primary key,
  algorithm   text not null check (algorithm in ('ES256', 'RS256')),
  public_jwk  jsonb not null check (jsonb_typeof(public_jwk) = 'object'),
  created_at  timestamptz not null default now(),
  retired_at  timestamptz                -- set by `keys retire KID`: no longer verifies
);

grant select on imported_keys to trunk_sync_app;

-- `trunk-sync import supabase`: how many of each user's source events an import has read
-- (imported, already there or rejected), committed with each batch, so a re-run reads only
-- the users whose source count differs (new events, or a run stopped half-way). The
-- owner's bookkeeping: the server neither reads nor writes it.
create table supabase_import_progress (
  user_id     uuid primary key,
  events_seen bigint not null,
  updated_at  timestamptz not null default now()
);
