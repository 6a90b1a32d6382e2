// bench/stream: opens COUNT event streams spread over USERS users, waits, then pushes COMMITS
// events one at a time, each by one user, and measures, for every stream of that user, the
// time from sending the push to reading the event on that stream; and counts the events that
// reach a stream of any other user (there must be none). In C so that reading 10,000 sockets
// costs the measurement next to nothing (a Python loop over them would add tens of
// milliseconds to every figure).
//
//     streams HOST PORT COUNT USERS TOKENS_FILE COMMITS READY_FILE GO_FILE
//
// TOKENS_FILE holds USERS access tokens, one a line, each of a different user. Stream i is
// user i % USERS's, so every user has COUNT / USERS streams (one more for the first
// COUNT % USERS users). Connects from loopback addresses 127.0.0.2… (COUNT / 50 per address,
// under the server's per-client connection cap), sends `GET /sync/v1/stream` with
// `Accept: text/event-stream` on each and waits for each stream's `retry:`. Then writes COUNT
// to READY_FILE (the caller measures the server's memory) and waits until GO_FILE exists.
// Then, COMMITS times: pick a user (spread evenly over the users, the same user again only
// when COMMITS > USERS), push one event as that user (`POST /sync/v1/events`), wait until
// every stream of that user has read `id: <seq>` with the seq the push answered, and record
// each stream's latency. Between commits the streams are read for 200 ms more, so an event
// delivered late, twice, or to the wrong user is seen. At the end every stream must have read
// exactly its user's events.
//
// Prints the latencies' percentiles over all (commit, stream) pairs and the isolation check;
// exits 1 when a stream ends, fails, misses an event for 10 s, or reads an event that is not
// its user's.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/client.h"

#define LINE 64
#define TOKEN 4096

struct stream {
    int fd;
    int user;
    int open;        // the `retry:` arrived
    long seen;       // the last `id:` read (a user's seqs count 1, 2, … from its first event)
    long events;     // `id:` lines read
    long disorder;   // `id:` lines that did not follow the previous one by exactly 1
    size_t kept;     // bytes of an unfinished line kept from the previous read
    int skipping;    // the unfinished line is longer than LINE (a `data:` line): not kept
    char line[LINE];
};

// One complete line of the response (chunk-size lines and `data:` lines are not ours).
static void line(struct stream *s, const char *text, size_t length) {
    if (length >= 6 && memcmp(text, "retry:", 6) == 0) s->open = 1;
    if (length > 4 && memcmp(text, "id: ", 4) == 0) {
        long seq = strtol(text + 4, NULL, 10);
        if (seq != s->seen + 1) s->disorder++;
        s->seen = seq;
        s->events++;
    }
}

// Reads what is there, line by line. Returns -1 when the stream ended.
static int drain(struct stream *s) {
    char buffer[65536];
    for (;;) {
        ssize_t count = recv(s->fd, buffer, sizeof buffer, 0);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (count <= 0) return -1;
        const char *at = buffer, *end = buffer + count;
        while (at < end) {
            const char *newline = memchr(at, '\n', (size_t)(end - at));
            size_t piece = (size_t)((newline ? newline : end) - at);
            if (!s->skipping && s->kept + piece < LINE) {
                memcpy(s->line + s->kept, at, piece);
                s->kept += piece;
            } else {
                s->skipping = 1;
            }
            if (!newline) break;
            if (!s->skipping) line(s, s->line, s->kept);
            s->kept = 0;
            s->skipping = 0;
            at = newline + 1;
        }
    }
}

// The request that opens one stream of the user whose token is `token`.
static int open_request(char *out, size_t size, const char *host, int port, const char *token) {
    return snprintf(
        out, size,
        "GET /sync/v1/stream HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n",
        host, port, token);
}

#define CLIENT "streams"
#define KIND "streams"
#include "../common/main.h"
