-- pgbench: the server's pull without the server (informational reference): the one
-- statement the server sends (trunk_sync_pull: scope and select, limit + 1 rows) after a
-- random cursor, as trunk_sync_app.
\set after random(0, :max_after)
select seq, id, type, payload, client_id, client_timestamp, created_at
from trunk_sync_pull(:uid, :after, 1001);
