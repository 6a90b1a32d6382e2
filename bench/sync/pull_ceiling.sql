-- pgbench: the read ceiling. A 1000-row page of one user's log after a random cursor, by the
-- (user_id, seq) index, the columns a pull returns.
\set after random(0, :max_after)
select id, seq, type, payload, client_id, client_timestamp, created_at
from events where user_id = :uid and seq > :after order by seq limit 1000;
