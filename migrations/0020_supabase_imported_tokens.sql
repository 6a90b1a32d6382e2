-- Which refresh tokens `trunk-sync import supabase` brought over from the hosted project: each
-- session's live token, and the parent it was rotated from (a device whose answer to that
-- refresh was lost presents the parent, which Supabase Auth accepts). A re-run revokes the
-- imported tokens the hosted project has rotated away since, and must tell them from the
-- tokens trunk-sync issued in the same session (a device that already refreshed here): both
-- have a parent. Tokens imported before this table have none, and are still told by that.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- A row goes with its token. The owner's bookkeeping, as supabase_imported_sessions: the
-- server neither reads nor writes it, so its role has no grant on it.
create table supabase_imported_tokens (
  token_id bigint primary key references refresh_tokens (id) on delete cascade
);
