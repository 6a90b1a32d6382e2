#!/usr/bin/env bash
# `make fuzz-api`: schemathesis against the real binary as `make test` runs it
# (OpenAPITests, Tests/OpenAPI/schemathesis.toml), but with a random seed and more examples
# per operation, so each run tries inputs the fixed-seed run never does. Not part of
# `make test`. It prints the seed first and last: replay a finding with the same seed.
#
#   make fuzz-api                                  # a random seed, 500 examples per operation
#   FUZZ_SEED=123456 make fuzz-api                 # replays the run of seed 123456
#   FUZZ_EXAMPLES=2000 make fuzz-api               # longer
set -euo pipefail
cd "$(dirname "$0")/.."

seed=${FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
examples=${FUZZ_EXAMPLES:-500}
echo "schemathesis seed $seed, $examples examples per operation (replay: FUZZ_SEED=$seed make fuzz-api)"
status=0
TRUNK_SYNC_FUZZ_API_SEED=$seed TRUNK_SYNC_FUZZ_API_EXAMPLES=$examples \
  scripts/test.sh --filter 'OpenAPITests.testSchemathesisFindsNoAnswerTheDescriptionDoesNotAllow' || status=$?
echo "schemathesis seed $seed: $([ "$status" = 0 ] && echo "no finding" || echo "FAILED, replay with FUZZ_SEED=$seed make fuzz-api")"
exit "$status"
