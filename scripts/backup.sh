#!/usr/bin/env bash
# Base backups for point-in-time recovery, beside the WAL archive PostgreSQL fills with its
# archive_command (`test ! -f $BACKUP_DIR/wal/%f && cp %p $BACKUP_DIR/wal/%f`).
#
#   backup.sh once   take one base backup, then apply the retention
#   backup.sh loop   the same now and every BACKUP_INTERVAL seconds (docker-compose.yml's
#                    `backup` service)
#
# Connects with the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD) as a role that may
# replicate (the cluster's superuser). Writes BACKUP_DIR/base/YYYYmmddTHHMMSSZ/ (base.tar.gz,
# pg_wal.tar.gz, backup_manifest): a tar-format pg_basebackup with the WAL it needs, so each
# base backup restores on its own; replaying BACKUP_DIR/wal/ on top of it reaches any later
# second. Keeps the BACKUP_KEEP newest base backups (default 7) and the archived WAL from the
# oldest kept one on; older WAL can only replay onto base backups that are gone.
#
# docs/operations.md ("Back up and restore") shows the restore; scripts/drill-restore.sh
# (`make drill`) runs this script and the restore against real clusters.
set -euo pipefail

dir=${BACKUP_DIR:?set BACKUP_DIR}
keep=${BACKUP_KEEP:-7}
interval=${BACKUP_INTERVAL:-86400}
[[ $keep =~ ^[1-9][0-9]*$ ]] || { echo "backup: BACKUP_KEEP must be a whole number of at least 1" >&2; exit 2; }
[[ $interval =~ ^[1-9][0-9]*$ ]] || { echo "backup: BACKUP_INTERVAL must be a number of seconds" >&2; exit 2; }

take() {
  mkdir -p "$dir/base" "$dir/wal"
  local name target
  name=$(date -u +%Y%m%dT%H%M%SZ)
  # One base backup per second at most: the names sort by time.
  while [ -e "$dir/base/$name" ] || [ -e "$dir/base/$name.partial" ]; do
    sleep 1
    name=$(date -u +%Y%m%dT%H%M%SZ)
  done
  target="$dir/base/$name"
  # Marks when the backup started: WAL archived before it is older than its start point.
  touch "$dir/base/.$name.started"
  if ! pg_basebackup --pgdata="$target.partial" --format=tar --gzip --wal-method=stream \
      --checkpoint=fast --label="trunk-sync $name" --no-password; then
    rm -rf "$target.partial" "$dir/base/.$name.started"
    echo "backup: pg_basebackup failed; the previous base backups are kept" >&2
    return 1
  fi
  mv "$target.partial" "$target"
  mv "$dir/base/.$name.started" "$target/started"
  echo "backup: base backup $target"
  prune
}

prune() {
  local all oldest
  mapfile -t all < <(find "$dir/base" -mindepth 1 -maxdepth 1 -type d -name '2*Z' | sort)
  if (( ${#all[@]} > keep )); then
    for old in "${all[@]:0:${#all[@]}-keep}"; do rm -rf "$old"; echo "backup: removed $old"; done
    all=("${all[@]: -keep}")
  fi
  oldest=${all[0]:-}
  [ -n "$oldest" ] && [ -f "$oldest/started" ] || return 0
  # WAL segments archived before the oldest kept backup started (never its own: those are
  # in its pg_wal.tar.gz, and every later one is kept).
  find "$dir/wal" -maxdepth 1 -type f ! -newer "$oldest/started" -print -delete | sed 's/^/backup: removed /'
}

case "${1:-once}" in
  once) take ;;
  loop)
    while true; do
      take || true
      sleep "$interval"
    done
    ;;
  *) echo "usage: backup.sh once|loop" >&2; exit 2 ;;
esac
