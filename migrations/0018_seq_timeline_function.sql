-- The WAL timeline check of 0017 as one function, run by `trunk-sync migrate` (the owner)
-- and by every server each time it opens a database connection, so that a failover the
-- servers simply reconnect through (no `migrate` run in between) still moves every user's
-- next seq before the first push reaches the new primary. After an asynchronous failover
-- that lost commits, a push would otherwise reuse seqs devices had already pulled past,
-- and those devices would skip the new events for good.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- trunk_sync_seq_timeline(force) compares the timeline of the WAL being written now with
-- the recorded one and, when they differ (or with none recorded, on a timeline after the
-- first: restored or failed over before 0017; or when `force`, an operator's
-- `migrate --after-restore`), moves every user's last_seq to the time in microseconds, or
-- 1e9 past where it is if that is further, and counts the step in seq_skipped. One row:
--   outcome  'recorded' (first record, nothing moved), 'unchanged', 'advanced' (moved),
--            'unavailable' (the timeline cannot be read here: a hosted PostgreSQL without
--            WAL functions, a standby; nothing recorded, nothing moved unless `force`)
--   previous_timeline the recorded one before, current_timeline the one now,
--   moved_users how many users' seqs moved, reason why the timeline is unavailable.
-- The common case (the recorded timeline) takes no lock and writes nothing. Otherwise the
-- callers queue on a transaction advisory lock, and the users are locked in id order, as a
-- push (one user) and the import's batches lock them, so the move can wait for them but
-- never deadlock with them; and `for no key update`, the lock the update itself takes, so
-- the foreign keys' and the events trigger's `for key share` (sign-ins, imported sessions)
-- never wait for it.
--
-- The server's role may run it only without `force` (trunk_sync_seq_timeline_check()):
-- both run as the owner (security definer), who sees every user under the forced
-- row-level security (member of trunk_sync_admin, 0005).

create function trunk_sync_seq_timeline(force boolean)
returns table (outcome text, previous_timeline bigint, current_timeline bigint, moved_users bigint, reason text)
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  now_timeline bigint;
  recorded bigint;
  moved bigint := 0;
  why text;
begin
  begin
    now_timeline := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8;
  exception when others then
    why := sqlerrm;
  end;
  if now_timeline is not null and not force then
    select t.timeline into recorded from public.wal_timeline t;
    if recorded = now_timeline then
      return query select 'unchanged'::text, recorded, now_timeline, 0::bigint, null::text;
      return;
    end if;
  end if;
  if now_timeline is null and not force then
    return query select 'unavailable'::text, null::bigint, null::bigint, 0::bigint, why;
    return;
  end if;

  perform pg_advisory_xact_lock(8390898172854232433);  -- 0x7472756e6b736571, "trunkseq"
  select t.timeline into recorded from public.wal_timeline t for update;
  if force or (recorded is null and now_timeline > 1) or recorded <> now_timeline then
    -- now() is the transaction's start: the same in both expressions, so seq_skipped grows
    -- by exactly the step (from the row as a push left it).
    with locked as (select u.id from public.users u order by u.id for no key update),
    stepped as (
      update public.users u set
        last_seq = greatest(u.last_seq + 1000000000, (extract(epoch from now()) * 1000000)::int8),
        seq_skipped = u.seq_skipped
          + greatest(1000000000, (extract(epoch from now()) * 1000000)::int8 - u.last_seq)
      from locked where u.id = locked.id
      returning 1
    )
    select count(*) into moved from stepped;
  end if;
  if now_timeline is not null and recorded is distinct from now_timeline then
    insert into public.wal_timeline (timeline) values (now_timeline)
    on conflict (id) do update set timeline = excluded.timeline, recorded_at = now();
  end if;
  if force or (recorded is null and now_timeline > 1) or recorded <> now_timeline then
    return query select 'advanced'::text, recorded, now_timeline, moved, null::text;
  elsif recorded is null then
    return query select 'recorded'::text, null::bigint, now_timeline, 0::bigint, null::text;
  else
    return query select 'unchanged'::text, recorded, now_timeline, 0::bigint, null::text;
  end if;
end
$$;
revoke all on function trunk_sync_seq_timeline(boolean) from public;

create function trunk_sync_seq_timeline_check()
returns table (outcome text, previous_timeline bigint, current_timeline bigint, moved_users bigint, reason text)
language sql security definer set search_path = pg_catalog, pg_temp as $$
  select * from public.trunk_sync_seq_timeline(false)
$$;
revoke all on function trunk_sync_seq_timeline_check() from public;
grant execute on function trunk_sync_seq_timeline_check() to trunk_sync_app;
