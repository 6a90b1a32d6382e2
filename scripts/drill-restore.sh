#!/usr/bin/env bash
# `make drill`: the point-in-time restore drill, against real PostgreSQL clusters and the real
# binary, with the backup script docker-compose.yml's `backup` service runs.
#
#  1. a primary cluster archives its WAL (archive_command as in docker-compose.yml);
#  2. scripts/backup.sh takes a base backup;
#  3. a client pushes events (each acknowledged with 200), the time T is noted, it pushes
#     more, then a destructive mistake: `delete from events`;
#  4. scripts/backup.sh restore lays out the base backup in a fresh cluster and the archived
#     WAL is replayed up to T (restore_command, recovery_target_time, as docs/operations.md
#     says); a time before the base backup ended is refused with one line;
#  5. exactly the events acknowledged before T are there; trunk-sync serves on the restored
#     cluster and the client pulls them with the session it had; a device whose cursor was
#     past T (it had pulled the events the restore took back) receives what is pushed next.
#
# Prints "drill: ok ..." per step; exits 1 with the reason otherwise. Overrides:
# TRUNK_SYNC_BIN (a built binary instead of `swift build`), DRILL_KEEP=1 (keep the work
# directory for inspection).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

scripts/deps.sh
if [ -n "${TRUNK_SYNC_BIN:-}" ]; then
  bin=$TRUNK_SYNC_BIN
else
  swift build --product trunk-sync
  bin="$(swift build --show-bin-path)/trunk-sync"
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)

work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-drill.XXXXXX")
chmod 755 "$work"
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  scripts/pg.sh stop "$work/primary" >/dev/null 2>&1 || true
  scripts/pg.sh stop "$work/restored" >/dev/null 2>&1 || true
  if [ "${DRILL_KEEP:-}" = 1 ]; then echo "drill: work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
fail() { echo "drill: FAILED: $*" >&2; exit 1; }
as_owner() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 "$repo/scripts/server_port.py"; }

# 1. The primary, archiving into backup/wal as the compose file's postgres service does.
backup=$work/backup
mkdir -p "$backup/wal"
[ "$(id -u)" -eq 0 ] && chown postgres "$backup" "$backup/wal"
primary_port=$(free_port)
scripts/pg.sh start "$work/primary" "$primary_port"
owner_url=$(scripts/pg.sh url "$work/primary" postgres)
psql "$owner_url" -qAt \
  -c "alter system set archive_mode = on" \
  -c "alter system set archive_command = '{ cmp -s %p $backup/wal/%f || { test ! -f $backup/wal/%f && cp %p $backup/wal/%f.tmp && sync $backup/wal/%f.tmp && mv $backup/wal/%f.tmp $backup/wal/%f; }; } && sync $backup/wal'" >/dev/null
scripts/pg.sh restart "$work/primary"
psql "$owner_url" -qc "create database trunk_sync"
echo "drill: ok primary archives its WAL to $backup/wal"

server_password=$(openssl rand -hex 32)
export TRUNK_SYNC_MIGRATION_DATABASE_URL
TRUNK_SYNC_MIGRATION_DATABASE_URL=$(scripts/pg.sh url "$work/primary" trunk_sync)
export TRUNK_SYNC_DATABASE_URL="postgres://trunk_sync_server:$server_password@127.0.0.1:$primary_port/trunk_sync"
export TRUNK_SYNC_JWT_SECRET
TRUNK_SYNC_JWT_SECRET=$(openssl rand -base64 48)
export TRUNK_SYNC_KEY_ENCRYPTION_KEY
TRUNK_SYNC_KEY_ENCRYPTION_KEY=$(openssl rand -base64 48)
export TRUNK_SYNC_MIGRATIONS_DIR=$repo/migrations TRUNK_SYNC_HOST=127.0.0.1 TRUNK_SYNC_ADMIN_PORT=0
# The tokens' issuer: the same before and after the restore, whatever port serve gets.
export TRUNK_SYNC_PUBLIC_URL=https://sync.drill.example
"$bin" migrate >>"$work/migrate.log" 2>&1 || fail "migrate: $(tail -n 3 "$work/migrate.log")"

# The server, in the background on a free port; waits until it answers /healthz.
serve() {
  TRUNK_SYNC_PORT=$(free_port)
  export TRUNK_SYNC_PORT
  env -u TRUNK_SYNC_MIGRATION_DATABASE_URL "$bin" serve >"$work/serve-$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:$TRUNK_SYNC_PORT/healthz" >/dev/null 2>&1 && return 0
    kill -0 "$server_pid" 2>/dev/null || fail "serve exited: $(tail -n 5 "$work/serve-$1.log")"
    sleep 0.1
  done
  fail "serve never answered /healthz"
}
stop_server() { kill "$server_pid"; wait "$server_pid" || true; server_pid=; }

