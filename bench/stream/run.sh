#!/usr/bin/env bash
# bench/stream: 10,000 open idle event streams (GET /sync/v1/stream) of many users: the
# server's memory, the time from a commit of one user to the event on every stream of that
# user, and that no other user's stream receives it. See bench/README.md for what it
# measures and the results.
#
# Environment: BENCH_STREAMS (default 10000), BENCH_USERS (default BENCH_STREAMS / 10: ten
# streams per user, the shipped per-user limit; 1 = every stream of one user, the worst
# case), BENCH_COMMITS (pushes measured, each by one user, default 50), BENCH_BIN (a
# trunk-sync binary to measure instead of building this tree's), BENCH_REFERENCE (1: also
# measure bench/stream/reference.c, the fan-out's ceiling on this machine — a C server with
# one epoll thread per core and no database — in the same run; default 1 with
# BENCH_USERS=1, else 0; streams only), BENCH_ROUNDS (rounds, each a pass of trunk-sync and,
# with the reference, one of the reference; default 3 with the reference, else 1; each
# round's streams are new users'), BENCH_PERF (1: a perf profile of trunk-sync's commits,
# reference: of the reference's; BENCH_PERF_KEEP=PATH keeps each as PATH.<name>.<round>),
# BENCH_COUNT (1: counts per stream per commit, for every pass — syscalls, TCP sends and
# segments, epoll events, wake-ups and context switches, the server's and the client's; needs
# perf and the kernel's tracepoints). Needs cc, PostgreSQL, curl and python3.
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
reference=${BENCH_REFERENCE:-$([ "$users" = 1 ] && [ "$target" = stream ] && echo 1 || echo 0)}
if [ "$reference" = 1 ] && [ "$target" != stream ]; then
  echo "bench: BENCH_REFERENCE is for BENCH_TARGET=stream only" >&2
  exit 1
fi
rounds=${BENCH_ROUNDS:-$([ "$reference" = 1 ] && echo 3 || echo 1)}
if ! [ "$rounds" -ge 1 ] 2>/dev/null; then
  echo "bench: BENCH_ROUNDS must be 1 or more" >&2
  exit 1
fi

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
if [ "$reference" = 1 ]; then cc -O2 -Wall -pthread -o "$work/reference" bench/stream/reference.c; fi

server_pid=""
client_pid=""
reference_pid=""
cleanup() {
  for pid in "$client_pid" "$server_pid" "$reference_pid"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "$client_pid" "$server_pid" "$reference_pid"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
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
echo "== issuing $((users * rounds)) users' tokens ($users a round)" >&2
mkdir "$work/sessions"
# One `token` per user, two at a time (≈ 30 s for 1,000 users). One in a few thousand has
# crashed at exit ("corrupted size vs. prev_size", seen once): said loudly, then tried again.
# Each round's streams are new users' (the client counts each user's seqs from 1).
seq 0 $((users * rounds - 1)) | xargs -P 2 -I{} sh -c '
  "$1" token --email "bench{}@example.com" >"$2/{}.json" 2>"$2/{}.err" && exit 0
  echo "bench: trunk-sync token for user {} failed (exit $?): $(head -c 300 "$2/{}.err"); once more" >&2
  "$1" token --email "bench{}@example.com" >"$2/{}.json"' token "$bin" "$work/sessions"
for round in $(seq 1 "$rounds"); do
  python3 - "$work/sessions" "$users" "$round" >"$work/tokens.$round" <<'PY'
import json, sys
users, round = int(sys.argv[2]), int(sys.argv[3])
for user in range((round - 1) * users, round * users):
    with open(f"{sys.argv[1]}/{user}.json") as session:
        print(json.load(session)["access_token"])
PY
done

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

if [ "$reference" = 1 ]; then
  : >"$work/reference.log"  # there before the first look at it (the child opens it too late)
  "$work/reference" 127.0.0.1 0 >"$work/reference.log" 2>&1 &
  reference_pid=$!
  reference_port=
  for _ in $(seq 1 100); do
    reference_port=$(sed -n 's/.*listening .*port=\([0-9][0-9]*\).*/\1/p' "$work/reference.log")
    [ -n "$reference_port" ] && break
    kill -0 "$reference_pid" 2>/dev/null || { cat "$work/reference.log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$reference_port" ] || { echo "bench: the reference did not report its port" >&2; exit 1; }
  curl -fsS -o /dev/null "http://127.0.0.1:$reference_port/healthz"
  reference_rss_start=$(rss_kib "$reference_pid")
  echo "== $(cat "$work/reference.log")" >&2
fi

# CPU seconds of this shell's children that have ended (bash's `times`, second line; run
# by this shell itself, not in a subshell, whose children those are not).
children_cpu() {
  times >"$work/times"
  awk 'NR == 2 { gsub(/[ms]/, " "); print $1 * 60 + $2 + $3 * 60 + $4 }' "$work/times"
}

# BENCH_COUNT=1: counted per stream per commit, for each server, during the commits: the
# syscalls (in all and by kind), TCP sends (`tcp_sendmsg`) and segments transmitted
# (`net_dev_xmit`, in the server's own context: its sends and the ACKs it sends), the events
# epoll returned, the wake-ups it woke (`sched_wakeup` in its threads: the client's, its own
# threads'), and each thread's context switches (voluntary: it slept and was woken again).
count_events=raw_syscalls:sys_enter,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_futex,syscalls:sys_enter_madvise,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_brk,syscalls:sys_enter_clock_gettime,tcp:tcp_sendmsg_locked,net:net_dev_xmit,sched:sched_wakeup,sched:sched_switch,context-switches,cpu-migrations,page-faults
# Each thread's name and its voluntary and involuntary context switches so far.
switches() {
  for task in /proc/"$1"/task/*; do
    printf '%s %s %s %s\n' "${task##*/}" "$(tr ' ' _ <"$task/comm")" \
      "$(awk '/^voluntary_ctxt_switches/ { print $2 }' "$task/status")" \
      "$(awk '/^nonvoluntary_ctxt_switches/ { print $2 }' "$task/status")"
  done 2>/dev/null
}
report_counts() {  # NAME ROUND
  local per=$((commits * per_user))
  echo "== $1, round $2: per stream per commit ($commits commits x $per_user streams)" >&2
  paste -d' ' "$work/cpu.before" "$work/cpu.after" | awk -v hz="$(getconf CLK_TCK)" -v per="$per" '{
    printf "   %10.3f  µs user\n   %10.3f  µs system (counted from the perf runs start)\n", ($3 - $1) * 1e6 / hz / per, ($4 - $2) * 1e6 / hz / per }' >&2
  awk -F, -v per="$per" '$1 ~ /^[0-9.]+$/ && $1 > 0 { printf "   %10.3f  %s\n", $1 / per, $3 }' "$work/count.stat" >&2
  perf script -i "$work/count.data" -F trace 2>/dev/null | python3 -c '
