-- Which sessions `trunk-sync import supabase` brought over from the hosted project, so that
-- a re-run can end those the hosted project ended since (the user signed out there, every
-- refresh token of the session revoked, the session expired, the user banned or deleted
-- softly) without touching the sessions users opened on trunk-sync itself.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- An imported session keeps the hosted project's session id; nothing else tells it from a
-- native one. The import records each session it inserts, and each session already here
-- whose id (and user) the hosted project has (an earlier run, before this table existed).
-- A row goes with its session (deleted by `users delete`, an account deletion, cleanup).
-- The owner's bookkeeping, as supabase_import_progress: the server neither reads nor
-- writes it, so its role has no grant on it.
create table supabase_imported_sessions (
  session_id  uuid primary key references sessions (id) on delete cascade,
  imported_at timestamptz not null default now()
);
