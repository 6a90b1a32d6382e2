#!/usr/bin/env bash
# bench/stream: 10,000 open idle event streams (GET /sync/v1/stream) of many users: the
# server's memory, the time from a commit of one user to the event on every stream of that
# user, and that no other user's stream receives it. See bench/README.md for what it
# measures and the results.
#
# Environment: BENCH_STREAMS (default 10000), BENCH_USERS (default BENCH_STREAMS / 10: ten
# streams per user, the shipped per-user limit; 1 = every stream of one user, the worst
# case), BENCH_COMMITS (pushes measured, each by one user, default 50), BENCH_BIN (a
# trunk-sync binary to measure instead of building this tree's).
# Needs cc, PostgreSQL, curl and python3.
#
# bench/realtime/run.sh runs the same with BENCH_TARGET=realtime: Realtime sockets
# (GET /realtime/v1/websocket, one postgres_changes channel each) instead of event streams.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bench/common/lib.sh

count=${BENCH_STREAMS:-10000}
users=${BENCH_USERS:-$(( count / 10 > 0 ? count / 10 : 1 ))}
commits=${BENCH_COMMITS:-50}
target=${BENCH_TARGET:-stream}
case "$target" in
  stream) client=streams; kind=streams; goal=100 ;;
  realtime) client=sockets; kind=sockets; goal=20 ;;
  *) echo "bench: BENCH_TARGET must be stream or realtime" >&2; exit 1 ;;
esac
if [ "$users" -lt 1 ] || [ "$users" -gt "$count" ]; then
  echo "bench: BENCH_USERS must be between 1 and BENCH_STREAMS ($count)" >&2
  exit 1
fi
per_user=$(( (count + users - 1) / users ))

for tool in cc psql curl python3; do
  command -v "$tool" >/dev/null || { echo "bench: $tool not found" >&2; exit 1; }
done
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -le $((count + 100)) ]; then
  echo "bench: ulimit -n is $(ulimit -n), need more than $((count + 100)) for $count streams" >&2
  exit 1
fi

bench_build
work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-bench-$target.XXXXXX")
cc -O2 -Wall -o "$work/client" "bench/$target/$client.c"

