#!/usr/bin/env bash
# bench/sync: throughput of the native sync API (push, pull, empty pull), each against a
# PostgreSQL ceiling measured in the same run on the same cluster (see bench/README.md).
#
#   bench/sync/run.sh            full run (about 4 minutes)
#   BENCH_DURATION=5 bench/sync/run.sh    shorter measurements
#   BENCH_ROUNDS=5 ...           rounds of ceiling + trunk-sync per measurement (default 3; the
#                                ratio is the median of the rounds' ratios, the spread shown)
#   BENCH_ONLY=pull,empty ...    only these measurements (push, pull, empty, latency)
#   BENCH_KEEP=1 ...             leave the cluster and server running afterwards (prints how to stop)
#
# Needs wrk and the PostgreSQL 15 server + client binaries (pgbench). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
here=$root/bench/sync

duration=${BENCH_DURATION:-15}
rounds=${BENCH_ROUNDS:-3}
connections=${BENCH_CONNECTIONS:-16}
users=${BENCH_USERS:-20}
pool=${BENCH_POOL_SIZE:-16}
log_events=${BENCH_LOG_EVENTS:-100000}
page=1000
. bench/common/lib.sh
command -v wrk >/dev/null || { echo "wrk not found (apt-get install wrk)" >&2; exit 1; }
[ -x "$pgbin/pgbench" ] || { echo "pgbench not found in $pgbin" >&2; exit 1; }

bench_build