# The WAL so far reaches the archive: switch to a new segment, wait until it is archived.
archive_now() {
  local segment archived
  segment=$(psql "$owner_url" -qAt -c "select pg_walfile_name(pg_switch_wal())")
  for _ in $(seq 1 300); do
    archived=$(psql "$owner_url" -qAt -c "select coalesce(last_archived_wal, '') from pg_stat_archiver")
    [[ "$archived" > "$segment" || "$archived" == "$segment" ]] && break
    sleep 0.1
  done
  [ -f "$backup/wal/$segment" ] || fail "segment $segment was never archived"
  echo "$segment"
}

# 2. Base backups, by the compose backup service's script, keeping one: the second removes
#    the first and the WAL archived before it started.
backup_once() {
  BACKUP_DIR=$backup BACKUP_KEEP=1 PGHOST=127.0.0.1 PGPORT=$primary_port PGUSER=trunk \
    PGPASSWORD=$(cat "$work/primary/password") scripts/backup.sh once
}
backup_once
old_segment=$(archive_now)
backup_once
[ "$(find "$backup/base" -mindepth 1 -maxdepth 1 -type d | wc -l)" = 1 ] || fail "BACKUP_KEEP=1 kept $(ls "$backup/base")"
[ ! -e "$backup/wal/$old_segment" ] || fail "WAL from before the kept base backup was not removed"
base=$(find "$backup/base" -mindepth 1 -maxdepth 1 -type d | sort | tail -n 1)
[ -f "$base/base.tar.gz" ] || fail "no base backup in $backup/base"
# Retention goes by segment name from the kept backup's start segment (its backup_label's),
# not by file time; the restore below replays what it kept.
start=$(cat "$base/start-wal" 2>/dev/null) || fail "the base backup records no start segment"
for file in "$backup/wal"/*; do
  name=${file##*/}
  if [[ $name =~ ^[0-9A-F]{24}$ ]] && [[ ${name:8:16} < ${start:8:16} ]]; then
    fail "segment $name, before the kept base backup's start $start, was kept"
  fi
done
echo "drill: ok base backup $base (the older one and its WAL removed by retention, from $start on kept)"

