-- pgbench: the empty-page ceiling. The pull select after the user's last seq (no rows).
select id, seq, type, payload, client_id, client_timestamp, created_at
from events where user_id = :uid and seq > :last order by seq limit 1000;
