#!/usr/bin/env bash
# `make run`: installs what is missing, starts a private PostgreSQL under .data/, creates the
# database, generates a development JWT secret once, migrates, and serves on 127.0.0.1:8080
# with sign-in codes printed to the console. Ctrl-C stops the server and the database.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
mkdir -p .data
pg_port=${TRUNK_SYNC_DEV_PG_PORT:-54329}
scripts/pg.sh start .data/postgres "$pg_port"
trap 'scripts/pg.sh stop .data/postgres' EXIT

admin_url=$(scripts/pg.sh url .data/postgres postgres)
if ! psql "$admin_url" -tAc "select 1 from pg_database where datname = 'trunk_sync'" | grep -q 1; then
  psql "$admin_url" -qc "create database trunk_sync"
fi
if [ ! -s .data/jwt_secret ]; then
  (umask 077; head -c 48 /dev/urandom | base64 | tr -d '\n' > .data/jwt_secret)
fi

swift build --product trunk-sync
bin="$(swift build --show-bin-path)/trunk-sync"

export TRUNK_SYNC_DATABASE_URL
TRUNK_SYNC_DATABASE_URL=$(scripts/pg.sh url .data/postgres trunk_sync)
export TRUNK_SYNC_JWT_SECRET
TRUNK_SYNC_JWT_SECRET=$(cat .data/jwt_secret)
export TRUNK_SYNC_HOST=${TRUNK_SYNC_HOST:-127.0.0.1}
export TRUNK_SYNC_PORT=${TRUNK_SYNC_PORT:-8080}
export TRUNK_SYNC_MAILER=${TRUNK_SYNC_MAILER:-log}
export TRUNK_SYNC_CORS_ORIGINS=${TRUNK_SYNC_CORS_ORIGINS:-*}

"$bin" migrate
"$bin" serve
