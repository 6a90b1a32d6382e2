# The two commands of the README: `make run` and `make test`.
.PHONY: run test config-generate build release format lint clean fuzz fuzz-ws fuzz-json fuzz-api bench drill drill-failover

run:
	scripts/run.sh

test:
	scripts/test.sh

build:
	swift build

# Regenerates config/defaults.json and the settings table of config/README.md from Setting.swift.
config-generate:
	scripts/config-generate.sh

release:
	swift build -c release

format:
	swift format --in-place --recursive Sources Tests Package.swift

lint:
	swift format lint --strict --recursive Sources Tests Package.swift

clean:
	scripts/pg.sh stop .data/postgres || true
	rm -rf .build

# Not part of `make test`: see docs/development.md ("Fuzzing", "Benchmarks").
fuzz:
	scripts/fuzz.sh http
	scripts/fuzz.sh ws

fuzz-ws:
	scripts/fuzz.sh ws

fuzz-json:
	scripts/fuzz.sh json

fuzz-api:
	scripts/fuzz-api.sh

bench:
	bench/http/run.sh

# The point-in-time restore drill (docs/operations.md, "Back up and restore"): base backup,
# pushes, T, more pushes, delete from events, restore to T into a fresh cluster.
drill:
	scripts/drill-restore.sh

# The failover drill (docs/operations.md, "Fail over"): primary + synchronous standby,
# continuous pushes, the primary killed, the standby promoted. Not part of `make test`.
drill-failover:
	scripts/deps.sh
	swift build --product trunk-sync
	python3 scripts/drill-failover.py "$$(swift build --show-bin-path)/trunk-sync"
