#!/usr/bin/env bash
# bench/auth: sign-in routes per second against a real mail sink — POST /auth/v1/otp (a code
# mailed to a new address), POST /auth/v1/verify (with the code the sink received) and
# POST /auth/v1/token?grant_type=refresh_token — each measured apart at its maximum rate,
# then at a fixed fraction of it for p50/p99, over many distinct users. See bench/README.md.
#
#   bench/auth/run.sh                        this tree against pgbench running the routes'
#                                            own statements, rounds alternated (~6 minutes)
#   bench/auth/run.sh --baseline OTHER_BIN   this tree against another trunk-sync binary
#                                            (A/B), rounds alternated; BENCH_PGBENCH=1 adds
#                                            the pgbench rounds too; the baseline migrates
#                                            its database with its checkout's migrations/
#                                            (or BENCH_BASELINE_MIGRATIONS)
#   BENCH_ROUNDS=3 BENCH_DURATION=5 ...      rounds per side (2), seconds per stage (10)
#   BENCH_CONNECTIONS (16), BENCH_POOL_SIZE (TRUNK_SYNC_DB_POOL_SIZE, 16),
#   BENCH_FRACTION (0.5: the latency stages' share of the maximum rate)
#   BENCH_PGBENCH_MODE (prepared; extended: each statement parsed and planned every time)
#   BENCH_KEEP=1 ...                         keep the work directory (raw outputs)
#
# Needs cc, python3, curl and the PostgreSQL 15 server and client binaries (pgbench).
# Loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/auth
. bench/common/lib.sh

baseline=
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) baseline=${2:?--baseline needs a trunk-sync binary}; shift 2 ;;
    *) echo "usage: bench/auth/run.sh [--baseline PATH_TO_OTHER_TRUNK_SYNC]" >&2; exit 2 ;;
  esac
done
declare -A migrations=([tree]=$PWD/migrations)
if [ -n "$baseline" ]; then
  [ -x "$baseline" ] || { echo "bench: $baseline is not an executable" >&2; exit 2; }
  baseline=$(cd "$(dirname "$baseline")" && pwd)/$(basename "$baseline")
  # The baseline's own migrations: BENCH_BASELINE_MIGRATIONS, else those of the checkout it
  # was built in (the nearest directory above it with migrations/ and Package.swift).
  migrations[baseline]=${BENCH_BASELINE_MIGRATIONS:-}
  if [ -z "${migrations[baseline]}" ]; then
    dir=$(dirname "$baseline")
    while [ "$dir" != / ] && ! { [ -d "$dir/migrations" ] && [ -f "$dir/Package.swift" ]; }; do dir=$(dirname "$dir"); done
    [ "$dir" != / ] || { echo "bench: no migrations/ above $baseline; set BENCH_BASELINE_MIGRATIONS" >&2; exit 2; }
    migrations[baseline]=$dir/migrations
  fi
  echo "== baseline migrations: ${migrations[baseline]}" >&2
fi

duration=${BENCH_DURATION:-10}
rounds=${BENCH_ROUNDS:-2}
connections=${BENCH_CONNECTIONS:-16}
pool=${BENCH_POOL_SIZE:-16}
fraction=${BENCH_FRACTION:-0.5}
# pgbench's protocol: prepared statements (parsed and planned once per connection) by default;
# `extended` parses and plans each statement each time, as PQexecParams does.
pgbench_mode=${BENCH_PGBENCH_MODE:-prepared}
with_pgbench=$([ -z "$baseline" ] || [ "${BENCH_PGBENCH:-}" = 1 ] && echo 1 || echo 0)
# Requests prepared per stage: more than any stage can send in $duration s here.
prepared=$((duration * 6000))
for tool in cc python3 curl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done
[ -x "$pgbin/pgbench" ] || { echo "bench: pgbench not found in $pgbin" >&2; exit 1; }

