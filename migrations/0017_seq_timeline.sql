-- Devices after a point-in-time restore. A restore (or a failover that lost commits) puts
-- every user's `last_seq` back where it stood at the restore point, while devices may
-- already have pulled events committed after it: their cursors are past the restored end.
-- New events would then reuse those seqs, and such a device, pulling after its cursor,
-- would skip them for good. PostgreSQL promotes a restored or failed-over cluster onto a new
-- WAL timeline: `trunk-sync migrate` records the timeline it runs on here and, finding
-- another one, moves every user's next seq past anything a device may have seen
-- (`users.seq_skipped` counts what was skipped, so `last_seq - seq_skipped` is still the
-- number of events stored). Runs inside one transaction (trunk-sync migrate); must not
-- contain BEGIN/COMMIT.
--
-- No user's rows: the owner's bookkeeping, which the server's role neither reads nor writes.
alter table users add column seq_skipped bigint not null default 0;

create table wal_timeline (
  id          boolean primary key default true check (id),
  timeline    bigint not null,
  recorded_at timestamptz not null default now()
);