# 3. Pushes, T, more pushes, the mistake.
serve primary
session=$("$bin" token --email drill@example.com)
token=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"])' <<<"$session")
acknowledged=$work/before-T
: >"$acknowledged"
push() {  # push N: N events in one request; prints their client ids once acknowledged with 200
  local body ids
  ids=$(for _ in $(seq 1 "$1"); do cat /proc/sys/kernel/random/uuid; done)
  body=$(python3 -c 'import json,sys; print(json.dumps({"events": [{"client_id": i, "type": "drill", "payload": {"n": i}, "client_timestamp": "2026-11-26T12:00:00Z"} for i in sys.argv[1:]]}))' $ids)
  status=$(curl -s -o "$work/push.out" -w '%{http_code}' -X POST "http://127.0.0.1:$TRUNK_SYNC_PORT/sync/v1/events" \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' --data-binary "$body")
  [ "$status" = 200 ] || fail "push answered $status: $(cat "$work/push.out")"
  echo "$ids"
}
for _ in 1 2 3 4 5; do push 4 >>"$acknowledged"; done
# T: after every push above was acknowledged, before any push below was sent.
target=$(psql "$owner_url" -qAt -c "select clock_timestamp()")

after=$work/after-T
for _ in 1 2 3; do push 5 >>"$after"; done
# A device that pulled everything, events after T included: its cursor ends past what the
# restore will bring back.
ahead=$(curl -fsS "http://127.0.0.1:$TRUNK_SYNC_PORT/sync/v1/events?after=0&limit=1000" -H "Authorization: Bearer $token" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["next_after"])')
psql "$TRUNK_SYNC_MIGRATION_DATABASE_URL" -qAt -c "delete from events" >/dev/null
echo "drill: ok $(wc -l <"$acknowledged") events acknowledged before T=$target, $(wc -l <"$after") after, then delete from events"
stop_server

# The WAL up to the mistake reaches the archive (a segment is archived once full, on
# archive_timeout, or when switched as here).
segment=$(archive_now)
scripts/pg.sh stop "$work/primary"
echo "drill: ok WAL archived through $segment; primary stopped"

# 4. Restore into a fresh cluster, as docs/operations.md says: backup.sh restore lays out the
#    newest base backup that had ended by T and the recovery settings. A time before the
#    kept base backup ended is refused with one line, nothing written (PostgreSQL would
#    instead stop at the backup's end, later than asked).
restore_to() {  # restore_to TIME DATADIR
  BACKUP_DIR=$backup scripts/backup.sh restore "$1" "$2"
}
if restore_to "$(date -u -d '1 hour ago' '+%Y-%m-%d %H:%M:%S+00')" "$work/too-early" >"$work/too-early.out" 2>&1; then
  fail "a restore to an hour before the base backup was not refused: $(cat "$work/too-early.out")"
fi
[ "$(wc -l <"$work/too-early.out")" = 1 ] && grep -q "no base backup had ended by" "$work/too-early.out" \
  || fail "a restore to before the base backup did not say so in one line: $(cat "$work/too-early.out")"
[ ! -e "$work/too-early" ] || fail "a refused restore wrote $work/too-early"
echo "drill: ok a restore to before the base backup is refused: $(cat "$work/too-early.out")"
restored=$work/restored
restore_to "$target" "$restored/pgdata" || fail "backup.sh restore to T failed"
echo "archive_mode = 'off'" >>"$restored/pgdata/postgresql.auto.conf"
cp "$work/primary/password" "$restored/password"
chmod 700 "$restored/pgdata"
[ "$(id -u)" -eq 0 ] && chown -R postgres "$restored"
restored_port=$(free_port)
scripts/pg.sh start "$restored" "$restored_port"
restored_url=$(scripts/pg.sh url "$restored" trunk_sync)
for _ in $(seq 1 600); do
  [ "$(psql "$restored_url" -qAt -c "select pg_is_in_recovery()" 2>/dev/null)" = f ] && break
  sleep 0.1
done
[ "$(psql "$restored_url" -qAt -c "select pg_is_in_recovery()")" = f ] || fail "the restored cluster never left recovery"
echo "drill: ok restored to T and promoted ($(grep -c "recovery stopping before" "$restored/server.log" || true) stop logged)"

# 5. Exactly the events acknowledged before T.
psql "$restored_url" -qAt -c "select client_id from events order by client_id" >"$work/restored-ids"
sort "$acknowledged" >"$work/expected-ids"
diff "$work/expected-ids" "$work/restored-ids" >"$work/ids.diff" \
  || fail "restored events differ from those acknowledged before T: $(head -n 20 "$work/ids.diff")"
echo "drill: ok exactly the $(wc -l <"$work/restored-ids") events acknowledged before T are restored"

export TRUNK_SYNC_DATABASE_URL="postgres://trunk_sync_server:$server_password@127.0.0.1:$restored_port/trunk_sync"
export TRUNK_SYNC_MIGRATION_DATABASE_URL=$restored_url
"$bin" migrate >>"$work/migrate.log" 2>&1 || fail "migrate: $(tail -n 3 "$work/migrate.log")"
serve restored
curl -fsS "http://127.0.0.1:$TRUNK_SYNC_PORT/sync/v1/events?after=0&limit=1000" -H "Authorization: Bearer $token" >"$work/pulled.json" \
  || fail "the pull on the restored server failed"
python3 -c 'import json,sys; print("\n".join(sorted(e["client_id"] for e in json.load(open(sys.argv[1]))["events"])))' \
  "$work/pulled.json" >"$work/pulled-ids"
diff "$work/expected-ids" "$work/pulled-ids" >/dev/null || fail "the client pulled other events: $(head -c 400 "$work/pulled.json")"
echo "drill: ok the server starts on the restored cluster and the client pulls the $(wc -l <"$work/pulled-ids") events"

# The device whose cursor ($ahead) is past the restored end still receives what is pushed
# now: migrate found the new WAL timeline and moved the next seq past it.
grep -q "restored or failed over" "$work/migrate.log" || fail "migrate did not notice the restore: $(tail -n 3 "$work/migrate.log")"
new_id=$(push 1)
curl -fsS "http://127.0.0.1:$TRUNK_SYNC_PORT/sync/v1/events?after=$ahead&limit=1000" -H "Authorization: Bearer $token" >"$work/ahead.json" \
  || fail "the pull after $ahead failed"
python3 -c 'import json,sys; ids = [e["client_id"] for e in json.load(open(sys.argv[1]))["events"]]; sys.exit(0 if ids == [sys.argv[2]] else 1)' \
  "$work/ahead.json" "$new_id" || fail "a device at cursor $ahead did not get the event pushed after the restore: $(head -c 400 "$work/ahead.json")"
stop_server
echo "drill: ok a device whose cursor ($ahead) was past the restored end receives the event pushed after the restore"
echo "drill: passed"