import re, sys
per, returns, events = int(sys.argv[1]), 0, 0
for line in sys.stdin:
    found = re.search(r"0x[0-9a-f]+", line)
    returns += 1
    events += int(found.group(0), 16) if found else 0
print(f"   {returns / per:10.3f}  epoll_wait returns\n   {events / per:10.3f}  events epoll returned")' "$per" >&2
  awk -F, -v per="$per" '$1 ~ /^[0-9.]+$/ && $1 > 0 { printf "   %10.3f  client %s\n", $1 / per, $3 }' "$work/count.client" >&2
  join -a 2 <(sort "$work/switches.before") <(sort "$work/switches.after") | awk -v per="$per" '
    NF == 7 { v[$2] += $6 - $3; n[$2] += $7 - $4 } NF == 4 { v[$2] += $3; n[$2] += $4 }
    END { for (t in v) if (v[t] + n[t] > 0) printf "   %10.3f  %s voluntary switches (%.3f involuntary)\n", v[t] / per, t, n[t] / per }' >&2
}

# measure NAME PID PORT ROUND: opens the $kind on server PID (at PORT) with round ROUND's
# tokens, makes the commits, and appends one line to $work/passes: name, round, p50, p90,
# p99, max, server CPU per commit (ms), RSS with the $kind open (KiB), threads, load, and
# the client's CPU per commit (ms: what reading the $kind takes of the same cores).
measure() {
  local name=$1 pid=$2 server_port=$3 round=$4
  rm -f "$work/ready" "$work/go"
  echo "== $name, round $round: opening $count $kind (load before: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  local children_before client_before
  children_cpu >"$work/children"
  children_before=$(cat "$work/children")
  "$work/client" 127.0.0.1 "$server_port" "$count" "$users" "$work/tokens.$round" "$commits" "$work/ready" "$work/go" >"$work/client.out" &
  client_pid=$!
  bench_wait_ready "$work/ready" "$client_pid" 300 "$target ($name)"
  sleep 2
  local rss_open threads_open perf_pid="" cpu_before cpu_ms client_ms
  rss_open=$(rss_kib "$pid")
  threads_open=$(threads "$pid")
  # Where the server's time goes during the commits: trunk-sync's (BENCH_PERF=1), the reference's (=reference).
  if [ -n "${BENCH_PERF:-}" ] && [ "$name" = "$([ "$BENCH_PERF" = reference ] && echo reference || echo trunk-sync)" ]; then
    perf record -q -g -p "$pid" -o "$work/perf.data" 2>/dev/null &
    perf_pid=$!
    sleep 1
  fi
  # What the kernel is asked per stream during the commits (BENCH_COUNT=1): both servers.
  local count_pid="" count_epoll_pid="" count_client_pid=""
  if [ "${BENCH_COUNT:-}" = 1 ]; then
    switches "$pid" >"$work/switches.before"
    awk '{ print $14, $15 }' "/proc/$pid/stat" >"$work/cpu.before"
    perf stat -x, -e "$count_events" -p "$pid" -o "$work/count.stat" 2>/dev/null &
    count_pid=$!
    perf record -q -e syscalls:sys_exit_epoll_wait -e syscalls:sys_exit_epoll_pwait -p "$pid" -o "$work/count.data" 2>/dev/null &
    count_epoll_pid=$!
    # The client's side: how often it was woken (it ends by itself: perf stat with it).
    perf stat -x, -e raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_recvfrom,context-switches \
      -p "$client_pid" -o "$work/count.client" 2>/dev/null &
    count_client_pid=$!
    sleep 1
  fi
  cpu_before=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
  client_before=$(awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$client_pid/stat")
  touch "$work/go"
  echo "== $commits commits, each by one user to that user's $kind ($per_user at most)" >&2
  wait "$client_pid" || { echo "bench: the $target client failed ($name)" >&2; cat "$work/client.out" >&2; exit 1; }
  client_pid=""
  cpu_ms=$(awk -v before="$cpu_before" -v hz="$(getconf CLK_TCK)" -v n="$commits" '{ printf "%.1f", ($14 + $15 - before) * 1000 / hz / n }' "/proc/$pid/stat")
  # The client's CPU from `go` to its end: all of it (now among the ended children) less what
  # it had used opening the $kind (the few sed/awk run meanwhile count too: milliseconds).
  children_cpu >"$work/children"
  client_ms=$(awk -v a="$children_before" -v b="$(cat "$work/children")" -v open="$client_before" -v n="$commits" \
    'BEGIN { printf "%.1f", (b - a - open) * 1000 / n }')
  if [ -n "$count_pid" ]; then
    kill -INT "$count_pid" "$count_epoll_pid" "$count_client_pid" 2>/dev/null
    wait "$count_pid" "$count_epoll_pid" "$count_client_pid" || true
    switches "$pid" >"$work/switches.after"
    awk '{ print $14, $15 }' "/proc/$pid/stat" >"$work/cpu.after"
    report_counts "$name" "$round"
  fi
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid" || true
    perf report -i "$work/perf.data" --no-children --sort ${BENCH_PERF_SORT:-dso,symbol} -g none --stdio 2>/dev/null | grep -v '^#' | grep '%' | head -40 >&2 || true
    if [ -n "${BENCH_PERF_KEEP:-}" ]; then cp "$work/perf.data" "$BENCH_PERF_KEEP.$name.$round"; fi
  fi
  sed -n 1,2p "$work/client.out" >&2
  # "latency_ms p50=… p90=… p99=… max=… samples=… slowest_round_ms=…" → one line of figures
  sed -n 1p "$work/client.out" | awk -v name="$name" -v round="$round" -v cpu="$cpu_ms" -v rss="$rss_open" \
    -v threads="$threads_open" -v load="$(cut -d' ' -f1 /proc/loadavg)" -v client="$client_ms" '{
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      print name, round, v["p50"], v["p90"], v["p99"], v["max"], cpu, rss, threads, load, client }' >>"$work/passes"
  sed -n 2p "$work/client.out" >>"$work/isolation.$name"
  # The client's exit closed the streams: let the server see them go before the next pass.
  sleep 2
}

