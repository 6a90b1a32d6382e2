-- pgbench: the server's empty pull without the server (informational reference): the one
-- statement the server sends (trunk_sync_pull: scope and select, limit + 1 rows), as
-- trunk_sync_app.
select seq, id, type, payload, client_id, client_timestamp, created_at
from trunk_sync_pull(:uid, :last, 1001);
