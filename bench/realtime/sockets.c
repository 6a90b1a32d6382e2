// bench/realtime: opens COUNT Realtime sockets (GET /realtime/v1/websocket, vsn 2.0.0 as
// supabase-js) spread over USERS users, each joining one channel with a postgres_changes
// INSERT binding on public.events, waits, then pushes COMMITS events one at a time, each by
// one user, and measures, for every socket of that user, the time from sending the push to
// reading its postgres_changes message; and counts the changes that reach a socket of any
// other user (there must be none). The same harness as bench/stream/streams.c, in C for the
// same reason.
//
//     sockets HOST PORT COUNT USERS TOKENS_FILE COMMITS READY_FILE GO_FILE
//
// Socket i is user i % USERS's. A socket counts as open once its join is answered ok.
// Exits 1 when a socket closes, misses a change for 10 s, or reads a change that is not its
// user's, or not exactly once and in order.
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

#define TOKEN 4096
#define FRAME 4096

struct stream {
    int fd;
    int user;
    int upgraded;    // the 101 arrived
    int open;        // the join was answered ok
    long seen;       // the last seq of a change read (a user's seqs count 1, 2, …)
    long events;     // changes read
    long disorder;   // changes that did not follow the previous one by exactly 1
    size_t kept;     // bytes of an unfinished frame (or the 101's head)
    char buffer[FRAME];
};

// One complete text frame (a Phoenix message as a JSON array).
static void message(struct stream *s, const char *text, size_t length) {
    char copy[FRAME + 1];
    memcpy(copy, text, length);
    copy[length] = 0;
    if (strstr(copy, "\"phx_reply\"") && strstr(copy, "\"status\":\"ok\"")) s->open = 1;
    const char *seq = strstr(copy, "\"postgres_changes\"") ? strstr(copy, "\"seq\":") : NULL;
    if (seq) {
        long value = strtol(seq + 6, NULL, 10);
        if (value != s->seen + 1) s->disorder++;
        s->seen = value;
        s->events++;
    }
}

// Reads what is there, frame by frame. Returns -1 when the socket closed (or sent a close
// frame, or a frame too large for the buffer).
static int drain(struct stream *s) {
    for (;;) {
        ssize_t count = recv(s->fd, s->buffer + s->kept, FRAME - s->kept, 0);
        if (count < 0 && errno == EINTR) continue;
        if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (count <= 0) return -1;
        s->kept += (size_t)count;
        size_t at = 0;
        if (!s->upgraded) {
            char *end = memmem(s->buffer, s->kept, "\r\n\r\n", 4);
            if (!end) continue;
            if (strncmp(s->buffer, "HTTP/1.1 101", 12) != 0) return -1;
            s->upgraded = 1;
            at = (size_t)(end - s->buffer) + 4;
        }
        for (;;) {
            if (s->kept - at < 2) break;
            unsigned char *frame = (unsigned char *)s->buffer + at;
            size_t header = 2, length = frame[1] & 0x7F;
            if (length == 126) {
                if (s->kept - at < 4) break;
                header = 4;
                length = (size_t)frame[2] << 8 | frame[3];
            } else if (length == 127) {
                return -1;
            }
            if (header + length > FRAME) return -1;
            if (s->kept - at < header + length) break;
            int opcode = frame[0] & 0x0F;
            if (opcode == 8) return -1;
            if (opcode == 1) message(s, (const char *)frame + header, length);
            at += header + length;
        }
        memmove(s->buffer, s->buffer + at, s->kept - at);
        s->kept -= at;
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
        fprintf(stderr, "usage: sockets HOST PORT COUNT USERS TOKENS_FILE COMMITS READY_FILE GO_FILE\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]), count = atoi(argv[3]), users = atoi(argv[4]), commits = atoi(argv[6]);
    const char *tokens_file = argv[5], *ready_file = argv[7], *go_file = argv[8];
    if (count < 1 || users < 1 || users > count || commits < 1) {
        fprintf(stderr, "sockets: need 1 <= USERS <= COUNT and COMMITS >= 1\n");
        return 2;
    }

    char (*tokens)[TOKEN] = calloc((size_t)users, TOKEN);
    FILE *tokens_in = fopen(tokens_file, "r");
    for (int u = 0; u < users; u++) {
        if (!tokens_in || !fgets(tokens[u], TOKEN, tokens_in)) {
            fprintf(stderr, "sockets: %s has fewer than %d tokens\n", tokens_file, users);
            return 2;
        }
        tokens[u][strcspn(tokens[u], "\r\n")] = 0;
    }
    fclose(tokens_in);

    char request[TOKEN + 1024];
    struct stream *streams = calloc((size_t)count, sizeof *streams);
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    double started = now_ms();
    for (int i = 0; i < count; i++) {
        streams[i].user = i % users;
        char join[TOKEN + 512];
        int join_length = snprintf(
            join, sizeof join,
            "[\"1\",\"1\",\"realtime:bench\",\"phx_join\",{\"config\":{\"broadcast\":{\"ack\":false,\"self\":false},"
            "\"presence\":{\"key\":\"\",\"enabled\":false},\"postgres_changes\":[{\"event\":\"INSERT\",\"schema\":\"public\","
            "\"table\":\"events\"}],\"private\":false},\"access_token\":\"%s\"}]",
            tokens[streams[i].user]);
        // The handshake, then the join as a masked text frame (a zero key: the payload as is).
        int request_length = snprintf(
            request, sizeof request,
            "GET /realtime/v1/websocket?apikey=bench&vsn=2.0.0 HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            "\x81\xFE%c%c%c%c%c%c",
            host, port, (join_length >> 8) & 0xFF, join_length & 0xFF, 0, 0, 0, 0);
        memcpy(request + request_length, join, (size_t)join_length);
        request_length += join_length;
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
            fprintf(stderr, "only %d of %d sockets joined\n", open, count);
            return 1;
        }
        for (int e = 0; e < ready; e++) {
            struct stream *s = &streams[events[e].data.u32];
            int was = s->open;
            if (drain(s) < 0) {
                fprintf(stderr, "a socket closed while joining (a limit too low?)\n");
                return 1;
            }
            if (!was && s->open) open++;
        }
    }
    fprintf(stderr, "%d sockets of %d users joined in %.1f s\n", count, users, (now_ms() - started) / 1e3);
    FILE *ready_out = fopen(ready_file, "w");
    fprintf(ready_out, "%d\n", count);
    fclose(ready_out);
    struct stat info;
    long foreign = 0;
    while (stat(go_file, &info) != 0) {
        // Nothing should arrive meanwhile; read it if it does.
        if (read_for(epoll, streams, 100, -1, &foreign) < 0) {
            fprintf(stderr, "a socket closed while idle\n");
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