# Rounds: trunk-sync, then the reference (when measured), then again: both see the same
# load, as far as a shared machine allows.
: >"$work/passes"
for round in $(seq 1 "$rounds"); do
  measure trunk-sync "$server_pid" "$port" "$round"
  if [ "$reference" = 1 ]; then measure reference "$reference_pid" "$reference_port" "$round"; fi
done
rss_after=$(rss_kib "$server_pid")

cat <<EOF

date                     $(date -u +%FT%TZ)  ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))
$kind                  $count of $users users a round (at most $per_user each; raised: ${limits[*]:-none}); $commits commits a round, $rounds round(s)
trunk-sync               at start $(mib "$rss_start") MiB, $threads_start threads; after the commits $(mib "$rss_after") MiB
commit -> event          from sending the push to the event on each of the pushing user's $kind (goal p99 <= $goal ms; one user's 10,000: 50 ms)
other users' $kind     trunk-sync: $(sort -u "$work/isolation.trunk-sync" | tr '\n' ' ')(must be 0, 0, 0)
EOF
if [ "$reference" = 1 ]; then
  echo "                         reference: $(sort -u "$work/isolation.reference" | tr '\n' ' ')"
  echo "reference                bench/stream/reference.c, $(sed -n 's/.*\(threads=[0-9]*\).*/\1/p' "$work/reference.log"), at start $(mib "$reference_rss_start") MiB"
fi
echo
python3 bench/stream/passes.py "$work/passes" "$count" "$rss_start" "${reference_rss_start:-0}"
