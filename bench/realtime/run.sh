#!/usr/bin/env bash
# bench/realtime: 10,000 Realtime sockets (GET /realtime/v1/websocket, vsn 2.0.0, one
# postgres_changes channel each) of 1,000 users, 50 commits by 50 users: the server's memory
# and the time from a commit to the change on every socket of that user. The harness of
# bench/stream (same environment: BENCH_STREAMS, BENCH_USERS, BENCH_COMMITS, BENCH_PERF) with
# the client bench/realtime/sockets.c. See bench/README.md.
exec env BENCH_TARGET=realtime "$(dirname "$0")/../stream/run.sh" "$@"
