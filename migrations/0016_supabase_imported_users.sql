-- What `trunk-sync import supabase` last wrote to each user it imported: the address, the
-- name and the metadata as taken from the hosted project. A re-run compares the hosted
-- values with these: a value changed there is carried over only while the one here is still
-- the one the import wrote (nothing changed here since); changed on both sides, it is left
-- and reported as a conflict. SQL NULL in a column: not recorded (see below).
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- `full_name` is kept as JSON (a name, or JSON null for none), so that SQL NULL means "not
-- recorded" in every column.
-- A row goes with its user (`users delete`, an account deletion). The owner's bookkeeping,
-- as supabase_import_progress: the server neither reads nor writes it, so its role has no
-- grant on it.
create table supabase_imported_users (
  user_id       uuid primary key references users (id) on delete cascade,
  email         text,
  full_name     jsonb,
  user_metadata jsonb,
  recorded_at   timestamptz not null default now()
);

-- Users imported before this table: no version of trunk-sync until now could change an
-- address here (PUT /auth/v1/user refuses `email`; no command does it), so the address an
-- imported user has now is the one the import wrote. Their name and metadata may have been
-- changed here (PUT /auth/v1/user, PATCH /rest/v1/profiles): not recorded, the next run
-- records them where both sides agree.
insert into supabase_imported_users (user_id, email)
select u.id, u.email from users u join supabase_import_progress p on p.user_id = u.id;
