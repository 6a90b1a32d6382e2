# The start-up pieces the bench/*/run.sh scripts share; sourced from the repository's root.
# Nothing here starts anything on its own.

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)

# Builds trunk-sync in release (`.build-release`, apart from the debug build), or takes
# BENCH_BIN (another tree's binary, for an A/B); sets $bin.
bench_build() {
  if [ -n "${BENCH_BIN:-}" ]; then  # a binary of another tree, for an A/B
    bin=$BENCH_BIN
    echo "== trunk-sync: $bin (BENCH_BIN)" >&2
    return
  fi
  echo "== building trunk-sync (release)" >&2
  # An incremental release build can keep code of a module whose sources did not change but
  # whose dependency did: HTTPServer is built with cross-module optimisation, so TrunkSync
  # compiles specialisations of its event loop, and the compiler rebuilds a dependent only
  # when the dependency's interface changed — not when only a body did. A benchmark would
  # then measure old code. So when any source changed since the last benchmark build, this
  # tree's modules are built afresh (the fetched packages stay). BENCH_INCREMENTAL=1 skips it.
  local stamp=.build-release/bench-sources.sha
  local sources
  sources=$({ git ls-files -s -- Sources Package.swift; git diff HEAD -- Sources Package.swift
    git ls-files --others --exclude-standard -- Sources | xargs -r sha256sum; } | sha256sum | cut -d' ' -f1)
  if [ "${BENCH_INCREMENTAL:-}" != 1 ] && [ "$(cat "$stamp" 2>/dev/null)" != "$sources" ]; then
    rm -f "$stamp"
    rm -rf .build-release/x86_64-unknown-linux-gnu/release .build-release/release
  fi
  swift build -c release --scratch-path .build-release --product trunk-sync 2>&1 | tail -n 1 >&2
  bin=$(swift build -c release --scratch-path .build-release --show-bin-path)/trunk-sync
  echo "$sources" >"$stamp"
}

free_port() { python3 scripts/server_port.py; }

# bench_serve LOG BINARY [NAME=VALUE…]: starts `BINARY serve` with these settings on free
# ports (TRUNK_SYNC_PORT=0 and TRUNK_SYNC_ADMIN_PORT=0 on 127.0.0.1) and waits for its
# `listening … port=N` line (the public listener's, not the admin's); sets served_pid and
# served_port. Exits showing the log when the server dies or does not say within 20 s (and
# then stops it).
bench_serve() {
  local log=$1 binary=$2
  shift 2
  env TRUNK_SYNC_HOST=127.0.0.1 TRUNK_SYNC_PORT=0 TRUNK_SYNC_ADMIN_PORT=0 "$@" "$binary" serve >>"$log" 2>&1 &
  served_pid=$!
  served_port=
  for _ in $(seq 1 200); do
    # No grep: it fails on an empty log under pipefail.
    served_port=$(sed -n '/ admin listening /d; s/.* listening .*port=\([0-9][0-9]*\).*/\1/p' "$log" | head -n 1)
    [ -n "$served_port" ] && return 0
    kill -0 "$served_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  kill "$served_pid" 2>/dev/null || true
  echo "bench: trunk-sync did not report its port" >&2
  cat "$log" >&2
  exit 1
}

# CPU seconds so far: "<postgres cluster> <process PID>" (bench/common/cpu.py).
bench_cpu() {  # PGDATA PID
  python3 bench/common/cpu.py "$1" "$2"
}

# bench_wait_ready FILE PID SECONDS WHAT: waits until the client PID has written FILE
# (non-empty); exits naming WHAT when the client dies or SECONDS pass first.
bench_wait_ready() {
  local file=$1 pid=$2 seconds=$3 what=$4
  for _ in $(seq 1 $((seconds * 10))); do
    [ -s "$file" ] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "bench: the $what client failed" >&2; exit 1; }
    sleep 0.1
  done
  echo "bench: the $what client was not ready within ${seconds}s" >&2
  exit 1
}
