-- pgbench: the server's empty pull without the server (informational reference): the
-- scope and the select (limit + 1 rows) in one pipeline without begin/commit (one implicit
-- transaction), as trunk_sync_app.
\startpipeline
select set_config('app.user_id', :uidtext, true);
select id, seq, type, payload, client_id, client_timestamp, created_at
from events where user_id = :uid and seq > :last order by seq limit 1001;
\endpipeline
