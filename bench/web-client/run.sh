#!/usr/bin/env bash
# bench/web-client: the browser client (clients/web/trunk-sync.js) in headless Chromium —
# record latency with strict durability and a sync of 10,000 events each way, each against
# a reference measured in the same run (see bench/README.md).
#
#   bench/web-client/run.sh                  2 rounds of 10,000 events
#   BENCH_ROUNDS=4 BENCH_EVENTS=5000 ...     other sizes
#   BENCH_BIN=.build/debug/trunk-sync ...    a binary already built (default: release build)
#
# Needs chromium, chromium-driver and PostgreSQL (scripts/deps.sh), and Python with selenium:
# the test venv (.build/test-venv, made by `make test`) or BENCH_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${BENCH_PYTHON:-.build/test-venv/bin/python}
"$python" -c 'import selenium' 2>/dev/null || { echo "no selenium in $python: run make test once, or set BENCH_PYTHON" >&2; exit 1; }
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN
else
  echo "== building release"
  swift build -c release --scratch-path .build-release --product trunk-sync 2>&1 | tail -n 1
  bin=$(swift build -c release --scratch-path .build-release --show-bin-path)/trunk-sync
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-bench-web.XXXXXX")
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Real durability on the server too: fsync on.
port=$(python3 scripts/server_port.py)
env -u PG_FAST scripts/pg.sh start "$work/pg" "$port" >/dev/null
admin_url=$(scripts/pg.sh url "$work/pg" postgres)
psql -X -q "$admin_url" -c "create database trunk_bench"
export TRUNK_SYNC_DATABASE_URL=$(scripts/pg.sh url "$work/pg" trunk_bench)
export TRUNK_SYNC_PUBLIC_URL=http://bench.invalid
export TRUNK_SYNC_JWT_SECRET=$(head -c 32 /dev/urandom | base64)
export TRUNK_SYNC_LOG_LEVEL=notice
export TRUNK_SYNC_CORS_ORIGINS='*'
"$bin" migrate >/dev/null 2>&1 || { "$bin" migrate; exit 1; }
TRUNK_SYNC_PORT=0 TRUNK_SYNC_ADMIN_PORT=0 "$bin" serve >"$work/serve.log" 2>&1 &
server_pid=$!
server_port=
for _ in $(seq 1 100); do
  server_port=$(sed -nE '/ admin listening /d; s/.* listening .*port=([0-9]+).*/\1/p' "$work/serve.log" | head -n 1)
  [ -n "$server_port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$server_port" ] || { echo "server did not start" >&2; exit 1; }
rounds=${BENCH_ROUNDS:-2}
for i in $(seq 1 $((rounds * 2))); do "$bin" token --email "web$i@bench.example" >>"$work/sessions"; done
echo "== trunk-sync on 127.0.0.1:$server_port, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(/usr/bin/chromium --version 2>/dev/null)"
"$python" bench/web-client/bench.py "http://127.0.0.1:$server_port" "$work/sessions"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
