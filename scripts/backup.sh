#!/usr/bin/env bash
# Base backups for point-in-time recovery, beside the WAL archive PostgreSQL fills with its
# archive_command (docker-compose.yml's: each segment copied into $BACKUP_DIR/wal/, never
# over another copy).
#
#   backup.sh once   take one base backup, then apply the retention
#   backup.sh loop   the same now and every BACKUP_INTERVAL seconds (docker-compose.yml's
#                    `backup` service); after a failed one, again in BACKUP_RETRY seconds
#                    (default 300), not a whole interval later
#   backup.sh prune  apply the retention only (after lowering BACKUP_KEEP, say)
#   backup.sh restore TIME DATADIR
#                    lay out a point-in-time restore to TIME in the empty DATADIR: the newest
#                    base backup that had ended by TIME, and the settings that make PostgreSQL
#                    replay BACKUP_DIR/wal/ up to TIME when it starts there, then promote
#
# Connects with the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD) as a role that may
# replicate (the cluster's superuser). Writes BACKUP_DIR/base/YYYYmmddTHHMMSSZ/ (base.tar.gz,
# pg_wal.tar.gz, backup_manifest): a tar-format pg_basebackup with the WAL it needs, so each
# base backup restores on its own; replaying BACKUP_DIR/wal/ on top of it reaches any later
# second. Keeps the BACKUP_KEEP newest base backups (default 7) and the archived WAL from the
# oldest kept one's start segment on; older WAL can only replay onto base backups that are
# gone. WAL is pruned by segment name (its position in the WAL), never by file time: a copy of
# the archive (restored from off-host, rsynced without times) keeps its order. Timeline
# history files (*.history) are never removed: a restore follows them to the latest timeline.
#
# A restore reaches no time before its base backup ended: PostgreSQL, given such a target,
# does not refuse it but stops at the first commit after the backup's end, silently later
# than asked (with the mistake the restore was to undo, if it came in between). So `restore`
# picks the base backup by when it ended (its STOP TIME in the archive's .backup file, else
# the end-time pg_basebackup's return left beside it) and refuses, writing nothing, a time
# before every kept base backup ended.
#
# docs/operations.md ("Back up and restore") shows the restore; scripts/drill-restore.sh
# (`make drill`) runs this script and the restore against real clusters.
set -euo pipefail
export LC_ALL=C  # segment names compare byte by byte

dir=${BACKUP_DIR:?set BACKUP_DIR}
keep=${BACKUP_KEEP:-7}
interval=${BACKUP_INTERVAL:-86400}
retry=${BACKUP_RETRY:-300}
[[ $keep =~ ^[1-9][0-9]*$ ]] || { echo "backup: BACKUP_KEEP must be a whole number of at least 1" >&2; exit 2; }
[[ $interval =~ ^[1-9][0-9]*$ ]] || { echo "backup: BACKUP_INTERVAL must be a number of seconds" >&2; exit 2; }
[[ $retry =~ ^[1-9][0-9]*$ ]] || { echo "backup: BACKUP_RETRY must be a number of seconds" >&2; exit 2; }
(( retry <= interval )) || retry=$interval

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
  if ! pg_basebackup --pgdata="$target.partial" --format=tar --gzip --wal-method=stream \
      --checkpoint=fast --label="trunk-sync $name" --no-password; then
    rm -rf "$target.partial"
    echo "backup: pg_basebackup failed; the previous base backups are kept" >&2
    return 1
  fi
  mv "$target.partial" "$target"
  # When it ended, by now at the latest: what `restore` compares a target with when the
  # archive holds no .backup file for it (PostgreSQL's STOP TIME, exact, is read first).
  date -u '+%Y-%m-%d %H:%M:%S UTC' >"$target/end-time"
  start_wal "$target" >/dev/null || echo "backup: cannot read where $target starts in the WAL" >&2
  echo "backup: base backup $target"
  prune
}

# The WAL segment base backup $1 starts in: its backup_label's START WAL LOCATION, kept
# beside it as start-wal (read once from base.tar.gz, whose first member backup_label is).
start_wal() {
  local name
  if [ ! -s "$1/start-wal" ]; then
    name=$(tar -xzOf "$1/base.tar.gz" --occurrence=1 backup_label 2>/dev/null \
      | sed -n 's/^START WAL LOCATION: .*(file \([0-9A-F]\{24\}\))$/\1/p') || true
    [[ $name =~ ^[0-9A-F]{24}$ ]] || return 1
    echo "$name" >"$1/start-wal"
  fi
  name=$(cat "$1/start-wal")
  [[ $name =~ ^[0-9A-F]{24}$ ]] || return 1
  echo "$name"
}