bench_build
work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-bench-auth.XXXXXX")
cc -O2 -Wall -o "$work/driver" "$here/driver.c" -lm
cc -O2 -Wall -o "$work/sink" "$here/sink.c"
declare -A server_pid server_port database
sink_pid=
cleanup() {
  for pid in "${server_pid[@]}" "$sink_pid"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${server_pid[@]}" "$sink_pid"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  if [ "${BENCH_KEEP:-}" = 1 ]; then echo "kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Real durability (PG_FAST unset: fsync, synchronous_commit, full_page_writes on): every
# sign-in request commits two or three transactions, and their flushes are part of its cost.
env -u PG_FAST scripts/pg.sh start "$work/pg" "$(free_port)"
admin_url=$(scripts/pg.sh url "$work/pg" postgres)
psql() { command "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# The mail sink (bench/auth/sink.c): every code it receives goes to $work/codes.
: >"$work/codes"
"$work/sink" "$work/codes" >"$work/sink.out" 2>&1 &
sink_pid=$!
for _ in $(seq 1 100); do
  grep -q '^ready ' "$work/sink.out" 2>/dev/null && break
  kill -0 "$sink_pid" 2>/dev/null || { cat "$work/sink.out" >&2; exit 1; }
  sleep 0.1
done
sink_port=$(sed -n 's/^ready //p' "$work/sink.out")
[ -n "$sink_port" ] || { echo "bench: the mail sink did not start" >&2; exit 1; }

export TRUNK_SYNC_PUBLIC_URL=http://bench.invalid
export TRUNK_SYNC_JWT_SECRET
TRUNK_SYNC_JWT_SECRET=$(head -c 48 /dev/urandom | base64 | tr -d '\n')
# The shipped defaults but for: the mailer (SMTP to the sink, no TLS on loopback), the
# database pool (as bench/sync), a mail queue that holds a whole stage's mails, codes valid
# for the whole run, and every sign-in rate limit raised so far that no request of the run
# reaches it — the counters are still counted (the same statements run), but what is
# measured is the routes, not the limits. The windows stay the shipped ones.
settings=(
  TRUNK_SYNC_LOG_LEVEL=notice TRUNK_SYNC_DB_POOL_SIZE="$pool"
  TRUNK_SYNC_MAILER=smtp TRUNK_SYNC_SMTP_URL="smtp://127.0.0.1:$sink_port?tls=none"
  TRUNK_SYNC_MAIL_FROM=bench@bench.example TRUNK_SYNC_MAIL_QUEUE_SIZE=100000
  TRUNK_SYNC_OTP_EXPIRY=3600
  TRUNK_SYNC_RATE_LIMIT_OTP=1000000000/300 TRUNK_SYNC_RATE_LIMIT_VERIFY=1000000000/300
  TRUNK_SYNC_RATE_LIMIT_TOKEN=1000000000/300 TRUNK_SYNC_RATE_LIMIT_OTP_EMAIL=1000000000/3600
  TRUNK_SYNC_RATE_LIMIT_VERIFY_EMAIL=1000000000/3600 TRUNK_SYNC_RATE_LIMIT_MAIL=1000000000/3600
)

# Each server binary gets a database of its own in the cluster, migrated by that binary.
start_server() {  # NAME BINARY
  psql "$admin_url" -c "create database $1"
  database[$1]=$(scripts/pg.sh url "$work/pg" "$1")
  TRUNK_SYNC_DATABASE_URL=${database[$1]} TRUNK_SYNC_MIGRATIONS_DIR=${migrations[$1]} "$2" migrate \
    >"$work/migrate-$1.log" 2>&1 || { cat "$work/migrate-$1.log" >&2; exit 1; }
  bench_serve "$work/serve-$1.log" "$2" TRUNK_SYNC_DATABASE_URL="${database[$1]}" \
    TRUNK_SYNC_MIGRATIONS_DIR="${migrations[$1]}" "${settings[@]}"
  server_pid[$1]=$served_pid
  server_port[$1]=$served_port
  echo "== $1: $2 on port $served_port" >&2
}
sides=(tree)
start_server tree "$bin"
if [ -n "$baseline" ]; then
  start_server baseline "$baseline"
  sides+=(baseline)
fi
if [ "$with_pgbench" = 1 ]; then
  sides+=(pgbench)
  psql "$admin_url" -c "create database pgbench_auth"
  database[pgbench]=$(scripts/pg.sh url "$work/pg" pgbench_auth)
  TRUNK_SYNC_DATABASE_URL=${database[pgbench]} "$bin" migrate >"$work/migrate-pgbench.log" 2>&1 \
    || { cat "$work/migrate-pgbench.log" >&2; exit 1; }
fi
echo "== postgres $(psql "$admin_url" -At -c "select string_agg(name || '=' || setting, ' ' order by name) from pg_settings
  where name in ('fsync','synchronous_commit','full_page_writes','shared_buffers','server_version')")" >&2

# --- one stage of a server: the driver, with CPU and mail accounting --------------------------
proc_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); split($0, f, " "); printf "%.2f", (f[12] + f[13]) / hz }' "/proc/$1/stat"; }
field() { awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }' <<<"$2"; }
declare -A result  # result[side,round,stage] = the driver's or pgbench's line

