#!/usr/bin/env bash
# `make fuzz` / `make fuzz-json`: builds a libFuzzer target with AddressSanitizer and runs
# it — HTTPRequestParser (Fuzz/HTTPParserFuzz), WebSocketFrameParser (Fuzz/WebSocketParserFuzz)
# or the JSON module's parser (Fuzz/JSONParserFuzz). Not part of `make test` or of Package.swift's build.
#
#   scripts/fuzz.sh [http|ws|json] [libFuzzer options…]   e.g. scripts/fuzz.sh json -runs=100000
#   scripts/fuzz.sh [http|ws|json] FILE…                  replays saved inputs (crash-…, Fuzz/corpus/…)
#
# Environment: FUZZ_RUNS (default 1000000), FUZZ_MAX_LEN (default 8192), FUZZ_TIMEOUT
# (seconds per input, default 10), FUZZ_RSS_MB (default 2048), FUZZ_JOBS (parallel
# workers, default 1).
#
# Swift 6.3's `-sanitize=fuzzer` links the toolchain's own libclang_rt.fuzzer, so no extra
# package is needed. libFuzzer reads both corpus directories and writes new inputs to the
# first, .build-fuzz/corpus; Fuzz/corpus (hand-written requests and every input that once
# crashed) is the committed seed and stays untouched;
# crashes, leaks and timeouts are written to .build-fuzz/artifacts/. The JSON target uses
# .build-fuzz/json-corpus, Fuzz/json-corpus and Fuzz/json.dict the same way; the WebSocket
# target .build-fuzz/ws-corpus and Fuzz/ws-corpus (no dictionary).
set -euo pipefail
cd "$(dirname "$0")/.."

target=http
case "${1:-}" in
  http|ws|json) target=$1; shift ;;
esac

out=.build-fuzz
if [ "$target" = json ]; then
  sources=(Sources/JSON/*.swift Fuzz/JSONParserFuzz/main.swift)
  module=JSONParserFuzz
  binary="$out/json-parser-fuzz"
  corpus=("$out/json-corpus" Fuzz/json-corpus)
  dict=Fuzz/json.dict
  max_len=${FUZZ_MAX_LEN:-4096}
elif [ "$target" = ws ]; then
  sources=(Sources/HTTPServer/WebSocket/WebSocketFrameParser.swift Fuzz/WebSocketParserFuzz/main.swift)
  module=WebSocketParserFuzz
  binary="$out/ws-parser-fuzz"
  corpus=("$out/ws-corpus" Fuzz/ws-corpus)
  dict=
  max_len=${FUZZ_MAX_LEN:-4096}
else
  sources=(
    Sources/HTTPServer/HTTPRequestParser.swift
    Sources/HTTPServer/HTTPRequestHead.swift
    Sources/HTTPServer/HTTPParserLimits.swift
    Fuzz/HTTPParserFuzz/main.swift
  )
  module=HTTPParserFuzz
  binary="$out/http-parser-fuzz"
  corpus=("$out/corpus" Fuzz/corpus)
  dict=Fuzz/http.dict
  max_len=${FUZZ_MAX_LEN:-8192}
fi
mkdir -p "${corpus[0]}" "$out/artifacts"
# Rebuild only when a source is newer than the binary.
if [ ! -x "$binary" ] || [ -n "$(find "${sources[@]}" "$0" -newer "$binary" 2>/dev/null)" ]; then
  echo "building $binary" >&2
  # -O keeps Swift's bounds and overflow checks (only -Ounchecked drops them) and makes
  # each input ~10x cheaper than -Onone. lld avoids gold's warnings about ASan symbols.
  swiftc -sanitize=fuzzer,address -parse-as-library -O -g -use-ld=lld \
    -module-name "$module" -o "$binary" "${sources[@]}"
fi

# Swift's crash backtracer would wait on every trap; libFuzzer and ASan report instead.
export SWIFT_BACKTRACE=enable=no
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}

# Replaying saved inputs: scripts/fuzz.sh FILE…
if [ $# -gt 0 ] && [ -f "$1" ]; then
  exec "$binary" "$@"
fi

jobs=${FUZZ_JOBS:-1}
parallel=()
[ "$jobs" -gt 1 ] && parallel=(-fork="$jobs")

started=$(date +%s)
status=0
"$binary" \
  -runs="${FUZZ_RUNS:-1000000}" \
  -max_len="$max_len" \
  -timeout="${FUZZ_TIMEOUT:-10}" \
  -rss_limit_mb="${FUZZ_RSS_MB:-2048}" \
  ${dict:+-dict="$dict"} \
  -artifact_prefix="$out/artifacts/" \
  -print_final_stats=1 \
  "${parallel[@]}" "$@" \
  "${corpus[@]}" || status=$?
echo "fuzz: exit $status after $(( $(date +%s) - started )) s; artifacts in $out/artifacts/" >&2
exit "$status"