server_pid=""
client_pid=""
cleanup() {
  for pid in "$client_pid" "$server_pid"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "$client_pid" "$server_pid"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
mib() { awk -v kib="$1" 'BEGIN { printf "%.1f", kib / 1024 }'; }
threads() { ls "/proc/$1/task" | wc -l; }

echo "== starting PostgreSQL, migrating, starting trunk-sync" >&2
pg_port=$(free_port)
PG_FAST=1 scripts/pg.sh start "$work/pg" "$pg_port"
psql "$(scripts/pg.sh url "$work/pg" postgres)" -qc "create database trunk_sync"
export TRUNK_SYNC_DATABASE_URL
TRUNK_SYNC_DATABASE_URL=$(scripts/pg.sh url "$work/pg" trunk_sync)
export TRUNK_SYNC_JWT_SECRET
TRUNK_SYNC_JWT_SECRET=$(head -c 48 /dev/urandom | base64 | tr -d '\n')
# The tokens' issuer: the same for `token` and `serve` (whose port is picked at start).
export TRUNK_SYNC_PUBLIC_URL=http://bench.invalid
"$bin" migrate >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log" >&2; exit 1; }
echo "== issuing $users users' tokens" >&2
mkdir "$work/sessions"
# One `token` per user, two at a time (≈ 30 s for 1,000 users). One in a few thousand has
# crashed at exit ("corrupted size vs. prev_size", seen once): said loudly, then tried again.
seq 0 $((users - 1)) | xargs -P 2 -I{} sh -c '
  "$1" token --email "bench{}@example.com" >"$2/{}.json" 2>"$2/{}.err" && exit 0
  echo "bench: trunk-sync token for user {} failed (exit $?): $(head -c 300 "$2/{}.err"); once more" >&2
  "$1" token --email "bench{}@example.com" >"$2/{}.json"' token "$bin" "$work/sessions"
python3 - "$work/sessions" "$users" >"$work/tokens" <<'PY'
import json, sys
for user in range(int(sys.argv[2])):
    with open(f"{sys.argv[1]}/{user}.json") as session:
        print(json.load(session)["access_token"])
PY

# The shipped defaults but for the limits this many streams need: the per-user limit (10)
# only when a user has more streams than that (BENCH_USERS=1); TRUNK_SYNC_STREAM_MAX (5000)
# and TRUNK_SYNC_HTTP_MAX_CONNECTIONS (10000, and the push needs one more connection) only
# above those.
# Realtime: TRUNK_SYNC_REALTIME_MAX (5000) above it, the channels per user (100) above
# those, and the idle timeout (90 s): the client sends no heartbeat while it measures.
limits=()
if [ "$target" = realtime ]; then
  [ "$per_user" -gt 100 ] && limits+=("TRUNK_SYNC_REALTIME_MAX_CHANNELS_PER_USER=$per_user")
  [ "$count" -gt 5000 ] && limits+=("TRUNK_SYNC_REALTIME_MAX=$count")
  limits+=("TRUNK_SYNC_REALTIME_IDLE_TIMEOUT=3600")
else
  [ "$per_user" -gt 10 ] && limits+=("TRUNK_SYNC_STREAM_MAX_PER_USER=$per_user")
  [ "$count" -gt 5000 ] && limits+=("TRUNK_SYNC_STREAM_MAX=$count")
fi
[ $((count + 100)) -gt 10000 ] && limits+=("TRUNK_SYNC_HTTP_MAX_CONNECTIONS=$((count + 100))")
echo "== raised limits: ${limits[*]:-none}" >&2
bench_serve "$work/server.log" "$bin" "${limits[@]}"
server_pid=$served_pid port=$served_port
curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz"
rss_start=$(rss_kib "$server_pid")
threads_start=$(threads "$server_pid")

echo "== opening $count $kind (load before: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
"$work/client" 127.0.0.1 "$port" "$count" "$users" "$work/tokens" "$commits" "$work/ready" "$work/go" >"$work/client.out" &
client_pid=$!
for _ in $(seq 1 3000); do
  [ -s "$work/ready" ] && break
  kill -0 "$client_pid" 2>/dev/null || { echo "bench: the $target client failed" >&2; exit 1; }
  sleep 0.1
done
[ -s "$work/ready" ] || { echo "bench: the $kind did not open" >&2; exit 1; }
sleep 2
rss_idle=$(rss_kib "$server_pid")
threads_idle=$(threads "$server_pid")
perf_pid=""
if [ -n "${BENCH_PERF:-}" ]; then  # where the server's time goes during the commits
  perf record -q -g -p "$server_pid" -o "$work/perf.data" 2>/dev/null &
  perf_pid=$!
  sleep 1
fi
cpu_before=$(awk '{ print $14 + $15 }' "/proc/$server_pid/stat")
touch "$work/go"
echo "== $commits commits, each by one user to that user's $kind ($per_user at most)" >&2
wait "$client_pid" || { echo "bench: the $target client failed" >&2; cat "$work/client.out" >&2; exit 1; }
client_pid=""
cpu_ms=$(awk -v before="$cpu_before" -v hz="$(getconf CLK_TCK)" -v n="$commits" '{ printf "%.0f", ($14 + $15 - before) * 1000 / hz / n }' "/proc/$server_pid/stat")
if [ -n "$perf_pid" ]; then
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  perf report -i "$work/perf.data" --no-children --sort ${BENCH_PERF_SORT:-dso,symbol} -g none --stdio 2>/dev/null | grep -v '^#' | grep '%' | head -40 >&2
fi
rss_after=$(rss_kib "$server_pid")
per_stream=$(awk -v a="$rss_idle" -v b="$rss_start" -v n="$count" 'BEGIN { printf "%.1f", (a - b) / n }')

cat <<EOF

date                     $(date -u +%FT%TZ)  ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))
$kind                  $count of $users users (at most $per_user each; raised: ${limits[*]:-none})
RSS at start             $(mib "$rss_start") MiB, $threads_start threads
RSS, $kind open, idle  $(mib "$rss_idle") MiB, $threads_idle threads  ($per_stream KiB each; goal <= 4 KiB)
RSS after the commits    $(mib "$rss_after") MiB
commit -> event          $(sed -n 1p "$work/client.out")  (goal p99 <= $goal ms, one user's 10,000: 50 ms; from sending the push, each of the pushing user's $kind)
other users' $kind     $(sed -n 2p "$work/client.out")  (must be 0, 0, 0)
server CPU per commit    $cpu_ms ms  (user + system, all threads)
EOF
