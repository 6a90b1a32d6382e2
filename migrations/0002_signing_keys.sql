-- ES256 signing keys for access tokens (managed with `trunk-sync keys list|add|retire`).
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- Without any row here, tokens are HS256 with TRUNK_SYNC_JWT_SECRET, as before. Every
-- non-retired key verifies tokens and is published in /auth/v1/.well-known/jwks.json;
-- the newest one that has been published long enough signs new tokens. Servers re-read
-- this table every 60 seconds.
--
-- PRIVATE KEYS ARE STORED IN THE DATABASE, unencrypted (PKCS#8 PEM): anyone who can read
-- this table or a backup of it can mint access tokens for any user until the key is
-- retired. Protect backups and replicas like the JWT secret.
create table signing_keys (
  kid         text primary key,          -- RFC 7638 thumbprint of the public key
  algorithm   text not null check (algorithm = 'ES256'),
  private_key text not null,             -- PKCS#8 PEM
  public_jwk  jsonb not null,            -- the JWK published in jwks.json (no private part)
  created_at  timestamptz not null default now(),
  retired_at  timestamptz                -- set by `keys retire`: no longer verifies
);

-- The server only reads keys; the operator's `trunk-sync keys` (the migrating user) writes.
grant select on signing_keys to trunk_sync_app;