# drive SIDE ROUND STAGE REQUESTS [driver options…]: runs the driver against SIDE's server,
# records its line plus CPU per request (cluster, server, sink).
drive() {
  local side=$1 round=$2 stage=$3 requests=$4
  shift 4
  local before after sink_before line count
  before=$(bench_cpu "$work/pg/pgdata" "${server_pid[$side]}")
  sink_before=$(proc_cpu "$sink_pid")
  line=$("$work/driver" 127.0.0.1 "${server_port[$side]}" "$connections" "$requests" "$@" 2>"$work/driver.err") \
    || { echo "bench: $side $stage: $line" >&2; cat "$work/driver.err" >&2; exit 1; }
  after=$(bench_cpu "$work/pg/pgdata" "${server_pid[$side]}")
  count=$(field requests "$line")
  line+=" $(python3 -c "b, a, n, s, sa, t = '$before'.split(), '$after'.split(), max(1, $count), $sink_before, $(proc_cpu "$sink_pid"), $(field seconds "$line")
print(f'pg_us {(float(a[0]) - float(b[0])) / n * 1e6:.0f} server_us {(float(a[1]) - float(b[1])) / n * 1e6:.0f} sink_busy {(sa - s) / max(t, 0.01) * 100:.0f}')")"
  result[$side,$round,$stage]=$line
  echo "   $side $stage: $line" >&2
}

# The codes the sink received for addresses starting with PREFIX, as verify requests.
# Waits (up to 60 s) until there are EXPECTED of them; records how long the mail lagged.
codes_for() {  # PREFIX EXPECTED OUT SIDE ROUND STAGE
  local started got=0
  started=$(date +%s.%N)
  for _ in $(seq 1 600); do
    got=$(grep -c "^$1" "$work/codes" || true)
    [ "$got" -ge "$2" ] && break
    sleep 0.1
  done
  [ "$got" -ge "$2" ] || { echo "bench: the sink received $got of $2 codes for $1 (mails dropped?)" >&2; exit 1; }
  result[$4,$5,$6]+=" mail_lag $(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')")"
  grep "^$1" "$work/codes" | awk '{ printf "/auth/v1/verify {\"email\":\"%s\",\"token\":\"%s\",\"type\":\"email\"}\n", $1, $2 }' >"$3"
}

addresses() {  # PREFIX → $prepared otp requests for new addresses
  seq 1 "$prepared" | awk -v p="$1" '{ printf "/auth/v1/otp {\"email\":\"%s%d@bench.example\",\"create_user\":true}\n", p, $1 }'
}

pause_for() {  # MAX_RATE → the mean pause (ms) per connection for $fraction of it
  python3 -c "print(f'{$connections * 1000 / ($1 * $fraction):.2f}')"
}

