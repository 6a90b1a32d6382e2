#!/usr/bin/env bash
# A private PostgreSQL cluster in a directory of our own (never the system's cluster).
#
#   pg.sh start DIR PORT   create the cluster if needed, start it on 127.0.0.1:PORT
#   pg.sh stop DIR         stop it (fast shutdown)
#   pg.sh restart DIR      restart it (used by tests that check reconnection)
#   pg.sh url DIR [DB]     print the superuser's postgres:// URL for database DB (default postgres)
#
# The cluster's superuser is `trunk` with a random password kept in DIR/password. When run as
# root, the server runs as the `postgres` OS user, which owns DIR and DIR/pgdata.
#
# DIR is also the Unix socket's directory, and pg_hba trusts local connections (as the
# superuser, with no password): DIR and the socket are owner-only (0700), so no other local
# user can reach them. Clients here connect over TCP with the password.
set -euo pipefail

command=${1:?usage: pg.sh start|stop|restart|url DIR [PORT|DB]}
dir=${2:?usage: pg.sh $command DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$command" in
  start)
    port=${3:?usage: pg.sh start DIR PORT}
    if [ -f "$dir/pgdata/postmaster.pid" ] && as_owner "$bin/pg_ctl" -D "$dir/pgdata" status >/dev/null 2>&1; then
      [ "$(cat "$dir/port" 2>/dev/null)" = "$port" ] && exit 0
      echo "the cluster in $dir already runs on port $(cat "$dir/port"); stop it first (pg.sh stop $dir)" >&2; exit 1
    fi
    # Also tightens a directory an older pg.sh left world-readable.
    chmod 700 "$dir"
    if [ ! -f "$dir/pgdata/PG_VERSION" ]; then
      [ -f "$dir/password" ] || (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$dir/password")
      mkdir -p "$dir/pgdata"
      if [ "$(id -u)" -eq 0 ]; then
        chown postgres "$dir" "$dir/pgdata"
        chown postgres "$dir/password"
        # The server must be able to reach its directory (mktemp makes 0700 parents).
        chmod o+x "$(dirname "$dir")" 2>/dev/null || true
      fi
      as_owner "$bin/initdb" -D "$dir/pgdata" -U trunk --pwfile="$dir/password" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    echo "$port" > "$dir/port"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir/port"
    options="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c unix_socket_permissions=0700 -c max_connections=200"
    [ "${PG_FAST:-}" = 1 ] && options="$options -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    as_owner "$bin/pg_ctl" -D "$dir/pgdata" -l "$dir/server.log" -o "$options" -w -t 60 start >/dev/null \
      || { tail -n 20 "$dir/server.log" >&2; exit 1; }
    ;;
  stop)
    [ -f "$dir/pgdata/postmaster.pid" ] || exit 0
    as_owner "$bin/pg_ctl" -D "$dir/pgdata" -m fast -w -t 60 stop >/dev/null
    ;;
  restart)
    # -l keeps the server off our stdout: a caller reading it to EOF would wait forever.
    as_owner "$bin/pg_ctl" -D "$dir/pgdata" -l "$dir/server.log" -m fast -w -t 60 restart >/dev/null 2>&1 \
      || { tail -n 20 "$dir/server.log" >&2; exit 1; }
    ;;
  url)
    database=${3:-postgres}
    echo "postgres://trunk:$(cat "$dir/password")@127.0.0.1:$(cat "$dir/port")/$database"
    ;;
  *)
    echo "unknown command $command" >&2; exit 2 ;;
esac