work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-bench-sync.XXXXXX")
server_pid=
cleanup() {
  if [ "${BENCH_KEEP:-}" = 1 ]; then
    echo "kept: $work (server pid ${server_pid:-none}); stop with: kill $server_pid; scripts/pg.sh stop $work/pg"
    return
  fi
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  scripts/pg.sh stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT

# Real durability: PG_FAST unset, so fsync=on, synchronous_commit=on, full_page_writes=on.
port=$(free_port)
env -u PG_FAST scripts/pg.sh start "$work/pg" "$port"
admin_url=$(scripts/pg.sh url "$work/pg" postgres)
psql() { command "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql "$admin_url" -c "create database trunk_bench"
url=$(scripts/pg.sh url "$work/pg" trunk_bench)
settings=$(psql "$url" -At -c "select string_agg(name || '=' || setting, ' ' order by name) from pg_settings
  where name in ('fsync','synchronous_commit','full_page_writes','wal_sync_method','shared_buffers','max_wal_size','checkpoint_timeout')")
echo "== postgres $(psql "$url" -At -c 'show server_version'): $settings"

export TRUNK_SYNC_DATABASE_URL=$url
# The token issuer: `serve` accepts only tokens whose iss it would write itself, so the
# token command and the server must agree on it (their ports differ).
export TRUNK_SYNC_PUBLIC_URL=http://bench.invalid
export TRUNK_SYNC_JWT_SECRET=$(head -c 32 /dev/urandom | base64)
export TRUNK_SYNC_LOG_LEVEL=notice  # the "listening" line is a notice; access logs (info) stay off
export TRUNK_SYNC_DB_POOL_SIZE=$pool
"$bin" migrate >/dev/null 2>&1 || { "$bin" migrate; exit 1; }

bench_serve "$work/serve.log" "$bin"
server_pid=$served_pid server_port=$served_port
base=http://127.0.0.1:$server_port
echo "== trunk-sync serve on $base (pool $pool, $(nproc) cores)"

token_for() { "$bin" token --email "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])'; }
: >"$work/tokens"
for i in $(seq 1 "$users"); do token_for "push$i@bench.example" >>"$work/tokens"; done
pull_token=$(token_for "pull@bench.example")
pull_user=$(psql "$url" -At -c "select id from users where email = 'pull@bench.example'")
# For BENCH_KEEP=1 sessions: everything needed to rerun one measurement by hand.
printf 'url=%s\nbase=%s\npull_token=%s\npull_user=%s\nserver_pid=%s\n' \
  "$url" "$base" "$pull_token" "$pull_user" "$server_pid" >"$work/env"

# CPU seconds so far: "<postgres cluster> <trunk-sync serve>".
cpu() { bench_cpu "$work/pg/pgdata" "$server_pid"; }
# Per-request CPU between two cpu() readings, for N requests: where the time goes.
cpu_per_request() {
  python3 -c "b, a, n = '$1'.split(), '$2'.split(), $3
print(f'Postgres {(float(a[0]) - float(b[0])) / n * 1e6:.0f} us, trunk-sync {(float(a[1]) - float(b[1])) / n * 1e6:.0f} us CPU per request')"
}
# Runs wrk; prints requests/s, fails when any response was not 2xx. Reports latencies and
# CPU per request on stderr.
run_wrk() {
  local out=$1; shift
  local before after requests
  before=$(cpu)
  wrk --latency "$@" >"$out" 2>&1 || { cat "$out" >&2; return 1; }
  after=$(cpu)
  if grep -q "Non-2xx" "$out"; then cat "$out" >&2; echo "non-2xx responses" >&2; return 1; fi
  requests=$(awk '/ requests in / { print $1 }' "$out")
  echo "   latency p50 $(awk '$1 == "50%" { print $2 }' "$out"), p99 $(awk '$1 == "99%" { print $2 }' "$out");" \
    "$(cpu_per_request "$before" "$after" "$requests")" >&2
  awk '/^Requests\/sec:/ { print $2 }' "$out"
}
# Runs pgbench with 4 and 16 clients; prints the better transactions/s.
run_pgbench() {
  local name=$1 script=$2; shift 2
  local best=0 clients tps
  local before after count
  for clients in 4 16; do
    before=$(cpu)
    "$pgbin/pgbench" -n -M prepared -c "$clients" -j 2 -T "$duration" -f "$script" "$@" "$url" \
      >"$work/$name-c$clients.txt" 2>&1 || { cat "$work/$name-c$clients.txt" >&2; return 1; }
    after=$(cpu)
    tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' "$work/$name-c$clients.txt" | tail -n 1)
    count=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$work/$name-c$clients.txt")
    echo "   pgbench $name -c $clients: $tps tps; $(cpu_per_request "$before" "$after" "$count" | sed 's/, trunk-sync.*/ CPU per transaction/')" >&2
    best=$(python3 -c "print(max($best, $tps))")
  done
  echo "$best"
}
# Runs pgbench at a fixed rate (--rate: Poisson arrivals, as the wrk scripts' pauses) with
# $connections clients; prints the p99 of the transactions' own time in ms. pgbench counts a
# transaction from its scheduled start, so when pgbench itself falls behind, the wait is in
# its time too (the log's "schedule lag"); wrk counts from the request's sending: the lag is
# taken off to compare the same thing. Both p99s go to stderr.
pgbench_latency() {
  local name=$1 script=$2 rate=$3; shift 3
  rm -rf "$work/$name-log" && mkdir -p "$work/$name-log"
  (cd "$work/$name-log" && "$pgbin/pgbench" -n -M prepared -c "$connections" -j 2 -T "$duration" -R "$rate" -l \
    -f "$script" "$@" "$url" >../"$name-rate.txt" 2>&1) || { cat "$work/$name-rate.txt" >&2; return 1; }
  cat "$work/$name-log"/pgbench_log.* | awk '{ print $3, $3 - $7 }' | python3 -c '
import sys
rows = [line.split() for line in sys.stdin]
def pct(values, p): values = sorted(values); return values[min(len(values) - 1, int(len(values) * p))] / 1000
with_lag, own = [float(r[0]) for r in rows], [float(r[1]) for r in rows]
print(f"   {len(rows)} transactions: p50 {pct(own, .5):.2f}ms, p99 {pct(own, .99):.2f}ms"
      f" (from the scheduled start: p99 {pct(with_lag, .99):.2f}ms)", file=sys.stderr)
print(f"{pct(own, .99):.2f}ms")'
}
wanted() { [[ ",${BENCH_ONLY:-push,pull,empty,latency}," == *",$1,"* ]]; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
checkpoint() { psql "$url" -c checkpoint; }
declare -A figure reference same rounds_of
# add_round NAME FIGURE CEILING: one round's pair; figure/reference become the medians.
add_round() {
  rounds_of[$1]="${rounds_of[$1]:-} $2/$3"
  figure[$1]=$(median_of "$1" 0)
  reference[$1]=$(median_of "$1" 1)
}
# median_of NAME FIELD: the median of the rounds' figures (0), ceilings (1) or ratios (2).
median_of() {
  python3 -c "import statistics, sys
pairs = [tuple(map(float, p.split('/'))) for p in sys.argv[2:]]
values = [(f, c, f / c)[$2] for f, c in pairs]
print(f'{statistics.median(values):.2f}' if $2 == 2 else round(statistics.median(values)))" "$1" ${rounds_of[$1]}
}
# spread NAME: "min–max" of the rounds' ratios.
spread() {
  python3 -c "import sys
ratios = [f / c for f, c in (tuple(map(float, p.split('/'))) for p in sys.argv[1:])]
print(f'{min(ratios):.2f}–{max(ratios):.2f}')" ${rounds_of[$1]}
}

# 1. Push: 100 events per request, $connections connections, $users users.
if wanted push; then
  psql "$url" -c "create table bench_events (like events including all); create sequence bench_seq cache 1000"
  for round in $(seq 1 "$rounds"); do
    echo "== push ceiling ($round/$rounds): pgbench 100-row insert ... select generate_series into a copy of events"
    checkpoint
    tps=$(run_pgbench push-ceiling "$here/push_ceiling.sql" -D users="$users")
    ceiling=$(python3 -c "print(round($tps * 100))")
    echo "== push ($round/$rounds): wrk -t$connections -c$connections, 100 events per request, $users users"
    checkpoint
    before=$(psql "$url" -At -c "select count(*) from events")
    rps=$(BENCH_TOKENS=$work/tokens BENCH_CONNECTIONS=$connections BENCH_EVENTS=100 \
      run_wrk "$work/push-$round.txt" -t"$connections" -c"$connections" -d"${duration}s" -s "$here/push.lua" "$base")
    after=$(psql "$url" -At -c "select count(*) from events")
    stored=$((after - before))
    echo "   $rps requests/s; $stored events stored"
    errors=$(psql "$url" -At -c "select count(*) from (select user_id from events group by user_id
      having count(*) <> max(seq) or max(seq) <> (select last_seq from users u where u.id = user_id)) bad")
    [ "$errors" = 0 ] || { echo "seq gaps after the push run" >&2; exit 1; }
    add_round push "$(python3 -c "print(round($rps * 100))")" "$ceiling"
  done

  echo "== push transaction without the server (informational): pgbench push_transaction.sql"
  psql "$url" -c "insert into users (id, email) select ('00000000-0000-4000-8000-' || lpad(n::text, 12, '0'))::uuid,
    'pgbench' || n || '@bench.example' from generate_series(1, $users) n"
  checkpoint
  tps=$(PGOPTIONS="-c role=trunk_sync_app" run_pgbench push-transaction "$here/push_transaction.sql" -D users="$users")
  same[push]=$(python3 -c "print(round($tps * 100))")
fi

# 2 and 3. Pull: a $log_events-event log for one user, loaded with SQL as pushes would store it.
echo "== loading $log_events events for the pull user"
psql "$url" -v uid="$pull_user" -v n="$log_events" <<'SQL'
begin;
insert into events (user_id, seq, type, payload, client_id, client_timestamp, created_at)
select :'uid', n, 'sprout_planted',
       '{"plant":"fern","bed":3,"x":12.5,"y":7,"tags":["shade","wet"],"note":"watered after the rain"}',
       gen_random_uuid(), timestamptz '2026-01-01 00:00:00+00' + n * interval '1 second',
       date_trunc('milliseconds', now()) - interval '1 day' + n * interval '1 millisecond'
from generate_series(1, :n) n;
update users set last_seq = :n,
       last_event_at = date_trunc('milliseconds', now()) - interval '1 day' + :n * interval '1 millisecond'
where id = :'uid';
commit;
analyze;
SQL
checkpoint
max_after=$((log_events - page))
curl -fsS -H "Authorization: Bearer $pull_token" "$base/sync/v1/events?after=$max_after&limit=$page" \
  | python3 -c "import json, sys; r = json.load(sys.stdin); assert len(r['events']) == $page and r['next_after'] == $log_events, r['next_after']"

if wanted pull; then
  for round in $(seq 1 "$rounds"); do
    echo "== pull ceiling ($round/$rounds): pgbench select ... order by seq limit $page, random cursor"
    # Planned once (generic), like the server's pull: with PostgreSQL's default the select
    # is re-planned on every execution (its generic estimate for `seq > $2` stays high),
    # which is no ceiling.
    tps=$(PGOPTIONS="-c plan_cache_mode=force_generic_plan" run_pgbench pull-ceiling "$here/pull_ceiling.sql" \
      -D uid="$pull_user" -D max_after="$max_after")
    ceiling=$(python3 -c "print(round($tps * $page))")
    echo "== pull ($round/$rounds): wrk -t2 -c$connections, limit=$page, random after in 0..$max_after"
    rps=$(BENCH_TOKEN=$pull_token BENCH_LIMIT=$page BENCH_AFTER_MAX=$max_after \
      run_wrk "$work/pull-$round.txt" -t2 -c"$connections" -d"${duration}s" -s "$here/pull.lua" "$base")
    add_round pull "$(python3 -c "print(round($rps * $page))")" "$ceiling"
  done
  echo "== pull transaction without the server (informational): pgbench pull_transaction.sql"
  tps=$(PGOPTIONS="-c role=trunk_sync_app" run_pgbench pull-transaction "$here/pull_transaction.sql" \
    -D uid="$pull_user" -D uidtext="$pull_user" -D max_after="$max_after")
  same[pull]=$(python3 -c "print(round($tps * $page))")
fi
if wanted empty; then
  for round in $(seq 1 "$rounds"); do
    echo "== empty pull ceiling ($round/$rounds): pgbench the same select after the last seq"
    tps=$(PGOPTIONS="-c plan_cache_mode=force_generic_plan" run_pgbench empty-ceiling "$here/empty_ceiling.sql" \
      -D uid="$pull_user" -D last="$log_events")
    ceiling=$(python3 -c "print(round($tps))")
    echo "== empty pull ($round/$rounds): wrk -t2 -c$connections, after=$log_events"
    rps=$(BENCH_TOKEN=$pull_token BENCH_LIMIT=$page BENCH_AFTER=$log_events \
      run_wrk "$work/empty-$round.txt" -t2 -c"$connections" -d"${duration}s" -s "$here/pull.lua" "$base")
    add_round empty "$rps" "$ceiling"
    # Known empty from the notifications, the empty pull is answered from memory; a pull
    # of the newest event alone always reads the database: that path against the same
    # ceiling.
    echo "== pull of one new event ($round/$rounds): wrk -t2 -c$connections, after=$((log_events - 1))"
    rps=$(BENCH_TOKEN=$pull_token BENCH_LIMIT=$page BENCH_AFTER=$((log_events - 1)) \
      run_wrk "$work/one-$round.txt" -t2 -c"$connections" -d"${duration}s" -s "$here/pull.lua" "$base")
    add_round one "$rps" "$ceiling"
  done
  echo "== empty pull transaction without the server (informational): pgbench empty_transaction.sql"
  tps=$(PGOPTIONS="-c role=trunk_sync_app" run_pgbench empty-transaction "$here/empty_transaction.sql" \
    -D uid="$pull_user" -D uidtext="$pull_user" -D last="$log_events")
  same[empty]=$(python3 -c "print(round($tps))")
  same[one]=${same[empty]}
fi

# 4. Latency at half the maximum rate: each connection pauses between requests (wrk's
# `delay`) so that all of them together send half the requests/s measured above; p50/p99
# from wrk. Goal: p99 <= 10 ms for push and pull (issue #25; 20 ms before), and the empty pull.
declare -A p99
if wanted latency && [ -n "${figure[push]:-}" ] && [ -n "${figure[empty]:-}" ]; then
  half_delay() { python3 -c "print(max(1, round($connections * 1000 / ($1 / 2))))"; }
  delay=$(half_delay "$(python3 -c "print(${figure[push]} / 100)")")
  echo "== push at half its rate: $connections connections, one request each per $delay ms (mean)"
  checkpoint
  BENCH_TOKENS=$work/tokens BENCH_CONNECTIONS=$connections BENCH_EVENTS=100 BENCH_DELAY_MS=$delay \
    run_wrk "$work/push-half.txt" -t"$connections" -c"$connections" -d"${duration}s" -s "$here/push.lua" "$base" >/dev/null
  p99[push]=$(awk '$1 == "99%" { print $2 }' "$work/push-half.txt")
  # The reference: the ceiling's bare insert at the same rate (pgbench --rate, Poisson
  # arrivals like the scripts' pauses).
  rate=$(python3 -c "print(max(1, round(${figure[push]} / 100 / 2)))")
  echo "== push ceiling at the same rate: pgbench --rate $rate -c $connections"
  checkpoint
  p99[push-ceiling]=$(pgbench_latency push-ceiling "$here/push_ceiling.sql" "$rate" -D users="$users")
  delay=$(half_delay "${figure[empty]}")
  echo "== empty pull at half its rate: $connections connections, one request each per $delay ms"
  BENCH_TOKEN=$pull_token BENCH_LIMIT=$page BENCH_AFTER=$log_events BENCH_DELAY_MS=$delay \
    run_wrk "$work/empty-half.txt" -t2 -c"$connections" -d"${duration}s" -s "$here/pull.lua" "$base" >/dev/null
  p99[empty]=$(awk '$1 == "99%" { print $2 }' "$work/empty-half.txt")
  if [ -n "${figure[pull]:-}" ]; then
    delay=$(half_delay "$(python3 -c "print(${figure[pull]} / $page)")")
    echo "== pull at half its rate: $connections connections, one request each per $delay ms"
    BENCH_TOKEN=$pull_token BENCH_LIMIT=$page BENCH_AFTER_MAX=$max_after BENCH_DELAY_MS=$delay \
      run_wrk "$work/pull-half.txt" -t2 -c"$connections" -d"${duration}s" -s "$here/pull.lua" "$base" >/dev/null
    p99[pull]=$(awk '$1 == "99%" { print $2 }' "$work/pull-half.txt")
    rate=$(python3 -c "print(max(1, round(${figure[pull]} / $page / 2)))")
    echo "== pull ceiling at the same rate: pgbench --rate $rate -c $connections"
    p99[pull-ceiling]=$(PGOPTIONS="-c plan_cache_mode=force_generic_plan" pgbench_latency pull-ceiling \
      "$here/pull_ceiling.sql" "$rate" -D uid="$pull_user" -D max_after="$max_after")
  fi
fi

echo
echo "bench/sync $(date -u +%Y-%m-%d) — ${duration}s per measurement, $rounds rounds, $(nproc) cores, commit $(git rev-parse --short HEAD)"
# The ratio and goal compare with the ceiling; "same tx" is pgbench running the server's own
# transaction (scope, lock, RLS, ...), to tell Postgres's share of the gap from the server's.
# trunk-sync and ceiling: the medians of the rounds; ratio: the median of the rounds' ratios
# and their spread.
printf '%-11s %14s %16s %6s %11s %5s %18s\n' measure trunk-sync ceiling ratio spread goal "same tx (ratio)"
row() {
  local name=$1 unit=$2 refunit=$3 goal=$4 value ref tx
  value=$(printf '%.0f' "${figure[$name]}"); ref=${reference[$name]}; tx=${same[$name]}
  printf '%-11s %14s %16s %6s %11s %5s %18s\n' "$5" "$value $unit" "$ref $refunit" "$(median_of "$name" 2)" \
    "$(spread "$name")" "$goal" "$tx ($(ratio "$value" "$tx"))"
}
wanted push && row push ev/s rows/s 0.80 push
wanted pull && row pull ev/s rows/s 0.80 pull
wanted empty && row empty req/s q/s 0.70 empty-pull
wanted empty && row one req/s q/s 0.50 "  one new"
if [ -n "${p99[push]:-}" ]; then
  echo "p99 at half the maximum rate (goal 10ms): push ${p99[push]} (the ceiling's insert at that rate: ${p99[push-ceiling]}), pull ${p99[pull]:-not measured} (the ceiling's select: ${p99[pull-ceiling]:-not measured}), empty pull ${p99[empty]} (pool $pool)"
fi
echo "latencies and raw outputs: rerun with BENCH_KEEP=1 and see $work"
