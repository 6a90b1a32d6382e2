-- The pull no longer calls trunk_sync_pull (migration 0007). Runs inside one transaction
-- (trunk-sync migrate); must not contain BEGIN/COMMIT.
--
-- The server now pipelines the scope (set_config('app.user_id', …, true)) and a plain
-- select without BEGIN/COMMIT: both run in the one implicit transaction that ends at the
-- pipeline's sync, so the scope still lasts exactly as long as the read. Measured with
-- pgbench on one cluster: 53–60k pulls/s that way against 38–50k/s through the plpgsql
-- function, which costs PostgreSQL a function call and a second plan per pull. (0007 and
-- this file ship in the same release: no released server calls the function.)
drop function if exists trunk_sync_pull(uuid, bigint, bigint);
