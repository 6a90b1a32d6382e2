# The two commands of the README: `make run` and `make test`.
.PHONY: run test build release format lint clean fuzz fuzz-ws fuzz-json fuzz-api bench

run:
	scripts/run.sh

test:
	scripts/test.sh

build:
	swift build

release:
	swift build -c release

format:
	swift format --in-place --recursive Sources Tests Package.swift

lint:
	swift format lint --strict --recursive Sources Tests Package.swift

clean:
	scripts/pg.sh stop .data/postgres || true
	rm -rf .build

# Not part of `make test`: see README ("Fuzzing", "Benchmarks").
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
