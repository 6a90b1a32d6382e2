-- A pull in one statement. Runs inside one transaction (trunk-sync migrate); must not
-- contain BEGIN/COMMIT.
--
-- Until now a pull was four statements in one pipeline: begin, set app.user_id, the
-- select, commit. trunk_sync_pull names the user for row-level security and reads the page
-- in one call, which the server sends alone, so it runs in an implicit transaction of its
-- own: set_config(…, true) lasts exactly as long as that statement, as the scope did. It is
-- SECURITY INVOKER (the default): the select runs as the caller, under the events policy,
-- and additionally filters by user itself. Called inside a longer transaction, the scope
-- would last until that transaction ends — the server never does that.
--
-- Gap-free as before: pushes of one user commit in seq order (they hold the user's row
-- lock until commit), so one snapshot never sees seq N + 1 without seq N.
create function trunk_sync_pull(p_user uuid, p_after bigint, p_limit bigint)
returns table (seq bigint, id uuid, type text, payload jsonb, client_id uuid,
               client_timestamp timestamptz, created_at timestamptz)
language plpgsql
as $$
begin
  perform set_config('app.user_id', p_user::text, true);
  return query
    select e.seq, e.id, e.type, e.payload, e.client_id, e.client_timestamp, e.created_at
    from events e
    where e.user_id = p_user and e.seq > p_after
    order by e.seq
    limit p_limit;
end
$$;

revoke all on function trunk_sync_pull(uuid, bigint, bigint) from public;
grant execute on function trunk_sync_pull(uuid, bigint, bigint) to trunk_sync_app;
