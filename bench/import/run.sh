#!/usr/bin/env bash
# bench/import: `trunk-sync import supabase` from a generated Supabase-shaped source, against
# a PostgreSQL ceiling measured in the same run on the same cluster (see bench/README.md).
#
#   bench/import/run.sh                          10,000 users, 1,000,000 events, 2 rounds
#   BENCH_USERS=1000 BENCH_EVENTS=100000 ...     a smaller source
#   BENCH_ROUNDS=1 ...                           fewer rounds
#   BENCH_BATCH=20000 ...                        the import's --batch-size (default its own)
#   BENCH_BIN=path/to/trunk-sync ...             measure that binary (an A/B) instead of building this tree's
#
# Needs the PostgreSQL 15 server and client binaries and GNU time. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
here=$root/bench/import

users=${BENCH_USERS:-10000}
events=${BENCH_EVENTS:-1000000}
rounds=${BENCH_ROUNDS:-2}
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x /usr/bin/time ] || { echo "GNU time not found (apt-get install time)" >&2; exit 1; }

if [ -n "${BENCH_BIN:-}" ]; then
  bin=$(cd "$(dirname "$BENCH_BIN")" && pwd)/$(basename "$BENCH_BIN")
  [ -x "$bin" ] || { echo "BENCH_BIN $BENCH_BIN is not an executable" >&2; exit 1; }
  echo "== measuring $bin"
else
  echo "== building release"
  swift build -c release --scratch-path .build-release --product trunk-sync 2>&1 | tail -n 1
  bin=$(swift build -c release --scratch-path .build-release --show-bin-path)/trunk-sync
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-bench-import.XXXXXX")
cleanup() {
  scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Real durability (fsync on), as in production.
port=$(python3 scripts/server_port.py)
env -u PG_FAST scripts/pg.sh start "$work/pg" "$port" >/dev/null
admin_url=$(scripts/pg.sh url "$work/pg" postgres)
psql() { command "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
now() { date +%s.%N; }

echo "== generating the source: $users users, $events events"
psql "$admin_url" -c "create database supabase_source"
source_admin=$(scripts/pg.sh url "$work/pg" supabase_source)
started=$(now)
psql "$source_admin" -v users="$users" -v events="$events" -f "$here/source.sql" >/dev/null
echo "   generated in $(python3 -c "print(round($(now) - $started, 1))") s"
# The hosted project's postgres role: not a superuser, bypasses row-level security.
psql "$source_admin" -c "create role bench_reader login password 'bench-reader' bypassrls;
  grant usage on schema auth, public to bench_reader; grant select on all tables in schema auth, public to bench_reader;"
source_url="postgres://bench_reader:bench-reader@127.0.0.1:$port/supabase_source"

fresh_destination() {
  psql "$admin_url" -c "drop database if exists trunk_bench with (force)" -c "create database trunk_bench"
  dest_url=$(scripts/pg.sh url "$work/pg" trunk_bench)
  TRUNK_SYNC_DATABASE_URL=$dest_url "$bin" migrate >/dev/null 2>&1
}

# The ceiling: the same rows copied by PostgreSQL alone (COPY out of the source, COPY into a
# table shaped and indexed like trunk-sync's events, seq from a window function), through
# psql, in the same cluster.
ceiling() {
  psql "$dest_url" -c "create table events_ceiling (like events including defaults including constraints including indexes)"
  local start=$(now)
  psql "$source_admin" -c "copy (select id, user_id, row_number() over (partition by user_id order by created_at, id), type,
      payload, client_id, client_timestamp, created_at from public.events) to stdout" |
    psql "$dest_url" -c "copy events_ceiling (id, user_id, seq, type, payload, client_id, client_timestamp, created_at) from stdin"
  python3 -c "print(round($(now) - $start, 2))"
}

run_import() {  # prints: seconds peak_rss_kib exit_code
  local start=$(now) status=0
  TRUNK_SYNC_DATABASE_URL=$dest_url TRUNK_SYNC_LOG_LEVEL=warning /usr/bin/time -f '%M' -o "$work/rss" \
    "$bin" import supabase --from "$source_url" --json --reject-file "$work/rejects.jsonl" ${BENCH_BATCH:+--batch-size "$BENCH_BATCH"} >"$work/report.json" || status=$?
  echo "$(python3 -c "print(round($(now) - $start, 2))") $(cat "$work/rss") $status"
}

baseline_rss=$( /usr/bin/time -f '%M' "$bin" --version 2>&1 >/dev/null | tail -n 1 )
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg); trunk-sync --version peak RSS ${baseline_rss} KiB"
for round in $(seq 1 "$rounds"); do
  fresh_destination
  read -r seconds rss status < <(run_import)
  [ "$status" = 0 ] || { echo "import exited $status" >&2; cat "$work/report.json" >&2; exit 1; }
  imported=$(python3 -c "import json; r=json.load(open('$work/report.json')); print(r['events']['imported'], r['verification']['passed'])")
  echo "   phases (s): $(python3 -c "import json; print(json.load(open('$work/report.json'))['seconds'])")"
  phase_events=$(python3 -c "import json; print(json.load(open('$work/report.json'))['seconds']['events'])")
  read -r rerun rerun_rss rerun_status < <(run_import)
  echo "   re-run phases (s): $(python3 -c "import json; print(json.load(open('$work/report.json'))['seconds'])")"
  ceiling_seconds=$(ceiling)
  python3 - "$round" "$seconds" "$rss" $imported "$rerun" "$rerun_rss" "$ceiling_seconds" "$events" "$baseline_rss" "$phase_events" <<'PY'
import sys
round_, seconds, rss, imported, verified, rerun, rerun_rss, ceiling, events, baseline, phase = sys.argv[1:]
seconds, rerun, ceiling, events, phase = float(seconds), float(rerun), float(ceiling), int(events), float(phase)
print(f"round {round_}: import {seconds:.1f} s = {events / seconds:,.0f} events/s, events phase alone {events / phase:,.0f} events/s "
      f"(imported {imported}, verified {verified}); "
      f"ceiling {ceiling:.1f} s = {events / ceiling:,.0f} events/s; ratio {ceiling / seconds:.2f}; "
      f"peak RSS {int(rss) / 1024:.1f} MiB (growth over --version {(int(rss) - int(baseline)) / 1024:.1f} MiB); "
      f"re-run with nothing new {rerun:.1f} s, peak RSS {int(rerun_rss) / 1024:.1f} MiB")
PY
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
