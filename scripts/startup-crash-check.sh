#!/usr/bin/env bash
# Counts crashes at exit, which `make test` runs too few times to catch: starts `serve` N
# times with its admin port taken (it must exit 1 with its one line, after closing what it
# opened) and runs `trunk-sync token` M times (it must exit 0), against a private
# PostgreSQL. Any other exit status (139: SIGSEGV, 134: SIGABRT, a heap corruption) is a
# crash; a "still running at exit" line is a thread the process did not join. Not part of
# `make test`.
#
#   scripts/startup-crash-check.sh [N] [M]     # default 200 starts, 1000 token runs
#   TRUNK_SYNC_BIN=path/to/trunk-sync scripts/startup-crash-check.sh   # another build (e.g. an older one)
#   CRASH_CHECK_DB_HOST=localhost scripts/startup-crash-check.sh       # the database by host name: each
#                                   opening looks it up on a thread of its own (pg-resolve), joined at exit
set -euo pipefail
cd "$(dirname "$0")/.."
starts=${1:-200}
tokens=${2:-1000}

scripts/deps.sh >/dev/null
bin=${TRUNK_SYNC_BIN:-}
if [ -z "$bin" ]; then
  swift build >/dev/null
  bin="$(swift build --show-bin-path)/trunk-sync"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-crash-check.XXXXXX")
holder=""
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 scripts/server_port.py; }
pg_port=$(free_port)
PG_FAST=1 scripts/pg.sh start "$work/pg" "$pg_port" >/dev/null
export TRUNK_SYNC_DATABASE_URL
TRUNK_SYNC_DATABASE_URL=$(scripts/pg.sh url "$work/pg" postgres)
TRUNK_SYNC_DATABASE_URL=${TRUNK_SYNC_DATABASE_URL/@127.0.0.1:/@${CRASH_CHECK_DB_HOST:-127.0.0.1}:}
export TRUNK_SYNC_JWT_SECRET
TRUNK_SYNC_JWT_SECRET=$(openssl rand -base64 48)
export TRUNK_SYNC_MIGRATIONS_DIR="$PWD/migrations" TRUNK_SYNC_PORT=0 TRUNK_SYNC_LOG_LEVEL=warning
"$bin" migrate >/dev/null 2>&1

# A socket that holds the admin port for the whole run.
admin_port=$(free_port)
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1); time.sleep(86400)' "$admin_port" &
holder=$!
sleep 0.5

count() {  # label runs expected-status command…
  local label=$1 runs=$2 expected=$3
  shift 3
  local crashes=0 unexpected=0 leftover=0 status
  for ((i = 1; i <= runs; i++)); do
    status=0
    "$@" >"$work/out" 2>"$work/err" || status=$?
    if [ "$status" -ge 128 ]; then
      crashes=$((crashes + 1))
      echo "  $label run $i: exit $status" >&2
    elif [ "$status" != "$expected" ]; then
      unexpected=$((unexpected + 1))
      echo "  $label run $i: exit $status: $(tail -n 1 "$work/err")" >&2
    fi
    if grep -q "still running at exit" "$work/err"; then leftover=$((leftover + 1)); fi
  done
  echo "$label: $runs runs, $crashes crashes, $unexpected other exit statuses, $leftover with threads left at exit"
  [ "$crashes" = 0 ] && [ "$unexpected" = 0 ] && [ "$leftover" = 0 ]
}

result=0
count "serve with the admin port taken" "$starts" 1 env TRUNK_SYNC_ADMIN_PORT="$admin_port" "$bin" serve || result=1
count "trunk-sync token" "$tokens" 0 "$bin" token --email crash-check@example.com || result=1
exit "$result"
