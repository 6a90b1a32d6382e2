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

// Reads every stream that has data for up to `ms` milliseconds; counts the events read by
// streams of any user but `user` into *foreign. Returns -1 when a stream ended.
static int read_for(int epoll, struct stream *streams, double ms, int user, long *foreign) {
    struct epoll_event events[1024];
    double until = now_ms() + ms;
    for (double left = ms; left > 0; left = until - now_ms()) {
        int ready = epoll_wait(epoll, events, 1024, (int)left + 1);
        for (int e = 0; e < ready; e++) {
            struct stream *s = &streams[events[e].data.u32];
            long before = s->events;
            if (drain(s) < 0) return -1;
            if (s->user != user) *foreign += s->events - before;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: streams HOST PORT COUNT USERS TOKENS_FILE COMMITS READY_FILE GO_FILE\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]), count = atoi(argv[3]), users = atoi(argv[4]), commits = atoi(argv[6]);
    const char *tokens_file = argv[5], *ready_file = argv[7], *go_file = argv[8];
    if (count < 1 || users < 1 || users > count || commits < 1) {
        fprintf(stderr, "streams: need 1 <= USERS <= COUNT and COMMITS >= 1\n");
        return 2;
    }

    char (*tokens)[TOKEN] = calloc((size_t)users, TOKEN);
    FILE *tokens_in = fopen(tokens_file, "r");
    for (int u = 0; u < users; u++) {
        if (!tokens_in || !fgets(tokens[u], TOKEN, tokens_in)) {
            fprintf(stderr, "streams: %s has fewer than %d tokens\n", tokens_file, users);
            return 2;
        }
        tokens[u][strcspn(tokens[u], "\r\n")] = 0;
    }
    fclose(tokens_in);

    char request[TOKEN + 512];
    struct stream *streams = calloc((size_t)count, sizeof *streams);
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    double started = now_ms();
    for (int i = 0; i < count; i++) {
        streams[i].user = i % users;
        int request_length = snprintf(
            request, sizeof request,
            "GET /sync/v1/stream HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n",
            host, port, tokens[streams[i].user]);
        streams[i].fd = connect_from(host, port, i);
        if (streams[i].fd < 0 || send_all(streams[i].fd, request, (size_t)request_length) != 0) {
            fprintf(stderr, "stream %d: cannot connect or send: %s\n", i, strerror(errno));
            return 1;
        }
        fcntl(streams[i].fd, F_SETFL, O_NONBLOCK);
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(epoll, EPOLL_CTL_ADD, streams[i].fd, &event);
    }
    struct epoll_event events[1024];
    int open = 0;
    while (open < count) {
        int ready = epoll_wait(epoll, events, 1024, 10000);
        if (ready <= 0) {
            fprintf(stderr, "only %d of %d streams opened\n", open, count);
            return 1;
        }
        for (int e = 0; e < ready; e++) {
            struct stream *s = &streams[events[e].data.u32];
            int was = s->open;
            if (drain(s) < 0) {
                fprintf(stderr, "a stream ended while opening (a limit too low?)\n");
                return 1;
            }
            if (!was && s->open) open++;
        }
    }
    fprintf(stderr, "%d streams of %d users open in %.1f s\n", count, users, (now_ms() - started) / 1e3);
    FILE *ready_out = fopen(ready_file, "w");
    fprintf(ready_out, "%d\n", count);
    fclose(ready_out);
    struct stat info;
    long foreign = 0;
    while (stat(go_file, &info) != 0) {
        // Heartbeats keep arriving meanwhile: read them so no buffer fills.
        if (read_for(epoll, streams, 100, -1, &foreign) < 0) {
            fprintf(stderr, "a stream ended while idle\n");
            return 1;
        }
    }
    if (foreign != 0) {
        fprintf(stderr, "%ld events arrived before the first commit\n", foreign);
        return 1;
    }

    long *pushed = calloc((size_t)users, sizeof *pushed);  // each user's events so far
    size_t most = (size_t)commits * (size_t)(count / users + 1);
    double *latencies = malloc(sizeof(double) * most);
    size_t measured = 0;
    double worst_round = 0;
    for (int round = 1; round <= commits; round++) {
        // Spread evenly over the users: with COMMITS <= USERS, each commit is another user's.
        int user = (int)((long)(round - 1) * users / commits % users);
        if (commits > users) user = (round - 1) % users;
        char body[512], push[TOKEN + 1024];
        int body_length = snprintf(
            body, sizeof body,
            "{\"events\":[{\"client_id\":\"00000000-0000-4000-8000-%012d\",\"type\":\"bench\","
            "\"payload\":{\"round\":%d},\"client_timestamp\":\"2026-11-23T00:00:00.000Z\"}]}",
            round, round);
        int push_length = snprintf(
            push, sizeof push,
            "POST /sync/v1/events HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
            host, port, tokens[user], body_length, body);
        long seq = ++pushed[user];
        int pusher = connect_from(host, port, count);
        double sent = now_ms();
        if (pusher < 0 || send_all(pusher, push, (size_t)push_length) != 0) {
            fprintf(stderr, "push %d failed\n", round);
            return 1;
        }
        int waiting = 0;
        for (int i = 0; i < count; i++) waiting += streams[i].user == user;
        while (waiting > 0) {
            int ready = epoll_wait(epoll, events, 1024, 10000);
            if (ready <= 0) {
                fprintf(stderr, "round %d: %d streams of user %d did not get the event within 10 s (%ld events read by other users' streams)\n",
                        round, waiting, user, foreign);
                return 1;
            }
            double at = now_ms();
            for (int e = 0; e < ready; e++) {
                struct stream *s = &streams[events[e].data.u32];
                long before_seen = s->seen, before_events = s->events;
                if (drain(s) < 0) {
                    fprintf(stderr, "round %d: a stream ended\n", round);
                    return 1;
                }
                if (s->user != user) {
                    foreign += s->events - before_events;
                } else if (before_seen < seq && s->seen >= seq) {
                    latencies[measured++] = at - sent;
                    waiting--;
                }
            }
        }
        double round_time = now_ms() - sent;
        if (round_time > worst_round) worst_round = round_time;
        long answered = answered_seq(pusher);
        close(pusher);
        if (answered != seq) {
            fprintf(stderr, "push %d was not answered 200 with seq %ld (got %ld)\n", round, seq, answered);
            return 1;
        }
        // Commits apart, each measured on its own; meanwhile any stray event is counted.
        if (read_for(epoll, streams, 200, user, &foreign) < 0) {
            fprintf(stderr, "round %d: a stream ended\n", round);
            return 1;
        }
    }

    long wrong = 0, disorder = 0;  // streams whose events are not exactly their user's
    for (int i = 0; i < count; i++) {
        wrong += streams[i].events != pushed[streams[i].user] || streams[i].seen != pushed[streams[i].user];
        disorder += streams[i].disorder;
    }
    int touched = 0;
    for (int u = 0; u < users; u++) touched += pushed[u] > 0;
    qsort(latencies, measured, sizeof(double), compare);
    printf(
        "latency_ms p50=%.1f p90=%.1f p99=%.1f max=%.1f samples=%zu slowest_round_ms=%.1f\n"
        "isolation users_pushed=%d other_users_events=%ld streams_wrong=%ld out_of_order=%ld\n",
        latencies[measured / 2], latencies[measured * 9 / 10], latencies[measured * 99 / 100], latencies[measured - 1],
        measured, worst_round, touched, foreign, wrong, disorder);
    if (foreign != 0 || wrong != 0 || disorder != 0) {
        fprintf(stderr, "isolation failed: an event reached a stream it does not belong to, or not exactly once\n");
        return 1;
    }
    return 0;
}
