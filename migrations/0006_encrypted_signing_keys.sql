-- Private signing keys encrypted at rest, and out of the server role's reach in clear.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- private_key_sealed holds the PKCS#8 PEM encrypted with AES-256-GCM under a key derived
-- from TRUNK_SYNC_KEY_ENCRYPTION_KEY, which lives only in the servers' environment (or a
-- file), never in the database: a dump or a replica alone cannot mint tokens. Format: one
-- version byte (1), the 12-byte nonce, the ciphertext, the 16-byte tag; the associated data
-- binds it to its kid, so sealed keys cannot be swapped between rows.
--
-- private_key (plaintext) is what earlier versions wrote. `trunk-sync migrate` encrypts
-- every such row right after applying this file, in the same run, and refuses to start that
-- run while plaintext keys exist and TRUNK_SYNC_KEY_ENCRYPTION_KEY is not set. The column
-- stays (nullable) so a server of the previous version, still running during an upgrade,
-- fails its key reload with a permission error instead of a missing column, and keeps the
-- keys it has.
alter table signing_keys add column private_key_sealed bytea;
alter table signing_keys alter column private_key drop not null;
alter table signing_keys add constraint signing_keys_private_key_present
  check (private_key is not null or private_key_sealed is not null);

-- The server reads every column but the plaintext one; `trunk-sync keys` (the owner) writes.
revoke select on signing_keys from trunk_sync_app;
grant select (kid, algorithm, private_key_sealed, public_jwk, created_at, retired_at) on signing_keys
  to trunk_sync_app;
