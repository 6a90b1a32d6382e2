-- pgbench: the server's pull without the server (informational reference): the scope and
-- the select (limit + 1 rows) after a random cursor in one pipeline without begin/commit
-- (one implicit transaction), as trunk_sync_app. Like the server: the limit a parameter, the
-- statement's plan generic (`Plans.generic`), asked for with the scope.
\set after random(0, :max_after)
\set rows 1001
\startpipeline
select set_config('app.user_id', :uidtext, true), set_config('plan_cache_mode', 'force_generic_plan', true);
select id, seq, type, payload, client_id, client_timestamp, created_at
from events where user_id = :uid and seq > :after order by seq limit :rows;
\endpipeline
