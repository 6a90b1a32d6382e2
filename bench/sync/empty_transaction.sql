-- pgbench: the server's pull transaction without the server (informational reference): begin,
-- scope, the pull select (limit + 1 rows), commit, in one pipeline, as trunk_sync_app.
\startpipeline
begin;
select set_config('app.user_id', :uidtext, true);
select seq, id, type, payload, client_id, client_timestamp, created_at
from events where user_id = :uid and seq > :last order by seq limit 1001;
commit;
\endpipeline
