-- Sign-in and confirmation codes that carry nothing any more, removed in bounded batches.
-- Runs inside one transaction (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- `otp_codes` keeps one row per address that ever asked for a code (any address: the
-- statements are the same whether or not it has an account), with the sign-up metadata of
-- the last request (0019), and nothing removed them: the table grew with every address
-- ever typed, and unverified metadata stayed for ever. A row is stale when its code
-- expired more than a day ago, no refused attempt of the failure window (at most a day,
-- TRUNK_SYNC_OTP_FAILURE_LIMIT) is younger than a day, and no lock is running: removing it
-- forgets nothing a limit still counts (the resend interval, at most an hour, ends before
-- the code expires). `reauthentication_codes` (0009) the same.
--
-- The server's role sees only the row its transaction names (0005, 0009), so the removal
-- runs as the owner (security definer), who sees every row (trunk_sync_admin); at most
-- `max_rows` of each table per call (rows a sign-in holds are skipped, not waited for). No
-- index on `expires_at`: it would make every code request's upsert update an index, for a
-- scan the server runs every ten minutes.

create function trunk_sync_trim_stale_codes(max_rows integer)
returns table (otp_codes_removed bigint, reauthentication_codes_removed bigint)
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  cutoff timestamptz := now() - interval '1 day';
  limit_rows integer := least(greatest(coalesce(max_rows, 0), 0), 100000);
  otp bigint;
  reauth bigint;
begin
  with stale as (
    select c.email from public.otp_codes c
    where c.expires_at < cutoff
      and (c.failures_since is null or c.failures_since < cutoff)
      and (c.locked_until is null or c.locked_until < now())
    limit limit_rows
    for update skip locked
  )
  delete from public.otp_codes c using stale where c.email = stale.email;
  get diagnostics otp = row_count;
  with stale as (
    select c.user_id from public.reauthentication_codes c
    where c.expires_at < cutoff
      and (c.failures_since is null or c.failures_since < cutoff)
      and (c.locked_until is null or c.locked_until < now())
    limit limit_rows
    for update skip locked
  )
  delete from public.reauthentication_codes c using stale where c.user_id = stale.user_id;
  get diagnostics reauth = row_count;
  return query select otp, reauth;
end
$$;
revoke all on function trunk_sync_trim_stale_codes(integer) from public;
grant execute on function trunk_sync_trim_stale_codes(integer) to trunk_sync_app;