server_round() {  # SIDE ROUND
  local side=$1 round=$2 prefix="$1-r$2"
  local max_otp max_verify max_refresh
  echo "== round $round, $side (load $(cut -d" " -f1-3 /proc/loadavg))" >&2
  addresses "$prefix-max-" >"$work/otp-max.req"
  drive "$side" "$round" otp "$work/otp-max.req" -d "$duration"
  codes_for "$prefix-max-" "$(field requests "${result[$side,$round,otp]}")" "$work/verify-max.req" "$side" "$round" otp
  max_otp=$(field rate "${result[$side,$round,otp]}")
  addresses "$prefix-low-" >"$work/otp-low.req"
  drive "$side" "$round" otp-low "$work/otp-low.req" -d "$duration" -p "$(pause_for "$max_otp")"
  codes_for "$prefix-low-" "$(field requests "${result[$side,$round,otp-low]}")" "$work/verify-low.req" "$side" "$round" otp-low

  drive "$side" "$round" verify "$work/verify-max.req" -d "$duration" -o "$work/sessions-max"
  max_verify=$(field rate "${result[$side,$round,verify]}")
  drive "$side" "$round" verify-low "$work/verify-low.req" -d "$duration" -p "$(pause_for "$max_verify")" \
    -o "$work/sessions-low"

  drive "$side" "$round" refresh "$work/sessions-max" -r -d "$duration"
  max_refresh=$(field rate "${result[$side,$round,refresh]}")
  drive "$side" "$round" refresh-low "$work/sessions-low" -r -d "$duration" -p "$(pause_for "$max_refresh")"
}

# --- the reference: the routes' statements by pgbench at the same concurrency ---------------
# pgbench_stage ROUND STAGE SCRIPT BASE [RATE]: at the maximum rate, or at RATE/s (p50/p99
# from its per-transaction log, which counts the lag behind its schedule too).
pgbench_stage() {
  local round=$1 stage=$2 script=$3 base=$4 rate=${5:-} before after out count tps line started
  local options=(-n -M "$pgbench_mode" -c "$connections" -j 2 -T "$duration" -f "$here/$script"
    -D clients="$connections" -D base="$base" -D i=0 -D expires=$(($(date +%s) + 3600)))
  [ -n "$rate" ] && options+=(-R "$rate" -l --log-prefix="$work/pgbench-log/log")
  rm -rf "$work/pgbench-log"; mkdir -p "$work/pgbench-log"
  out=$work/pgbench-$stage.txt
  started=$(psql "${database[pgbench]}" -At -c "select now()")
  before=$(bench_cpu "$work/pg/pgdata" "$$")
  PGOPTIONS="-c role=trunk_sync_app" "$pgbin/pgbench" "${options[@]}" "${database[pgbench]}" >"$out" 2>&1 \
    || { cat "$out" >&2; exit 1; }
  after=$(bench_cpu "$work/pg/pgdata" "$$")
  tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' "$out" | tail -n 1)
  count=$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$out")
  if grep -qE '^number of failed transactions: [1-9]' "$out"; then
    cat "$out" >&2; echo "bench: pgbench $stage had failed transactions" >&2; exit 1
  fi
  # Each transaction did what the route does: a code consumed, a token rotated.
  local done=$count
  case "$stage" in
    verify*) done=$(psql "${database[pgbench]}" -At -c "select count(*) from otp_codes where consumed_at >= '$started'") ;;
    refresh*) done=$(psql "${database[pgbench]}" -At -c "select count(*) from refresh_tokens where rotated_at >= '$started'") ;;
  esac
  [ "$done" = "$count" ] || { echo "bench: pgbench $stage: $count transactions but $done codes or tokens used" >&2; exit 1; }
  line="requests $count errors 0 seconds $duration rate $tps"
  if [ -n "$rate" ]; then
    line+=" $(cat "$work/pgbench-log"/log.* | awk '{ print $3 / 1000 }' | sort -n |
      awk '{ v[NR] = $1 } END { printf "p50 %.2f p90 %.2f p99 %.2f max %.2f", v[int(NR * 0.5) + 1], v[int(NR * 0.9) + 1], v[int(NR * 0.99) + 1], v[NR] }')"
  fi
  line+=" $(python3 -c "b, a, n = '$before'.split(), '$after'.split(), max(1, $count)
print(f'pg_us {(float(a[0]) - float(b[0])) / n * 1e6:.0f}')")"
  result[pgbench,$round,$stage]=$line
  echo "   pgbench $stage: $line" >&2
}

