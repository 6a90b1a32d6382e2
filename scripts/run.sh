#!/usr/bin/env bash
# `make run`: installs what is missing, starts a private PostgreSQL under .data/, creates the
# database, generates the development secrets once, migrates, and serves on 127.0.0.1:8080
# with sign-in codes printed to the console. Ctrl-C stops the server and the database.
#
# As in production, two database logins: `migrate` (and the owner's tools) log in as the
# cluster's superuser, the tables' owner; the server logs in as trunk_sync_server, which
# migrate creates as a member of trunk_sync_app only, so row-level security binds it.
#
# Overrides (for tests): TRUNK_SYNC_DEV_DATA (default .data), TRUNK_SYNC_DEV_PG_PORT
# (54329), TRUNK_SYNC_BIN (a built trunk-sync binary instead of `swift build`).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
data=${TRUNK_SYNC_DEV_DATA:-.data}
mkdir -p "$data"
# One `make run` per data directory: a second one would find the database running, serve
# beside the first and, when it ends (Ctrl-C, or at once when its port is taken), stop the
# database under the first. The lock is held by this script and the server only (the
# database never inherits it), so a `make run` that was killed leaves it free.
exec 9>"$data/run.lock"
if ! flock -n 9; then
  echo "make run: another make run is using $data (its server and database); stop it first (Ctrl-C)," \
    "or give this one a data directory and ports of its own, e.g." \
    "TRUNK_SYNC_DEV_DATA=.data/2 TRUNK_SYNC_DEV_PG_PORT=54330 TRUNK_SYNC_PORT=8081 TRUNK_SYNC_ADMIN_PORT=9091 make run" >&2
  exit 1
fi
pg_port=${TRUNK_SYNC_DEV_PG_PORT:-54329}
scripts/pg.sh start "$data/postgres" "$pg_port" 9>&-
trap 'scripts/pg.sh stop "$data/postgres"' EXIT

admin_url=$(scripts/pg.sh url "$data/postgres" postgres)
if ! psql "$admin_url" -tAc "select 1 from pg_database where datname = 'trunk_sync'" | grep -q 1; then
  psql "$admin_url" -qc "create database trunk_sync"
fi
# Each secret once, readable by this user only.
secret() {
  [ -s "$data/$1" ] || (umask 077; $2 > "$data/$1")
  cat "$data/$1"
}
jwt_secret=$(secret jwt_secret "openssl rand -base64 48")
key_encryption_key=$(secret key_encryption_key "openssl rand -base64 48")
server_password=$(secret server_db_password "openssl rand -hex 32")

if [ -n "${TRUNK_SYNC_BIN:-}" ]; then
  bin=$TRUNK_SYNC_BIN
else
  swift build --product trunk-sync
  bin="$(swift build --show-bin-path)/trunk-sync"
fi

export TRUNK_SYNC_MIGRATION_DATABASE_URL
TRUNK_SYNC_MIGRATION_DATABASE_URL=$(scripts/pg.sh url "$data/postgres" trunk_sync)
export TRUNK_SYNC_DATABASE_URL="postgres://trunk_sync_server:$server_password@127.0.0.1:$pg_port/trunk_sync"
export TRUNK_SYNC_JWT_SECRET=$jwt_secret
export TRUNK_SYNC_KEY_ENCRYPTION_KEY=$key_encryption_key
export TRUNK_SYNC_HOST=${TRUNK_SYNC_HOST:-127.0.0.1}
export TRUNK_SYNC_PORT=${TRUNK_SYNC_PORT:-8080}
export TRUNK_SYNC_MAILER=${TRUNK_SYNC_MAILER:-log}
export TRUNK_SYNC_CORS_ORIGINS=${TRUNK_SYNC_CORS_ORIGINS:-*}

"$bin" migrate
# Where things are, once, before the server's own log.
admin_port=${TRUNK_SYNC_ADMIN_PORT:-9090}
if [ -n "${TRUNK_SYNC_ADMIN_EMAILS:-}" ]; then
  console="http://127.0.0.1:$admin_port/console/ (sign in as $TRUNK_SYNC_ADMIN_EMAILS; the code appears below)"
else
  console="http://127.0.0.1:$admin_port/console/ (sign-in disabled; enable it with TRUNK_SYNC_ADMIN_EMAILS=you@example.com make run)"
fi
# The binary as a command to paste here (it is not on PATH): relative to the checkout when in it.
shown_bin=${bin#"$PWD/"}
[ "$shown_bin" = "$bin" ] || shown_bin=./$shown_bin
cat >&2 <<EOF
make run:
  API           http://$TRUNK_SYNC_HOST:$TRUNK_SYNC_PORT/  (described at /openapi.json; docs/api.md)
  console       $console
  metrics       http://127.0.0.1:$admin_port/metrics
  sign-in codes printed below (TRUNK_SYNC_MAILER=$TRUNK_SYNC_MAILER)
  owner's tools TRUNK_SYNC_MIGRATION_DATABASE_URL=\$(scripts/pg.sh url $data/postgres trunk_sync) $shown_bin users list
  the server logs in as trunk_sync_server; Ctrl-C stops it and the database
EOF
# The server gets its own login only, not the owner's URL.
env -u TRUNK_SYNC_MIGRATION_DATABASE_URL "$bin" serve
