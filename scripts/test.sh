#!/usr/bin/env bash
# `make test`: builds everything, starts a private PostgreSQL cluster on a free port in a
# temporary directory, runs every test target against it, and tears the cluster down
# afterwards, whether the tests pass or not.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
# Debian's Chromium and its chromedriver for the browser tests (the console, the event
# stream's EventSource, the web client), Node for the web client's pure parts (Selenium never
# downloads a browser here); nginx to run docs/operations.md's reverse proxy as written.
scripts/deps.sh chromium chromium-driver nodejs nginx-light
# The code's format first (seconds; `make format` fixes it). The generated files under
# Sources/TrunkSync/Generated are left to their scripts (`// swift-format-ignore-file`).
swift format lint --strict --recursive Sources Tests Package.swift
swift build --build-tests

# Python tools the tests drive: the real supabase client, compose schema validation, YAML,
# for docs/openapi.json its validator and schemathesis (which brings jsonschema), and
# Selenium for the browser tests (the console; the event stream's EventSource), and websockets
# as an independent WebSocket client for the Realtime tests.
venv=.build/test-venv
if ! "$venv/bin/python" -c "import supabase, yaml, check_jsonschema, prometheus_client, openapi_spec_validator, schemathesis, jsonschema, selenium, websockets" 2>/dev/null \
  || [ "$("$venv/bin/schemathesis" --version 2>/dev/null)" != "schemathesis, version 4.32.5" ]; then
  # Debian's python3 with its site packages: aiosmtpd and PyJWT come from apt (deps.sh).
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "supabase==2.34.1" check-jsonschema pyyaml prometheus-client \
    "openapi-spec-validator==0.9.0" "schemathesis==4.32.5" "selenium==4.40.0" \
    "websockets==15.0.1"
fi
export TRUNK_SYNC_TEST_PYTHON="$PWD/$venv/bin/python"

work=$(mktemp -d "${TMPDIR:-/tmp}/trunk-sync-test.XXXXXX")
cleanup() {
  scripts/pg.sh stop "$work/pg" || true
  rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 scripts/server_port.py)
PG_FAST=1 scripts/pg.sh start "$work/pg" "$port"

export TRUNK_SYNC_TEST_DATABASE_URL
TRUNK_SYNC_TEST_DATABASE_URL=$(scripts/pg.sh url "$work/pg" postgres)
export TRUNK_SYNC_TEST_PGDIR="$work/pg"
export TRUNK_SYNC_BIN="$(swift build --show-bin-path)/trunk-sync"

# Bounded, so a hung test fails the run instead of eating CI's time. All tests are XCTest.
status=0
timeout --signal=INT --kill-after=30 1500 swift test --skip-build --disable-swift-testing "$@" 2>&1 \
  | tee "$work/test.log" || status=$?
# One closing line for readers of the log: test cases passed and failed in the whole run
# (XCTest's own totals count failed assertions, not failed tests).
passed=$(grep -cE "^Test Case '.*' passed \(" "$work/test.log" || true)
failed=$(grep -cE "^Test Case '.*' failed \(" "$work/test.log" || true)
if [ "$((passed + failed))" -gt 0 ]; then
  echo "$passed passed, $failed failed"
fi
exit "$status"
