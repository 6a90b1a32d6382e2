#!/usr/bin/env bash
# `make bench`: the HTTP layer against nginx on GET /healthz, then trunk-sync's memory with
# 5,000 idle keep-alive connections. See bench/README.md for what it measures and results.
#
# Environment: BENCH_DURATION (wrk seconds per round, default 10), BENCH_ROUNDS (rounds of
# nginx + trunk-sync, default 2), BENCH_CONNECTIONS (wrk -c, default 64), BENCH_IDLE
# (idle connections, default 5000), BENCH_WRK_THREADS (wrk -t, default 1), BENCH_BIN (a
# trunk-sync binary to measure instead of building this tree's, for an A/B against another
# tree). Needs wrk, nginx, PostgreSQL and python3:
#   apt-get install wrk nginx-light postgresql python3
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/common/lib.sh

duration=${BENCH_DURATION:-10}
rounds=${BENCH_ROUNDS:-2}
wrk_connections=${BENCH_CONNECTIONS:-64}
idle=${BENCH_IDLE:-5000}
wrk_threads=${BENCH_WRK_THREADS:-1}

for tool in wrk nginx python3 psql curl; do
  command -v "$tool" >/dev/null || PATH="$PATH:/usr/sbin" command -v "$tool" >/dev/null \
    || { echo "bench: $tool not found (apt-get install wrk nginx-light postgresql python3 curl)" >&2; exit 1; }
done
nginx_bin=$(PATH="$PATH:/usr/sbin" command -v nginx)

# Idle connections need descriptors on both sides (the server raises its own limit too).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -le $((idle + 100)) ]; then
  echo "bench: ulimit -n is $(ulimit -n), need more than $((idle + 100)) for $idle connections" >&2
  exit 1
fi

bench_build

