-- The events' foreign key to users, checked once per statement instead of once per row.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- A push inserts up to 1000 events in one statement; the foreign key
-- events.user_id -> users.id ran one look-up of users per inserted row (measured: about a
-- quarter of PostgreSQL's time per 100-event push). The same rule, enforced by triggers:
--   * after an insert into events, one statement-level check over the inserted rows: every
--     user they name exists, and is locked FOR KEY SHARE, as the foreign key locks it, so
--     a concurrent deletion of that user waits for this transaction (or, if it committed
--     first, the insert fails);
--   * an update of events.user_id is checked the same way (nothing updates it today);
--   * deleting users deletes their events (the former ON DELETE CASCADE); changing a
--     user's id is refused while the user has events (the former NO ACTION).
-- The functions run as their owner (security definer), who is a member of
-- trunk_sync_admin (migration 0005) and so sees every row under the forced row-level
-- security; the server's role still cannot delete an event itself.

alter table events drop constraint events_user_id_fkey;

create function trunk_sync_events_user_exists() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  wanted bigint;
  found bigint;
begin
  select count(distinct user_id) into wanted from new_events;
  select count(*) into found
  from (select 1 from public.users u where u.id in (select user_id from new_events) for key share of u) locked;
  if found < wanted then
    raise foreign_key_violation using
      message = 'insert or update on table "events" violates foreign key constraint "events_user_id_fkey"',
      detail = 'Key (user_id) is not present in table "users".',
      constraint = 'events_user_id_fkey';
  end if;
  return null;
end
$$;
revoke all on function trunk_sync_events_user_exists() from public;

create trigger events_user_exists_on_insert after insert on events
  referencing new table as new_events
  for each statement execute function trunk_sync_events_user_exists();
create trigger events_user_exists_on_update after update on events
  referencing new table as new_events
  for each statement execute function trunk_sync_events_user_exists();

create function trunk_sync_users_delete_events() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  delete from public.events e using old_users o where e.user_id = o.id;
  return null;
end
$$;
revoke all on function trunk_sync_users_delete_events() from public;

create trigger users_delete_events after delete on users
  referencing old table as old_users
  for each statement execute function trunk_sync_users_delete_events();

create function trunk_sync_users_keep_id() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  if new.id <> old.id and exists (select 1 from public.events where user_id = old.id) then
    raise foreign_key_violation using
      message = 'update on table "users" violates foreign key constraint "events_user_id_fkey" on table "events"',
      constraint = 'events_user_id_fkey';
  end if;
  return null;
end
$$;
revoke all on function trunk_sync_users_keep_id() from public;

-- After the update (as the foreign key's check): row-level security's check of the new row
-- comes first.
create trigger users_keep_id after update of id on users
  for each row execute function trunk_sync_users_keep_id();