prune() {
  local all oldest start file name
  mkdir -p "$dir/base" "$dir/wal"
  mapfile -t all < <(find "$dir/base" -mindepth 1 -maxdepth 1 -type d -name '2*Z' | sort)
  if (( ${#all[@]} > keep )); then
    for old in "${all[@]:0:${#all[@]}-keep}"; do rm -rf "$old"; echo "backup: removed $old"; done
    all=("${all[@]: -keep}")
  fi
  oldest=${all[0]:-}
  [ -n "$oldest" ] || return 0
  if ! start=$(start_wal "$oldest"); then
    echo "backup: cannot read where $oldest starts in the WAL (backup_label); archived WAL kept" >&2
    return 0
  fi
  # Segments (and their .partial and .backup files) before the oldest kept base backup's
  # start segment, by name: the position (log and segment numbers) decides, whatever the
  # timeline, as pg_archivecleanup does. Its own segments and every later one are kept, and
  # every *.history file, which no pattern here matches. So are the .tmp copies the
  # archive_command left when the host went down before renaming one (else kept forever).
  for file in "$dir/wal"/*; do
    name=${file##*/}
    [[ $name =~ ^[0-9A-F]{24}(\.partial|\.[0-9A-F]{8}\.backup)?(\.tmp)?$ ]] || continue
    [[ ${name:8:16} < ${start:8:16} ]] || continue
    rm -f -- "$file"
    echo "backup: removed $file"
  done
}

# When base backup $1 ended, in seconds since 1970: the STOP TIME of the archive's .backup
# file with its label, else its end-time; nothing when neither says.
end_of() {
  local name=${1##*/} file stop
  for file in "$dir/wal"/*.backup; do
    [ -f "$file" ] && grep -qx "LABEL: trunk-sync $name" "$file" || continue
    stop=$(sed -n 's/^STOP TIME: //p' "$file")
    [ -n "$stop" ] && date -u -d "$stop" +%s 2>/dev/null && return 0
  done
  [ -s "$1/end-time" ] && date -u -d "$(cat "$1/end-time")" +%s 2>/dev/null
}

# $1 as one word of the shell PostgreSQL runs restore_command with: as it is when it has
# nothing the shell reads (/backup/wal), else single-quoted (a space in BACKUP_DIR split the
# copy's source in two, and every segment failed to restore); a % doubled, as
# restore_command reads %f, %p and %% in it.
shell_word() {
  local word=$1
  [[ $word =~ ^[A-Za-z0-9_./:@+,=-]+$ ]] || word="'${word//\'/\'\\\'\'}'"
  printf '%s' "${word//%/%%}"
}

# $1 as the inside of a postgresql.conf string: ' and \ doubled.
conf_string() {
  local text=${1//\\/\\\\}
  printf '%s' "${text//\'/\'\'}"
}

restore() {
  local target=${1:-} data=${2:-} when canonical chosen='' oldest='' oldest_end='' base end
  if [ -z "$target" ] || [ -z "$data" ]; then
    echo "usage: backup.sh restore TIME DATADIR (TIME as '2026-11-26 14:03:09+00')" >&2
    return 2
  fi
  if ! when=$(date -u -d "$target" +%s 2>/dev/null); then
    echo "backup: restore: cannot read the time \"$target\"; write it as 2026-11-26 14:03:09+00" >&2
    return 2
  fi
  canonical=$(date -u -d "$target" '+%Y-%m-%d %H:%M:%S.%6N+00')
  if [ -e "$data" ] && [ -n "$(ls -A "$data")" ]; then
    echo "backup: restore: $data is not empty; restore into a new, empty data directory" >&2
    return 1
  fi
  while read -r base; do
    [ -n "$base" ] || continue
    if ! end=$(end_of "$base"); then
      echo "backup: restore: cannot tell when $base ended (no .backup file in $dir/wal, no end-time); skipped" >&2
      continue
    fi
    [ -n "$oldest" ] || { oldest=$base; oldest_end=$end; }
    # Both ends are whole seconds, the backup's true end later within its second: it had
    # ended by TIME only if that second is before TIME's (14:03:09.5 is not after a backup
    # whose STOP TIME is 14:03:09: it may have ended at 14:03:09.8).
    (( end < when )) && chosen=$base
  done < <(find "$dir/base" -mindepth 1 -maxdepth 1 -type d -name '2*Z' 2>/dev/null | sort)
  if [ -z "$chosen" ]; then
    if [ -n "$oldest" ]; then
      echo "backup: restore: no base backup had ended by $canonical: the oldest kept, ${oldest##*/}, ended at $(date -u -d "@$oldest_end" '+%Y-%m-%d %H:%M:%S+00'), and a restore reaches no time before its base backup ended; nothing was written" >&2
    else
      echo "backup: restore: no base backup in $dir/base; nothing was written" >&2
    fi
    return 1
  fi
  mkdir -p "$data"
  tar -xzf "$chosen/base.tar.gz" -C "$data"
  tar -xzf "$chosen/pg_wal.tar.gz" -C "$data/pg_wal"
  cat >>"$data/postgresql.auto.conf" <<EOF
restore_command = '$(conf_string "cp $(shell_word "$dir/wal")/%f %p")'
recovery_target_time = '$canonical'
recovery_target_action = 'promote'
EOF
  touch "$data/recovery.signal"
  [ "$(id -u)" -eq 0 ] && id postgres >/dev/null 2>&1 && chown -R postgres: "$data"
  chmod 700 "$data"
  echo "backup: restore: base backup ${chosen##*/} laid out in $data; PostgreSQL replays $dir/wal up to $canonical when it starts there, then promotes"
}

case "${1:-once}" in
  once) take ;;
  prune) prune ;;
  restore) restore "${2:-}" "${3:-}" ;;
  loop)
    # A failed base backup (the database restarting, a full disk, a changed password) is
    # tried again soon: until one succeeds there is nothing the archived WAL can replay onto.
    while true; do
      if take; then
        sleep "$interval"
      else
        echo "backup: trying again in $retry s (BACKUP_RETRY)" >&2
        sleep "$retry"
      fi
    done
    ;;
  *) echo "usage: backup.sh once|loop|prune|restore TIME DATADIR" >&2; exit 2 ;;
esac