work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-bench.XXXXXX")
server_pid=""
nginx_pid=""
client_pid=""
cleanup() {
  for pid in "$client_pid" "$server_pid" "$nginx_pid"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  for pid in "$client_pid" "$server_pid" "$nginx_pid"; do
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  done
  scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for_http() {  # URL: up to 20 s
  for _ in $(seq 1 200); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "bench: $1 does not answer" >&2
  return 1
}

rss_kib() {  # PID
  awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

mib() {  # KiB → MiB with one decimal
  awk -v kib="$1" 'BEGIN { printf "%.1f", kib / 1024 }'
}

# --- Postgres, migrations, trunk-sync ---------------------------------------------------
echo "== starting PostgreSQL, migrating, starting trunk-sync" >&2
pg_port=$(free_port)
PG_FAST=1 scripts/pg.sh start "$work/pg" "$pg_port"
psql "$(scripts/pg.sh url "$work/pg" postgres)" -qc "create database trunk_sync"
export TRUNK_SYNC_DATABASE_URL
TRUNK_SYNC_DATABASE_URL=$(scripts/pg.sh url "$work/pg" trunk_sync)
export TRUNK_SYNC_JWT_SECRET
TRUNK_SYNC_JWT_SECRET=$(head -c 48 /dev/urandom | base64 | tr -d '\n')
"$bin" migrate >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log" >&2; exit 1; }

# The shipped defaults: metrics on and the access log at its default level (`info`), written
# to a file as an operator's log would be. BENCH_LOG_LEVEL=notice turns the access log off
# for comparison (nginx runs with `access_log off`).
bench_serve "$work/server.log" "$bin" TRUNK_SYNC_LOG_LEVEL="${BENCH_LOG_LEVEL:-info}"
server_pid=$served_pid ts_port=$served_port

# --- nginx: one worker per core, the same JSON from memory --------------------------------
nginx_port=$(free_port)
mkdir -p "$work/nginx/logs"
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    server {
        listen 127.0.0.1:$nginx_port;
        location = /healthz {
            default_type application/json;
            return 200 '{"status":"ok"}';
        }
    }
}
EOF
"$nginx_bin" -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' 2>"$work/nginx/logs/stderr.log" &
nginx_pid=$!

ts_url="http://127.0.0.1:$ts_port/healthz"
nginx_url="http://127.0.0.1:$nginx_port/healthz"
wait_for_http "$nginx_url"
wait_for_http "$ts_url"
for url in "$nginx_url" "$ts_url"; do
  body=$(curl -fsS "$url")
  [ "$body" = '{"status":"ok"}' ] || { echo "bench: $url answered $body" >&2; exit 1; }
done
rss_start=$(rss_kib "$server_pid")

# --- Throughput -----------------------------------------------------------------------------
# CPU ticks of processes, "user system": the server (all its threads), nginx's workers.
cpu_ticks() {  # PID…
  local user=0 system=0 pid fields
  for pid in "$@"; do
    read -r -a fields <<<"$(awk '{ sub(/^.*\) /, ""); split($0, f, " "); print f[12], f[13] }' "/proc/$pid/stat")"
    user=$((user + fields[0]))
    system=$((system + fields[1]))
  done
  echo "$user $system"
}
nginx_workers() { cat "/proc/$nginx_pid/task/$nginx_pid/children"; }

# run_wrk NAME URL SECONDS [PID…] → prints "requests/s CPU-µs-per-request user-µs system-µs"
# (CPU of PIDs during the run: steadier than requests/s on a shared machine; user space is
# what the server's own code costs, system what the kernel does for it; "- - -" without PIDs).
run_wrk() {
  local output before after requests pids
  pids=("${@:4}")
  read -r -a before <<<"$(cpu_ticks "${pids[@]}")"
  output=$(wrk -t"$wrk_threads" -c"$wrk_connections" -d"$3"s "$2")
  read -r -a after <<<"$(cpu_ticks "${pids[@]}")"
  echo "$output" >>"$work/wrk-$1.log"
  if echo "$output" | grep -qE "Non-2xx|Socket errors"; then
    echo "bench: $1: $(echo "$output" | grep -E 'Non-2xx|Socket errors' | tr -s ' ')" >&2
  fi
  requests=$(echo "$output" | awk '/ requests in / { print $1 }')
  echo "$output" | awk -v user=$((after[0] - before[0])) -v kernel=$((after[1] - before[1])) \
    -v hz="$(getconf CLK_TCK)" -v n="$requests" -v pids=${#pids[@]} \
    '/^Requests\/sec:/ {
      if (pids > 0 && n > 0) {
        u = user / hz * 1e6 / n; s = kernel / hz * 1e6 / n
        printf "%.0f %.2f %.2f %.2f", $2, u + s, u, s
      } else printf "%.0f - - -", $2
    }'
}

echo "== warm-up (2 s each)" >&2
run_wrk warmup "$nginx_url" 2 >/dev/null
run_wrk warmup "$ts_url" 2 >/dev/null

echo "== wrk -t$wrk_threads -c$wrk_connections -d${duration}s GET /healthz, $rounds rounds (load before: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
nginx_results=()
ts_results=()
nginx_cpu=()
ts_cpu=()
nginx_user=()
ts_user=()
read -r -a workers <<<"$(nginx_workers)"
for round in $(seq 1 "$rounds"); do
  read -r n n_cpu n_user n_sys <<<"$(run_wrk nginx "$nginx_url" "$duration" "${workers[@]}")"
  nginx_results+=("$n")
  nginx_cpu+=("$n_cpu")
  nginx_user+=("$n_user")
  echo "round $round  nginx       $n req/s  $n_cpu µs CPU/request (user $n_user, system $n_sys)"
  read -r t t_cpu t_user t_sys <<<"$(run_wrk trunk-sync "$ts_url" "$duration" "$server_pid")"
  ts_results+=("$t")
  ts_cpu+=("$t_cpu")
  ts_user+=("$t_user")
  : >"$work/server.log"  # the access log of a round is ~150 MB; appended to, so truncating is safe
  echo "round $round  trunk-sync  $t req/s  $t_cpu µs CPU/request (user $t_user, system $t_sys)"
done
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.0f", s / NR }'; }
mean2() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.2f", s / NR }'; }
nginx_mean=$(mean "${nginx_results[@]}")
ts_mean=$(mean "${ts_results[@]}")
nginx_cpu_mean=$(mean2 "${nginx_cpu[@]}")
ts_cpu_mean=$(mean2 "${ts_cpu[@]}")
nginx_user_mean=$(mean2 "${nginx_user[@]}")
ts_user_mean=$(mean2 "${ts_user[@]}")
ratio=$(awk -v t="$ts_mean" -v n="$nginx_mean" 'BEGIN { printf "%.2f", t / n }')

# --- Memory with idle keep-alive connections -----------------------------------------------
rss_baseline=$(rss_kib "$server_pid")
echo "== opening $idle idle keep-alive connections to trunk-sync" >&2
python3 bench/http/idle_clients.py 127.0.0.1 "$ts_port" "$idle" "$work/idle.ready" &
client_pid=$!
bench_wait_ready "$work/idle.ready" "$client_pid" 120 idle
sleep 1
rss_idle=$(rss_kib "$server_pid")
kill "$client_pid" 2>/dev/null || true
wait "$client_pid" 2>/dev/null || true
client_pid=""
per_connection=$(awk -v a="$rss_idle" -v b="$rss_baseline" -v n="$idle" 'BEGIN { printf "%.1f", (a - b) / n }')

kill -0 "$server_pid" 2>/dev/null || { echo "bench: trunk-sync died" >&2; cat "$work/server.log" >&2; exit 1; }

# --- Summary --------------------------------------------------------------------------------
cat <<EOF

date                    $(date -u +%FT%TZ)  ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))
nginx (workers: auto)   $nginx_mean req/s  (rounds: ${nginx_results[*]}); $nginx_cpu_mean µs CPU per request (rounds: ${nginx_cpu[*]}; user $nginx_user_mean: ${nginx_user[*]})
trunk-sync              $ts_mean req/s  (rounds: ${ts_results[*]}; event loops: ${TRUNK_SYNC_EVENT_LOOPS:-one per core}, ${TRUNK_SYNC_EVENT_LOOP_SCHEDULING:-batch}); $ts_cpu_mean µs CPU per request (rounds: ${ts_cpu[*]}; user $ts_user_mean: ${ts_user[*]})
ratio trunk-sync/nginx  $ratio  (goal >= 1.0)
RSS at start            $(mib "$rss_start") MiB
RSS after wrk (idle)    $(mib "$rss_baseline") MiB
RSS with $idle idle     $(mib "$rss_idle") MiB  ($per_connection KiB per connection; goal <= 2 KiB)
EOF