# Codes for N new addresses pgv<n>@bench.example from BASE on, stored as /otp stores them.
pgbench_codes() {  # BASE COUNT
  psql "${database[pgbench]}" -c "insert into otp_codes (email, code_hash, created_at, expires_at)
    select 'pgv' || n || '@bench.example', decode(lpad(to_hex(n), 64, '0'), 'hex'), now() - interval '2 minutes',
           now() + interval '1 hour'
    from generate_series($1::int8, $1::int8 + $2) n"
}
# One user, session and first refresh token per pgbench client, numbered BASE + client.
pgbench_sessions() {  # BASE
  psql "${database[pgbench]}" -c "
    with u as (insert into users (email, email_confirmed_at) select 'pgr' || n || '@bench.example', now()
               from generate_series($1::int8, $1::int8 + $connections - 1) n returning id, email),
         s as (insert into sessions (user_id, access_expires_at) select id, now() + interval '1 hour' from u
               returning id, user_id)
    insert into refresh_tokens (session_id, user_id, token_hash)
    select s.id, s.user_id, decode(lpad(to_hex(substring(u.email from 4 for position('@' in u.email) - 4)::int8), 64, '0'), 'hex')
    from s join u on u.id = s.user_id"
}

# The rate the tree's latency stage STAGE reached in this round (or the one before, when
# pgbench goes first): the reference's latency stage runs at that rate.
server_rate() {  # ROUND STAGE
  local r
  for r in "$1" $(($1 - 1)); do
    [ -n "${result[tree,$r,$2]:-}" ] && { printf '%.0f\n' "$(field rate "${result[tree,$r,$2]}")"; return; }
  done
  echo 100
}

pgbench_round() {  # ROUND
  local round=$1 base=$(($1 * 100000000)) rate
  echo "== round $round, pgbench (load $(cut -d" " -f1-3 /proc/loadavg))" >&2
  pgbench_stage "$round" otp otp_transaction.sql "$base"
  rate=$(server_rate "$round" otp-low)
  pgbench_stage "$round" otp-low otp_transaction.sql $((base + 10000000)) "$rate"
  pgbench_codes $((base + 20000000)) "$prepared"
  pgbench_stage "$round" verify verify_transaction.sql $((base + 20000000))
  pgbench_codes $((base + 30000000)) "$prepared"
  rate=$(server_rate "$round" verify-low)
  pgbench_stage "$round" verify-low verify_transaction.sql $((base + 30000000)) "$rate"
  pgbench_sessions $((base + 40000000))
  pgbench_stage "$round" refresh refresh_transaction.sql $((base + 40000000))
  pgbench_sessions $((base + 50000000))
  rate=$(server_rate "$round" refresh-low)
  pgbench_stage "$round" refresh-low refresh_transaction.sql $((base + 50000000)) "$rate"
}

# A quick check that sign-in works end to end before measuring anything.
for side in tree ${baseline:+baseline}; do
  curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' -d '{"email":"check@bench.example"}' \
    "http://127.0.0.1:${server_port[$side]}/auth/v1/otp" || { echo "bench: $side refuses /otp" >&2; exit 1; }
done

loads=()
for round in $(seq 1 "$rounds"); do
  # Rounds alternate which side goes first.
  order=("${sides[@]}")
  [ $((round % 2)) = 0 ] && order=($(printf '%s\n' "${sides[@]}" | tac))
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  for side in "${order[@]}"; do
    if [ "$side" = pgbench ]; then pgbench_round "$round"; else server_round "$side" "$round"; fi
    psql "$admin_url" -c checkpoint
  done
done
loads+=("$(cut -d' ' -f1 /proc/loadavg)")

# --- summary ---------------------------------------------------------------------------------
echo
echo "bench/auth $(date -u '+%Y-%m-%d %H:%M') UTC — commit $(git rev-parse --short HEAD), $(nproc) cores, load ${loads[*]}," \
  "$rounds rounds of ${duration}s stages, $connections connections, pool $pool, latency at ${fraction} of the maximum"
reference=pgbench
[ -n "$baseline" ] && reference=baseline
for key in "${!result[@]}"; do echo "${key//,/ } ${result[$key]}"; done >"$work/results"
python3 "$here/summary.py" "$work/results" "$reference" "$rounds" "${sides[@]}"
